"""TokenSelectionTrainer: token selection in a real Trainer.train with a tiny Llama built from a config."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_setup import PadCollator, Trainer, instruction_data, params, tiny_model, token_sums, training_args
from transformers import LlamaConfig, LlamaForCausalLM

from leanbatch import TokenSelection
from leanbatch.hf import TokenSelectionTrainer

DATA = [{k: f[k] for k in ("input_ids", "labels")} for f in instruction_data(16, seed=2)]


class Spy(TokenSelectionTrainer):
    """Records each micro-batch's ``num_items_in_batch`` and the tokens the selection kept of it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, int]] = []

    def _selected_loss(self, outputs: Any, labels: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        before = self.token_selection.counts["kept"]
        loss = super()._selected_loss(outputs, labels, num_items_in_batch)
        self.seen.append((int(num_items_in_batch), self.token_selection.counts["kept"] - before))
        return loss


class CountingReference(torch.nn.Module):
    """A reference Llama that counts its forwards."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, **inputs: Any) -> Any:
        self.calls += 1
        return self.model(**inputs)


def mean_loss(model: torch.nn.Module) -> float:
    sums = [token_sums(model, f) for f in DATA]
    return sum(s for s, _ in sums) / sum(n for _, n in sums)


def test_trainer_trains_the_kept_tokens_normalised_by_their_count(tmp_path):
    model, reference = tiny_model(0), CountingReference(tiny_model(7))
    ts = TokenSelection(keep=0.5)
    args = training_args(str(tmp_path), num_train_epochs=4, gradient_accumulation_steps=2)
    trainer = Spy(model=model, args=args, train_dataset=DATA, data_collator=PadCollator(), token_selection=ts,
                  reference_model=reference)  # fmt: skip
    before = mean_loss(model)
    trainer.train()
    assert mean_loss(model) < 0.8 * before
    micro = len(trainer.seen)
    assert micro == 4 * 4 and reference.calls == micro and trainer.state.global_step == 8
    for a, b in zip(trainer.seen[::2], trainer.seen[1::2], strict=True):  # an accumulation group: one count
        assert a[0] == b[0] == a[1] + b[1]  # num_items_in_batch counts the kept tokens of both micro-batches
    labelled = sum(int((torch.tensor(f["labels"][1:]) != -100).sum()) for f in DATA) * 4
    assert ts.counts["labelled"] == labelled and ts.counts["kept"] == sum(k for _, k in trainer.seen)


def test_the_twin_calls_no_reference_and_keeps_the_same_counts(tmp_path):
    reference = CountingReference(tiny_model(7))
    ts = TokenSelection(keep=0.5, policy="random", seed=0)
    trainer = Spy(model=tiny_model(0), args=training_args(str(tmp_path), max_steps=4), train_dataset=DATA,
                  data_collator=PadCollator(), token_selection=ts, reference_model=reference)  # fmt: skip
    trainer.train()
    assert reference.calls == 0 and all(n == k for n, k in trainer.seen)


class ShiftCollator(PadCollator):
    """Adds labels already shifted (``shift_labels``), as padding-free collators do; they leave out each
    row's first two targets, so a loss that read ``labels`` instead would differ."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = super().__call__(features)
        shift = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:].clone()
        first = (shift != -100).long().cumsum(1) <= 2
        batch["shift_labels"] = shift.masked_fill(first, -100)
        return batch


@pytest.mark.parametrize("collator", [PadCollator, ShiftCollator])
def test_keep_one_is_the_stock_trainers_loss(tmp_path, collator):
    """Every labelled token kept: the same updates as the stock Trainer (its ForCausalLMLoss, num_items_in_batch),
    from labels or from pre-shifted shift_labels."""
    runs = []
    for cls in (Trainer, TokenSelectionTrainer):
        extra = {} if cls is Trainer else {"token_selection": TokenSelection(keep=1.0)}
        trainer = cls(model=tiny_model(0), args=training_args(str(tmp_path), max_steps=3, gradient_accumulation_steps=2),
                      train_dataset=DATA, data_collator=collator(), **extra)  # fmt: skip
        trainer.train()
        runs.append(params(trainer.model))
    assert torch.allclose(runs[0], runs[1], atol=1e-6)


def test_a_reference_of_another_vocabulary_is_refused_at_the_first_batch(tmp_path):
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = tiny_model(0)
    start = params(model)
    trainer = TokenSelectionTrainer(model=model, args=training_args(str(tmp_path), max_steps=2), train_dataset=DATA,
                                    data_collator=PadCollator(), token_selection=TokenSelection(),
                                    reference_model=LlamaForCausalLM(cfg))  # fmt: skip
    with pytest.raises(
        ValueError, match="reference_logits has a vocabulary of 97 but the model's logits have 96"
    ):
        trainer.train()
    assert torch.equal(params(model), start)  # nothing trained
    with pytest.raises(ValueError, match="compute_loss_func"):
        TokenSelectionTrainer(model=model, args=training_args(str(tmp_path)), train_dataset=DATA,
                              token_selection=TokenSelection(), compute_loss_func=lambda *a, **k: 0)  # fmt: skip
    with pytest.raises(TypeError, match="token_selection must be a leanbatch.TokenSelection"):
        TokenSelectionTrainer(
            model=model, args=training_args(str(tmp_path)), train_dataset=DATA, token_selection=0.5
        )


def test_a_resumed_run_draws_and_trains_as_the_uninterrupted_one(tmp_path):
    def run(out: str, steps: int, resume: str | None = None) -> TokenSelectionTrainer:
        ts = TokenSelection(keep=0.5, policy="random", seed=5)
        args = training_args(out, max_steps=steps, save_strategy="steps", save_steps=2)
        trainer = TokenSelectionTrainer(model=tiny_model(0), args=args, train_dataset=DATA,
                                        data_collator=PadCollator(), token_selection=ts)  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(str(tmp_path / "a"), 4)  # saves checkpoint-2 on its way
    resumed = run(str(tmp_path / "b"), 4, resume=str(tmp_path / "a" / "checkpoint-2"))
    assert (
        resumed.token_selection.counts == whole.token_selection.counts and resumed.token_selection.draws == 4
    )
    assert torch.allclose(params(resumed.model), params(whole.model), atol=1e-6)


def test_padding_free_batches_select_and_train_as_the_padded_ones(tmp_path):
    """``DataCollatorWithFlattening``'s rows (several sequences in one, told apart by their position ids):
    both models forwarded without a cache, so the reference's token losses, the kept tokens and the
    trained weights are the padded run's."""
    from transformers import DataCollatorWithFlattening

    def run(collator: Any, out: str) -> torch.Tensor:
        trainer = Spy(model=tiny_model(0), args=training_args(out, max_steps=3), train_dataset=DATA,
                      data_collator=collator, token_selection=TokenSelection(keep=0.5),
                      reference_model=tiny_model(7))  # fmt: skip
        trainer.train()
        assert all(k > 0 for _, k in trainer.seen)
        return params(trainer.model)

    padded = run(PadCollator(), str(tmp_path / "padded"))
    flat = run(DataCollatorWithFlattening(), str(tmp_path / "flat"))
    assert torch.allclose(flat, padded, atol=1e-4)  # with a cache: 1e-2 apart (checked)


def reference_of_length(positions: int) -> LlamaForCausalLM:
    """A reference of the model's vocabulary that takes sequences of up to ``positions`` tokens."""
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=positions)  # fmt: skip
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("packed", [False, True])
def test_a_reference_shorter_than_the_sequences_is_refused_at_the_first_batch(tmp_path, packed):
    """The sequences run to 15 tokens: a reference of 8 positions is refused, padded or packed, before
    anything is counted or trained; one of 16 positions trains on packed rows far wider than 16."""
    from transformers import DataCollatorWithFlattening

    def build(positions: int) -> TokenSelectionTrainer:
        collator = DataCollatorWithFlattening() if packed else PadCollator()
        return TokenSelectionTrainer(model=tiny_model(0), args=training_args(str(tmp_path), max_steps=2),
                                     train_dataset=DATA, data_collator=collator, token_selection=TokenSelection(),
                                     reference_model=reference_of_length(positions))  # fmt: skip

    assert max(len(f["input_ids"]) for f in DATA) == 15
    trainer = build(8)
    start = params(trainer.model)
    with pytest.raises(ValueError, match=r"reference_model takes sequences of up to 8 positions.*max_length"):
        trainer.train()
    assert torch.equal(params(trainer.model), start) and trainer.token_selection.counts["batches"] == 0
    trainer = build(16)
    trainer.train()
    assert trainer.state.global_step == 2


def test_packed_sequences_starting_with_a_label_are_refused_at_the_first_batch(tmp_path):
    """``DataCollatorWithFlattening(separator_id=7)`` labels each packed sequence's first token 7, so
    the shifted loss would train each sequence's last token to predict the next one's first."""
    from transformers import DataCollatorWithFlattening

    model, ts = tiny_model(0), TokenSelection(keep=0.5)
    start = params(model)
    trainer = TokenSelectionTrainer(model=model, args=training_args(str(tmp_path), max_steps=2), train_dataset=DATA,
                                    data_collator=DataCollatorWithFlattening(separator_id=7),
                                    token_selection=ts)  # fmt: skip
    with pytest.raises(ValueError, match="labels: a packed sequence starts with a label, not -100"):
        trainer.train()
    assert torch.equal(params(model), start) and ts.counts == {"batches": 0, "labelled": 0, "kept": 0}
