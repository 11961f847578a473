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
  loss. Selective Backprop picks whole sequences of every micro-batch of an accumulation
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
    >>> trainer = LeanBatchTrainer(model=model, args=args, train_dataset=ds)
    >>> _ = trainer.train()  # doctest: +ELLIPSIS
    {'train_runtime': ...}
    >>> [s["kept"] < 24 for s in ds.epoch_stats], trainer.state.epoch, trainer.lr_scheduler.get_last_lr()
    ([False, True, False], 3.0, [0.0, 0.0])
"""

from __future__ import annotations

from transformers import Trainer

from leanbatch.hf.data import INDEX_KEY
from leanbatch.hf.losses import sequence_scores, token_losses, weighted_loss
from leanbatch.hf.trainer import STATE_FILE, LeanbatchMixin

__all__ = [
    "INDEX_KEY",
    "STATE_FILE",
    "LeanBatchTrainer",
    "leanbatch_trainer",
    "sequence_scores",
    "token_losses",
    "weighted_loss",
]


class LeanBatchTrainer(LeanbatchMixin, Trainer):
    """``transformers.Trainer`` with InfoBatch (or random pruning) and/or Selective Backprop.

    Arguments: those of ``Trainer``, and to prune either ``train_dataset=InfoBatch(train_set,
    num_epochs, ..., shard=False)`` (``num_epochs`` equal to ``args.num_train_epochs``) or
    ``infobatch={...}``, InfoBatch's other settings (``prune_ratio``, ``delta``, ``seed``,
    ``policy``, ...), which wraps the training set as the trainer prepared it (trl's
    ``SFTTrainer`` wants a ``datasets.Dataset`` and tokenizes it in its ``__init__``); to
    select, ``selective_backprop=SelectiveBackprop(..., scale_factor=1.0)``. Pruning or
    selection alone, or both. Unsupported settings are refused here, each with the argument
    to change.

    Attributes: ``infobatch`` (the InfoBatch or ``None``), ``selective_backprop``.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
        >>> from leanbatch import InfoBatch, SelectiveBackprop
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        >>> data = [{"input_ids": torch.arange(6), "labels": torch.arange(6)} for _ in range(8)]
        >>> args = TrainingArguments("/tmp/leanbatch-doctest", num_train_epochs=2, use_cpu=True, report_to="none")
        >>> sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0)
        >>> trainer = LeanBatchTrainer(model=model, args=args, train_dataset=InfoBatch(data, 2, shard=False),
        ...                            selective_backprop=sb)
        >>> type(trainer.infobatch).__name__, trainer.selective_backprop is sb
        ('InfoBatch', True)
        >>> try:
        ...     LeanBatchTrainer(model=model, args=args, train_dataset=InfoBatch(data, 2))
        ... except ValueError as e:
        ...     print(str(e).split(":")[0])
        train_dataset=InfoBatch(..., shard=True)
    """


_CLASSES: dict[type, type] = {Trainer: LeanBatchTrainer}


def leanbatch_trainer(trainer_cls: type[Trainer]) -> type[Trainer]:
    """The class ``trainer_cls`` extended with leanbatch (``LeanBatchTrainer`` for ``Trainer``).

    Works for ``Trainer`` subclasses that keep the Trainer's training loop and whose
    ``compute_loss`` calls ``super().compute_loss`` or the ``compute_loss_func`` hook, which
    the adapter's loss goes through (trl 1.16's ``SFTTrainer`` calls the hook; pass it
    ``infobatch={...}``). The same class is returned for the same input.

    Example:
        >>> from transformers import Trainer
        >>> class MyTrainer(Trainer):
        ...     pass
        >>> Lean = leanbatch_trainer(MyTrainer)
        >>> Lean.__name__, issubclass(Lean, MyTrainer), leanbatch_trainer(MyTrainer) is Lean
        ('LeanbatchMyTrainer', True, True)
        >>> leanbatch_trainer(Trainer) is LeanBatchTrainer
        True
    """
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"trainer_cls must be transformers.Trainer or a subclass of it, got {trainer_cls!r}")
    if issubclass(trainer_cls, LeanbatchMixin):
        return trainer_cls
    cls = _CLASSES.get(trainer_cls)
    if cls is None:
        doc = f"``{trainer_cls.__name__}`` with leanbatch; see :class:`LeanBatchTrainer`."
        cls = type(f"Leanbatch{trainer_cls.__name__}", (LeanbatchMixin, trainer_cls), {"__doc__": doc})
        _CLASSES[trainer_cls] = cls
    return cls
