"""TRL's ``SFTTrainer`` with leanbatch: real runs on a tiny Llama and a tiny in-memory dataset.

``leanbatch_trainer(SFTTrainer)(..., infobatch={...})`` wraps the dataset TRL prepared. Padded,
padding-free (``padding_free=True``: the collator packs the served samples into one row) and BFD
packed (``packing=True``: TRL packs the dataset's rows before training, so each packed row is a
sample) runs train; with every weight 1 the run is TRL's own ``compute_loss_func`` path with the
model's loss; Selective Backprop trains padded batches and is refused on packed rows; a run resumed
mid-epoch is the uninterrupted one. Token selection trains in ``SFTTrainer`` through
``class SFTTokens(TokenSelectionTrainer, SFTTrainer)``: exactly the kept tokens' loss, as computed by
hand, and with ``keep=1`` TRL's own loss. Nothing is downloaded: the tokenizer is a word-level vocabulary.
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

from leanbatch import Plan, SelectiveBackprop, TokenSelection
from leanbatch.hf import INDEX_KEY, TokenSelectionTrainer, leanbatch_trainer

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
    batches, gradient accumulation), its default (a fused LM head, whose chunked loss and backward
    round otherwise: 3e-4 of the largest gradient seen with trl 1.16.0 on 2026-12-07, 1e-4 before) and its ``compute_loss_func`` path with the model's own loss."""

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
    fused = path == "fused_lm_head"  # its chunked loss and backward round otherwise
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5 if fused else 1e-6, atol=1e-7)
    tol = 1e-3 if fused else 1e-6  # of the largest gradient
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


class SFTTokens(TokenSelectionTrainer, SFTTrainer):
    """Token selection in TRL: ``TokenSelectionTrainer`` first, so its ``compute_loss`` wraps TRL's."""


class RecordingSelection(TokenSelection):
    """Records the (shifted) targets and the kept mask of every batch it selects."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.masks: list[tuple[torch.Tensor, torch.Tensor]] = []

    def kept(self, token_loss, targets, **kw):
        mask = super().kept(token_loss, targets, **kw)
        self.masks.append((targets.clone(), mask.clone()))
        return mask


class RecordingReference(torch.nn.Module):
    """A reference Llama that records the logits of each forward."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.logits = model, []

    def forward(self, **inputs):
        out = self.model(**inputs)
        self.logits.append(out.logits.detach().clone())
        return out


class TokenSpy(SFTTokens):
    """Records each micro-batch's logits, labels, ``num_items_in_batch`` and selected loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _selected_loss(self, outputs, labels, num_items_in_batch=None):
        loss = super()._selected_loss(outputs, labels, num_items_in_batch)
        self.seen.append(
            (
                outputs.logits.detach().clone(),
                labels.clone(),
                torch.as_tensor(num_items_in_batch),
                loss.detach(),
            )
        )
        return loss


def kept_by_hand(logits, ref_logits, labels, keep):
    """The kept tokens (a mask over the shifted targets) and their summed loss, ranked in Python."""
    targets = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    ce = lambda lg: torch.nn.functional.cross_entropy(lg.transpose(1, 2), targets, reduction="none")  # noqa: E731
    tok, excess = ce(logits), ce(logits) - ce(ref_logits)
    labelled = [
        (r, t) for r in range(targets.shape[0]) for t in range(targets.shape[1]) if targets[r, t] != -100
    ]
    k = max(1, int(keep * len(labelled))) if labelled else 0
    chosen = sorted(labelled, key=lambda p: -float(excess[p]))[:k]  # stable: ties keep the earlier token
    mask = torch.zeros_like(targets, dtype=torch.bool)
    for p in chosen:
        mask[p] = True
    return targets, mask, sum(float(tok[p]) for p in chosen)


@pytest.mark.parametrize("mode", ["padded", "padding_free", "bfd"])
def test_token_selection_in_sft_trainer_trains_exactly_the_kept_tokens_loss(tmp_path, mode):
    """Each micro-batch's loss is the summed loss of the top half of its labelled tokens by excess
    loss (ranked by hand from the model's and the reference's logits), over the kept tokens of its
    accumulation group; never a -100 token (prompt, padding, a packed sequence's first label)."""
    ts, reference = RecordingSelection(keep=0.5), RecordingReference(tiny_model(7))
    trainer = TokenSpy(model=tiny_model(0), args=config(tmp_path, mode, num_train_epochs=1, gradient_accumulation_steps=2),
                       train_dataset=dataset(), processing_class=tokenizer(), token_selection=ts,
                       reference_model=reference)  # fmt: skip
    trainer.train()
    micro = {"padded": 4, "padding_free": 4, "bfd": 2}[mode]  # BFD packs the 14 examples into at most 8 rows
    assert (
        len(trainer.seen) == len(ts.masks) == len(reference.logits) == micro == 2 * trainer.state.global_step
    )
    hand = [
        kept_by_hand(lg, ref, y, 0.5)
        for (lg, y, _, _), ref in zip(trainer.seen, reference.logits, strict=True)
    ]
    for (_, _, n, loss), (targets, mask, total), (t_ts, m_ts) in zip(
        trainer.seen, hand, ts.masks, strict=True
    ):
        assert torch.equal(t_ts, targets) and torch.equal(m_ts, mask)
        assert (targets[m_ts] != -100).all() and (targets == -100).any()
        torch.testing.assert_close(float(loss), total / float(n), rtol=1e-5, atol=1e-7)
    kept = [int(m.sum()) for _, m, _ in hand]
    groups = [[kept[i] + kept[i + 1]] * 2 for i in range(0, micro, 2)]  # two micro-batches a step
    assert [int(n) for _, _, n, _ in trainer.seen] == sum(groups, [])
    assert ts.counts["kept"] == sum(kept) < ts.counts["labelled"]


def test_token_selection_keeping_every_token_is_trls_own_loss(tmp_path, recwarn):
    """keep=1 in ``SFTTokens``: the losses and gradients of the stock ``SFTTrainer`` (its fused LM
    head, padding-free batches, gradient accumulation); no warning of a deprecated ``compute_loss_func``."""
    kw = dict(
        num_train_epochs=1, gradient_accumulation_steps=2, lr_scheduler_type="constant", max_grad_norm=0
    )
    traces, losses = [Trace(grads=True), Trace(grads=True)], []
    for trace, cls in zip(traces, (SFTTokens, SFTTrainer), strict=True):
        extra = {"token_selection": TokenSelection(keep=1.0)} if cls is SFTTokens else {}
        trainer = cls(model=tiny_model(), args=config(tmp_path / cls.__name__, "padding_free", **kw),
                      train_dataset=dataset(), processing_class=tokenizer(), callbacks=[trace], **extra)  # fmt: skip
        trainer.train()
        losses.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert not [w for w in recwarn if "compute_loss_func" in str(w.message)]
    assert len(traces[0].grads) == len(losses[0]) == 2
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    for g_sel, g_trl in zip(traces[0].grads, traces[1].grads, strict=True):
        torch.testing.assert_close(g_sel, g_trl, rtol=0, atol=1e-4 * float(g_trl.abs().max()))


@pytest.mark.parametrize(
    ("setting", "match"),
    [
        ({"loss_type": "dft"}, "args.loss_type='dft'"),
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1"),
    ],
)
def test_trl_losses_token_selection_would_replace_are_refused(tmp_path, setting, match):
    with pytest.raises(ValueError, match=match):
        SFTTokens(model=tiny_model(), args=config(tmp_path, "padded", **setting), train_dataset=dataset(),
                  processing_class=tokenizer(), token_selection=TokenSelection())  # fmt: skip


def test_token_selection_in_sft_trainer_resumed_mid_epoch_draws_and_trains_as_the_uninterrupted_run(tmp_path):
    """The twin (random draws) in padding-free ``SFTTokens``: resumed from a checkpoint inside the
    first epoch (a model of another seed, overwritten by the checkpoint), the same draws, counts and weights."""

    def run(out, model_seed: int, resume=None) -> SFTTokens:
        ts = TokenSelection(keep=0.5, policy="random", seed=5)
        args = config(out, "padding_free", num_train_epochs=2, save_strategy="steps", save_steps=2)
        trainer = SFTTokens(model=tiny_model(model_seed), args=args, train_dataset=dataset(),
                            processing_class=tokenizer(), token_selection=ts)  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(tmp_path / "a", 0)
    assert whole.state.global_step == 8  # 4 steps an epoch: checkpoint-2 is mid-epoch
    resumed = run(tmp_path / "b", 1, resume=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.token_selection.counts == whole.token_selection.counts
    assert resumed.token_selection.draws == whole.token_selection.draws == 8
    torch.testing.assert_close(params(resumed.model), params(whole.model), rtol=0, atol=0)
