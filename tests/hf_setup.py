"""Shared set-up of the Hugging Face tests: a tiny Llama, a generated instruction set, a collator.

The instruction set has prompt tokens labelled -100 and two kinds of responses: *easy*
ones (the same short response for every prompt, learned in a few steps) and *hard* ones
(a random response per example, learned slowly by memorising), plus one example whose
response is empty (no labelled token). Sequences have different lengths, so batches are
padded (right, label -100). Nothing is downloaded.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from leanbatch.hf import INDEX_KEY, LeanBatchTrainer

VOCAB, PAD, BOS, EOS = 96, 0, 1, 2
EASY_RESPONSE = [5, 6, 7, 8]


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama of about 220k parameters, initialised from ``seed``."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(cfg)


def instruction_data(n: int, seed: int = 0, hard_every: int = 3) -> list[dict[str, Any]]:
    """``n`` examples; every ``hard_every``-th is hard, example 1 has no response (no labelled token)."""
    rng = random.Random(seed)
    data = []
    for i in range(n):
        prompt = [BOS] + [rng.randrange(10, VOCAB) for _ in range(rng.randint(3, 7))]
        if i == 1:
            response: list[int] = []
        elif i % hard_every == 0:
            response = [rng.randrange(10, VOCAB) for _ in range(rng.randint(3, 6))] + [EOS]
        else:
            response = EASY_RESPONSE + [EOS]
        data.append(
            {
                "input_ids": prompt + response,
                "labels": [-100] * len(prompt) + response,
                "text": f"example {i}",  # not a forward argument: remove_unused_columns drops it
            }
        )
    return data


class PadCollator:
    """Right-pads ``input_ids`` (PAD), ``attention_mask`` (0) and ``labels`` (-100); records the keys it saw."""

    def __init__(self) -> None:
        self.keys_seen: set[str] = set()

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        for f in features:
            self.keys_seen.update(f)
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        labels = torch.full((len(features), width), -100, dtype=torch.long)
        for r, f in enumerate(features):
            k = len(f["input_ids"])
            ids[r, :k] = torch.tensor(f["input_ids"])
            mask[r, :k] = 1
            labels[r, :k] = torch.tensor(f["labels"])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def training_args(out: str, cls: type = TrainingArguments, **kw: Any) -> Any:
    """CPU, no reporting, no progress bars, no checkpoints unless asked; ``kw`` overrides; ``cls``: the
    arguments' class (trl's ``SFTConfig``)."""
    base: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    base.update(kw)
    return cls(**base)


def token_sums(model: torch.nn.Module, example: dict[str, Any]) -> tuple[float, int]:
    """(sum of the token losses over labelled tokens, their count) of one unpadded example, by hand."""
    ids = torch.tensor(example["input_ids"])[None]
    labels = torch.tensor(example["labels"])[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    tok = torch.nn.functional.cross_entropy(
        logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="none"
    )
    return float(tok.sum()), int((labels[0, 1:] != -100).sum())


class Recorder(LeanBatchTrainer):
    """``LeanBatchTrainer`` that records every micro-batch it trains, then trains it unchanged."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.micro: list[dict[str, Any]] = []
        self.plans: dict[int, tuple[list[int] | None, list[float] | None]] = {}  # epoch -> kept, weights

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        rows = inputs[INDEX_KEY]
        kept = rows.indices if rows.positions is None else rows.indices[rows.positions.cpu()]
        plan = self.infobatch.sampler.plan()
        w = torch.ones(len(kept)) if plan.weights is None else plan.weights[kept]
        self.plans[plan.epoch] = (
            None if plan.kept is None else plan.kept.tolist(),
            None if plan.weights is None else plan.weights.tolist(),
        )
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.micro.append(
            {
                "step": self.state.global_step,
                "epoch": plan.epoch,
                "indices": rows.indices.tolist(),
                "kept": kept.tolist(),
                "weights": w.tolist(),
                "num_items": float(num_items_in_batch),
                "labels_kept": int((inputs["labels"][:, 1:] != -100).sum()),
                "loss": float(loss),
            }
        )
        return loss


class Trace(TrainerCallback):
    """Records gradients before each optimizer step, learning rates, and ``state.epoch`` at epoch ends."""

    def __init__(self, grads: bool = False) -> None:
        self.grads: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.epochs: list[float] = []
        self.keep_grads = grads

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.keep_grads:
            self.grads.append(torch.cat([p.grad.flatten().clone() for p in kw["model"].parameters()]))
        self.lrs.append(kw["optimizer"].param_groups[0]["lr"])

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.epochs.append(state.epoch)


def params(model: torch.nn.Module) -> torch.Tensor:
    """All parameters, flattened, detached (FSDP's sharded ones gathered whole: a collective)."""
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().flatten().clone() for p in whole])


__all__ = [
    "EASY_RESPONSE",
    "PadCollator",
    "Recorder",
    "Trace",
    "Trainer",
    "instruction_data",
    "params",
    "tiny_model",
    "token_sums",
    "training_args",
]
