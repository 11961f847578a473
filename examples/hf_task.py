"""A Hugging Face ``Trainer`` task: a tiny causal language model built from a config (never
downloaded) on synthetic token sequences, judged by its eval loss (lower is better)::

    leanbatch bench --task examples/hf_task.py:train --metric eval_loss --seeds 0,1,2 \\
        --methods 'baseline,infobatch,sb[scale_factor=1]' --controls

``run.trainer(...)`` takes the arguments you would give ``Trainer(...)`` and returns the arm's
trainer: a ``LeanBatchTrainer`` with the arm's InfoBatch or Selective Backprop, or the stock
``Trainer`` for the baseline (a budget arm's ``max_steps`` set). Evaluation is off the clock, and
every evaluation inside ``train()`` (``eval_strategy="epoch"``) is the arm's ``run.log``.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

EPOCHS = 3
VOCAB, LENGTH = 32, 12


def _sequences(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Counting sequences with a random start and step: learnable, some easier than others."""
    g = torch.Generator().manual_seed(seed)
    start, step = torch.randint(0, VOCAB, (n, 1), generator=g), torch.randint(1, 4, (n, 1), generator=g)
    ids = (start + step * torch.arange(LENGTH)) % VOCAB
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


TRAIN, EVAL = _sequences(192, 0), _sequences(48, 1)


def train(run) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(run.seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=LENGTH)  # fmt: skip
    args = TrainingArguments(
        tempfile.mkdtemp(prefix="leanbatch-hf-task-"), num_train_epochs=EPOCHS, seed=run.seed,
        per_device_train_batch_size=run.batch_size(16), learning_rate=3e-3, lr_scheduler_type="cosine",
        eval_strategy="epoch", save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = run.trainer(model=LlamaForCausalLM(config), args=args, train_dataset=TRAIN, eval_dataset=EVAL)
    trainer.train()
    with run.untimed():
        return float(trainer.evaluate()["eval_loss"])
