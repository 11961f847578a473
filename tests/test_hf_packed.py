"""leanbatch.hf on packed and padding-free batches: real ``Trainer.train`` runs on a tiny Llama.

``DataCollatorWithFlattening`` packs the samples the InfoBatch sampler served into one row, told
apart by position ids; the run must train what the same data trains padded: the same plans,
order, weights, and (to float precision) scores, losses and parameters. Packed batches that cannot
be read are refused at the first batch, before anything is stored.
"""

from __future__ import annotations

import pytest
import torch
from hf_setup import PadCollator, Recorder, instruction_data, params, tiny_model, token_sums, training_args
from transformers import DataCollatorWithFlattening

from leanbatch import InfoBatch, SelectiveBackprop
from leanbatch.hf import LeanBatchTrainer

N, EPOCHS = 14, 3


def data() -> list[dict]:
    """Prompts labelled -100, one response empty (example 1), one example empty (no token at all)."""
    examples = instruction_data(N)
    examples[6] = {"input_ids": [], "labels": [], "text": "empty"}
    return examples


def run(tmp_path, name: str, collator, **kw) -> Recorder:
    ds = InfoBatch(data(), EPOCHS, prune_ratio=0.5, delta=0.67, seed=1, shard=False)
    trainer = Recorder(
        model=tiny_model(),
        args=training_args(
            str(tmp_path / name), num_train_epochs=EPOCHS, gradient_accumulation_steps=2, **kw
        ),
        train_dataset=ds,
        data_collator=collator,
    )
    trainer.train()
    return trainer


def test_packed_infobatch_trains_the_plans_scores_and_weights_of_padded_batches(tmp_path):
    padded = run(tmp_path, "padded", PadCollator())
    # use_cache=True: the model's cache would hide the packed sequences from its attention; not in training
    packed = run(
        tmp_path, "packed", DataCollatorWithFlattening(return_flash_attn_kwargs=True), use_cache=True
    )
    pds, kds = padded.infobatch, packed.infobatch
    assert [s["pruning"] for s in kds.epoch_stats] == [False, True, False] and kds.epoch_stats[1][
        "pruned"
    ] > 0
    assert packed.plans == padded.plans  # kept samples and weights of every epoch
    for a, b in zip(kds.epoch_stats, pds.epoch_stats, strict=True):  # the threshold to float precision
        assert {**a, "threshold": None} == {**b, "threshold": None}
        assert a["threshold"] == (None if b["threshold"] is None else pytest.approx(b["threshold"], rel=1e-6))
    assert [m["indices"] for m in packed.micro] == [m["indices"] for m in padded.micro]
    assert [m["weights"] for m in packed.micro] == [m["weights"] for m in padded.micro]
    assert {w for m in packed.micro for w in m["weights"]} == {1.0, 2.0}
    assert [m["num_items"] for m in packed.micro] == [m["num_items"] for m in padded.micro]
    scores = kds.scores.values
    assert (
        scores[1].isnan() and scores[6].isnan() and scores.isnan().sum() == 2
    )  # no labelled token: unscored
    torch.testing.assert_close(scores, pds.scores.values, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(
        [m["loss"] for m in packed.micro], [m["loss"] for m in padded.micro], rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(params(packed.model), params(padded.model), rtol=0, atol=1e-4)  # Adam


class Unmarked:
    """Packs with DataCollatorWithFlattening, then breaks what tells the sequences apart."""

    def __init__(self, how: str):
        self.how, self.inner = how, DataCollatorWithFlattening()

    def __call__(self, features):
        batch = self.inner(features)
        pos = batch.pop("position_ids")
        if self.how == "running":  # one position run over the row: no sequence restarts
            batch["position_ids"] = torch.arange(pos.shape[1])[None]
        elif self.how == "extra":  # a restart inside a sequence, at a labelled token
            at = int(torch.nonzero(batch["labels"][0] != -100)[1])
            end = at + int(torch.nonzero(pos[0, at:] == 0)[0])  # where the next sequence starts
            batch["position_ids"] = pos.clone()
            batch["position_ids"][0, at:end] = torch.arange(end - at)
        return batch


@pytest.mark.parametrize(
    "how, match",
    [
        ("none", r"packed 4 samples into 1 row\(s\) without position_ids or cu_seq_lens_q"),
        ("running", r"position_ids: the batch packs 4 sequence\(s\) from its 4 samples"),
        ("extra", r"a packed sequence starts with a label"),
    ],
)
def test_a_packed_batch_its_sequences_cannot_be_told_apart_in_is_refused_at_the_first_batch(
    tmp_path, how, match
):
    trainer = LeanBatchTrainer(
        model=tiny_model(),
        args=training_args(str(tmp_path), num_train_epochs=2),
        train_dataset=InfoBatch(instruction_data(8), 2, shard=False),
        data_collator=Unmarked(how),
    )
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert trainer.state.global_step == 0 and trainer.infobatch.scores.values.isnan().all()


def test_selective_backprop_on_packed_rows_is_refused(tmp_path):
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0)
    trainer = LeanBatchTrainer(
        model=tiny_model(),
        args=training_args(str(tmp_path), num_train_epochs=2),
        train_dataset=instruction_data(8),
        data_collator=DataCollatorWithFlattening(),
        selective_backprop=sb,
    )
    with pytest.raises(ValueError, match="a packed row cannot skip the backward of one of its sequences"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_collators_shift_labels_are_the_labels_the_loss_reads(tmp_path):
    """``shift_labels`` (labels shifted by the collator, as context parallelism makes them) decide the
    scores and the token count, not ``labels``, which here label every token, prompt included."""

    def shifted(features):
        batch = PadCollator()(features)
        batch["shift_labels"] = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
        batch["labels"] = batch["input_ids"].clone()
        return batch

    examples = instruction_data(8)
    trainer = Recorder(
        model=tiny_model(),
        args=training_args(str(tmp_path), num_train_epochs=1, learning_rate=0.0),
        train_dataset=InfoBatch(examples, 1, shard=False),
        data_collator=shifted,
    )
    trainer.train()
    by_hand = [token_sums(trainer.model, ex) for ex in examples]
    expected = torch.tensor([s / c if c else float("nan") for s, c in by_hand])
    torch.testing.assert_close(
        trainer.infobatch.scores.values, expected, rtol=1e-5, atol=1e-6, equal_nan=True
    )
    assert [m["num_items"] for m in trainer.micro] == [
        sum(by_hand[i][1] for i in m["indices"]) for m in trainer.micro
    ]
