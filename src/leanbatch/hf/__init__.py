"""Hugging Face ``Trainer`` (and accelerate) adapter: InfoBatch, random pruning, Selective Backprop.

A user changes three things: wrap the training set in ``InfoBatch(..., shard=False)``, pass
a ``SelectiveBackprop`` if wanted, and build :class:`LeanBatchTrainer` (or
``leanbatch_trainer(SomeTrainerSubclass)``) instead of ``Trainer``. Nothing is patched.

What the Trainer (transformers 5.24) and accelerate (1.15) do, and how it is handled:

- **Sampler and indices.** ``_get_train_sampler`` returns the InfoBatch sampler; each item
  carries its dataset index, which is kept through ``remove_unused_columns`` (added to the
  signature columns), taken out of the items before the collator, attached to the batch
  as a CPU object accelerate does not move, and removed before ``forward``.
- **Several processes.** accelerate shards the *batch sampler* (``BatchSamplerShard``: rank
  ``r`` takes batches ``r, r + n, ...``, the last round padded from the start) and reads
  one batch ahead. InfoBatch is built with ``shard=False``: every process serves the same
  global plan, seeded from ``(seed, epoch)``, from scores merged across the processes
  before each plan. Each trained micro-batch marks the whole round trained (``n`` batches,
  fewer samples at the epoch's end), so every process counts the epoch alike.
- **Steps, schedule, epochs.** The Trainer fixes ``max_steps`` from the first (full)
  epoch and runs a fixed number of steps per epoch. Here each epoch runs with its own
  length, so the last partial gradient-accumulation group steps the optimizer (no
  gradient leaks into the next epoch); the Trainer's LR schedule is evaluated at
  ``progress * max_steps``, so it ends exactly at the end of training; ``state.epoch``
  counts trained samples and ends at ``num_train_epochs``.
- **Loss.** Token losses are computed once (as the model's ``ForCausalLMLoss`` does):
  each sequence's score is its mean token loss over labelled tokens (labels != -100; a
  sequence without one gets no score), its tokens are weighted by its InfoBatch weight,
  and the sum is divided by ``num_items_in_batch``, the Trainer's count of labelled tokens
  in the whole accumulated batch across processes. With all weights 1 this is the stock
  loss. Packed and padding-free batches (``position_ids`` instead of an ``attention_mask``):
  each served sample's packed sequences are found (:mod:`leanbatch.hf.packed`) and scored and
  weighted as that sample. Selective Backprop picks whole sequences of every micro-batch of an accumulation
  group before it is trained; ``num_items_in_batch`` counts the picked ones.
- **Resume.** Checkpoints hold ``leanbatch_state.pt`` (tensors and plain values). The
  Trainer would resume at epoch ``global_step // steps_per_full_epoch`` and skip batches by
  re-iterating the sampler; here the sampler itself resumes at the trained position and
  nothing is skipped, so a resumed run equals the uninterrupted one.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
    >>> from leanbatch import InfoBatch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> data = [{"input_ids": torch.arange(8) % 5 + i % 3, "labels": torch.arange(8) % 5 + i % 3}
    ...         for i in range(24)]
    >>> ds = InfoBatch(data, num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0, shard=False)
    >>> args = TrainingArguments("/tmp/leanbatch-doctest", num_train_epochs=3, per_device_train_batch_size=4,
    ...     learning_rate=1e-2, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True)
    >>> from leanbatch.hf import LeanBatchTrainer
    >>> trainer = LeanBatchTrainer(model=model, args=args, train_dataset=ds)
    >>> _ = trainer.train()  # doctest: +ELLIPSIS
    {'train_runtime': ...}
    >>> [s["kept"] < 24 for s in ds.epoch_stats], trainer.state.epoch, trainer.lr_scheduler.get_last_lr()
    ([False, True, False], 3.0, [0.0, 0.0])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leanbatch.hf.data import INDEX_KEY, IndexedDataset
from leanbatch.hf.losses import sequence_scores, token_losses, weighted_loss
from leanbatch.optional import import_with_extra

if TYPE_CHECKING:
    from leanbatch.hf.lean_trainer import LeanBatchTrainer, leanbatch_trainer
    from leanbatch.hf.tokens import TokenSelectionTrainer
    from leanbatch.hf.trainer import STATE_FILE

__all__ = [
    "INDEX_KEY",
    "STATE_FILE",
    "IndexedDataset",
    "LeanBatchTrainer",
    "TokenSelectionTrainer",
    "leanbatch_trainer",
    "sequence_scores",
    "token_losses",
    "weighted_loss",
]

# the names that need transformers, and their modules
_NEEDS_TRANSFORMERS = {
    "STATE_FILE": "leanbatch.hf.trainer",
    "LeanBatchTrainer": "leanbatch.hf.lean_trainer",
    "leanbatch_trainer": "leanbatch.hf.lean_trainer",
    "TokenSelectionTrainer": "leanbatch.hf.tokens",
}


def __getattr__(name: str) -> Any:
    """Load the Trainer classes (and transformers with them) on first use."""
    home = _NEEDS_TRANSFORMERS.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = import_with_extra(home, "transformers", ("transformers", "accelerate"))
    value = getattr(module, name)
    globals()[name] = value
    return value
