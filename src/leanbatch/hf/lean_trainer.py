"""The public Trainer classes, ``LeanBatchTrainer`` and ``leanbatch_trainer(AnyTrainerSubclass)``: each
:class:`~leanbatch.hf.trainer.LeanbatchMixin` over a ``transformers.Trainer`` (it imports transformers)."""

from __future__ import annotations

from transformers import Trainer

from leanbatch.hf.trainer import LeanbatchMixin

__all__ = ["LeanBatchTrainer", "leanbatch_trainer"]


class LeanBatchTrainer(LeanbatchMixin, Trainer):
    """``transformers.Trainer`` with InfoBatch (or random pruning) and/or Selective Backprop.

    Arguments: those of ``Trainer``, and to prune either ``train_dataset=InfoBatch(train_set,
    num_epochs, ..., shard=False)`` (``num_epochs`` equal to ``args.num_train_epochs``) or
    ``infobatch={...}``, InfoBatch's other settings (``prune_ratio``, ``delta``, ``seed``,
    ``policy``, ...), which wraps the training set as the trainer prepared it (trl's
    ``SFTTrainer`` wants a ``datasets.Dataset`` and tokenizes it in its ``__init__``); to
    select, ``selective_backprop=SelectiveBackprop(..., scale_factor=1.0)``. Pruning or
    selection alone, or both. Unsupported settings are refused here, each with the argument
    to change. ``carry_scores=True`` (off by default): under DDP over several processes each
    step's score rows ride the backward's gradient all-reduce (:class:`~leanbatch.distributed.ScoreCarrier`,
    ``trainer.score_carrier``) instead of an all-gather of their own; the same scores, 0.3-0.7 ms
    a step less on CPU gloo, not measured on NCCL. Off, or under FSDP or DeepSpeed, the all-gather.

    Attributes: ``infobatch`` (the InfoBatch or ``None``), ``selective_backprop``, ``score_carrier``.

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
