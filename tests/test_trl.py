"""TRL's ``SFTTrainer`` with leanbatch: real runs on a tiny Llama and a tiny in-memory dataset.

``leanbatch_trainer(SFTTrainer)(..., infobatch={...})`` wraps the dataset TRL prepared. Padded,
padding-free (``padding_free=True``: the collator packs the served samples into one row) and BFD
packed (``packing=True``: TRL packs the dataset's rows before training, so each packed row is a
sample) runs train; with every weight 1 the run is TRL's own ``compute_loss_func`` path with the
model's loss; Selective Backprop trains padded batches and is refused on packed rows; a run resumed
mid-epoch is the uninterrupted one. Nothing is downloaded: the tokenizer is a word-level vocabulary.
"""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset
from hf_setup import VOCAB, Trace, instruction_data, params, tiny_model, token_sums, training_args
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from leanbatch import Plan, SelectiveBackprop
from leanbatch.hf import INDEX_KEY, leanbatch_trainer

N = 14
LeanSFT = leanbatch_trainer(SFTTrainer)
MODES = {"padded": {}, "padding_free": {"padding_free": True}, "bfd": {"packing": True, "max_length": 32}}


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    words = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def dataset() -> Dataset:
    """Pre-tokenized prompts (labelled -100) and responses; example 1 has no labelled token."""
    return Dataset.from_list(
        [{"input_ids": d["input_ids"], "labels": d["labels"]} for d in instruction_data(N)]
    )


def config(out, mode: str, **kw) -> SFTConfig:
    base = dict(
        num_train_epochs=3,
        max_length=None,  # padding-free without packing needs it; padded runs then keep every example
        bf16=False,  # TRL's default is True: bf16 autocast, even on the CPU; these runs compare float32
    )
    return training_args(str(out), SFTConfig, **{**base, **MODES[mode], **kw})


class Recorder(LeanSFT):
    """Records each micro-batch's dataset indices and the plans it trained under."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order: list[int] = []
        self.plans: dict[int, tuple] = {}

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.order += inputs[INDEX_KEY].indices.tolist()
        plan = self.infobatch.sampler.plan()
        kept, w = plan.kept, plan.weights
        self.plans[plan.epoch] = (None if kept is None else kept.tolist(), None if w is None else w.tolist())
        return super().training_step(model, inputs, num_items_in_batch)


def train(out, mode: str, infobatch=None, model_seed: int = 0, resume=None, **kw) -> Recorder:
    trainer = Recorder(
        model=tiny_model(model_seed),
        args=config(out, mode, **kw),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        infobatch=infobatch or {"prune_ratio": 0.5, "delta": 0.67, "seed": 1},
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_padding_free_trains_the_plans_scores_and_weights_of_padded_batches(tmp_path):
    padded = train(tmp_path / "padded", "padded")
    free = train(tmp_path / "free", "padding_free", pad_to_multiple_of=16)  # trailing padding: position 0
    assert [s["pruning"] for s in free.infobatch.epoch_stats] == [False, True, False]
    assert free.infobatch.epoch_stats[1]["pruned"] > 0
    assert free.plans == padded.plans and free.order == padded.order
    scores = free.infobatch.scores.values
    assert scores[1].isnan() and scores.isnan().sum() == 1
    torch.testing.assert_close(scores, padded.infobatch.scores.values, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(params(free.model), params(padded.model), rtol=0, atol=1e-4)  # Adam


def test_bfd_packing_scores_each_packed_row_as_its_sequences_give_it_unpacked(tmp_path):
    """learning_rate=0: a packed row's score is the mean loss over the labelled tokens of all the
    sequences TRL packed into it, each computed on its own by hand."""
    trainer = train(tmp_path, "bfd", learning_rate=0.0)
    rows = trainer.infobatch.dataset
    assert len(rows) < N and any(len(r["seq_lengths"]) > 1 for r in rows)
    expected = []
    for r in rows:
        starts = torch.tensor([0, *r["seq_lengths"]]).cumsum(0).tolist()
        parts = [
            token_sums(trainer.model, {"input_ids": r["input_ids"][a:b], "labels": r["labels"][a:b]})
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
        expected.append(sum(s for s, _ in parts) / sum(c for _, c in parts))
    torch.testing.assert_close(trainer.infobatch.scores.values, torch.tensor(expected), rtol=1e-5, atol=1e-6)
    assert trainer.infobatch.epoch_stats[1]["pruned"] > 0 and {2.0} <= set(trainer.plans[1][1])


@pytest.mark.parametrize("path", ["fused_lm_head", "compute_loss_func"])
def test_weights_one_equal_trls_own_loss_path(tmp_path, path):
    """Every sample kept with weight 1: the losses and gradients of TRL's own loss (padding-free
    batches, gradient accumulation), its default (a fused LM head, whose chunked backward agrees to
    about 1e-4) and its ``compute_loss_func`` path with the model's own loss."""

    def keep_all_weight_one(scores, epoch, generator):
        return Plan(epoch, scores.numel(), None, torch.ones(scores.numel()), None, True)

    kw = dict(
        num_train_epochs=2, gradient_accumulation_steps=2, lr_scheduler_type="constant", max_grad_norm=0
    )
    lean_trace, stock_trace = Trace(grads=True), Trace(grads=True)
    lean = Recorder(
        model=tiny_model(),
        args=config(tmp_path / "lean", "padding_free", **kw),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        infobatch={"policy": keep_all_weight_one, "seed": 3},
        callbacks=[lean_trace],
    )
    lean.train()

    class FixedOrder(torch.utils.data.Sampler):
        def __iter__(self):
            self.epoch = getattr(self, "epoch", -1) + 1
            return iter(lean.order[self.epoch * N : (self.epoch + 1) * N])

        def __len__(self) -> int:
            return N

    class Stock(SFTTrainer):
        def _get_train_sampler(self, train_dataset=None):
            return FixedOrder()

    model = tiny_model()

    def model_loss(outputs, labels, num_items_in_batch=None):
        return model.loss_function(outputs.logits, labels, VOCAB, num_items_in_batch=num_items_in_batch)

    stock = Stock(
        model=model,
        args=config(tmp_path / "stock", "padding_free", **kw),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        compute_loss_func=model_loss if path == "compute_loss_func" else None,
        callbacks=[stock_trace],
    )
    stock.train()
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (lean, stock)]
    assert len(losses[0]) == 4
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    tol = 1e-4 if path == "fused_lm_head" else 1e-6  # of the largest gradient
    for g_lean, g_stock in zip(lean_trace.grads, stock_trace.grads, strict=True):
        torch.testing.assert_close(g_lean, g_stock, rtol=0, atol=tol * float(g_stock.abs().max()))
    torch.testing.assert_close(params(lean.model), params(stock.model), rtol=0, atol=10 * tol)


def test_selective_backprop_trains_padded_batches_and_is_refused_on_packed_rows(tmp_path):
    def build(mode):
        sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0)
        return LeanSFT(
            model=tiny_model(),
            args=config(tmp_path / mode, mode, num_train_epochs=1),
            train_dataset=dataset(),
            processing_class=tokenizer(),
            selective_backprop=sb,
        )

    trainer = build("padded")
    trainer.train()
    assert trainer.selective_backprop.stats.selected_batches == trainer.state.global_step > 0
    trainer = build("padding_free")
    with pytest.raises(ValueError, match="a packed row cannot skip the backward of one of its sequences"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_trls_dft_loss_is_refused_with_infobatch(tmp_path):
    with pytest.raises(ValueError, match="args.loss_type='dft'"):
        LeanSFT(
            model=tiny_model(),
            args=config(tmp_path, "padded", loss_type="dft"),
            train_dataset=dataset(),
            processing_class=tokenizer(),
            infobatch={"prune_ratio": 0.5},
        )


def test_a_mid_epoch_resume_trains_the_uninterrupted_runs_plans(tmp_path):
    kw = dict(save_strategy="steps", save_steps=1)
    full = train(tmp_path / "full", "padding_free", **kw)
    epochs = {h["step"]: h["epoch"] for h in full.state.log_history if "loss" in h}
    mid = [s for s, e in sorted(epochs.items()) if 1 < e < 2]  # inside the pruned epoch
    assert mid, epochs
    ckpt = os.path.join(tmp_path / "full", f"checkpoint-{mid[0]}")
    resumed = train(tmp_path / "resumed", "padding_free", model_seed=1, resume=ckpt, **kw)
    assert resumed.infobatch.epoch_stats == full.infobatch.epoch_stats
    assert resumed.plans == {e: p for e, p in full.plans.items() if e >= 1}
    assert resumed.order == full.order[len(full.order) - len(resumed.order) :]
    torch.testing.assert_close(
        resumed.infobatch.scores.values, full.infobatch.scores.values, rtol=0, atol=0, equal_nan=True
    )
    torch.testing.assert_close(params(resumed.model), params(full.model), rtol=0, atol=0)
