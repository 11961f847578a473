"""Framework tasks: the arm wired into a stock Lightning ``Trainer.fit`` or Hugging Face ``Trainer.train``.

- ``run.callback(train_set, num_epochs)`` returns a :class:`~leanbatch.lightning.LeanBatchCallback`
  for the arm (InfoBatch with the arm's policy, or every sample for the others; the arm's Selective
  Backprop): the LightningModule builds its loader with ``lb.dataloader(batch_size=run.batch_size(B))``,
  calls ``lb.select`` and returns ``lb.loss(loss, idx)`` as ever. Validation is off the clock, and
  after each validation the metric Lightning logged (``self.log(name, value)``) becomes
  ``run.log``; the clock starts with the fit's training. A budget arm stops the fit after its steps; its ``progress`` (what
  ``ProgressLR(opt, lb, ...)`` reads) reaches 1.0 there.
- ``run.trainer(model=..., args=..., train_dataset=...)`` returns a ``transformers.Trainer``: a
  :class:`~leanbatch.hf.LeanBatchTrainer` for a pruning or selecting arm, the stock ``Trainer`` for
  the baseline, with ``max_steps`` set to a budget arm's steps (its schedule then ends there).
  Evaluation is off the clock, the clock starts with ``train()``, and each evaluation inside
  ``train()`` becomes ``run.log`` (``eval_loss`` and the others).

Only Selective Backprop and its uniform twin select inside the frameworks' adapters; ``obs`` and
``rho-loss`` need a plain loop's ``run.select``. The functions here use the ``run``'s public face only
(typed ``Any``: :mod:`~leanbatch.engine.running.run` imports this module, not the other way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

from leanbatch import SelectiveBackprop
from leanbatch.arms.methods import Arm
from leanbatch.engine.running.data import ContractError, CountedInfoBatch, Counts
from leanbatch.selection import Selector

__all__ = ["framework_selector", "hf_trainer", "lightning_callback"]


def _numbers(metrics: Any) -> dict[str, float]:
    """The numbers among a framework's logged metrics (floats and one-element tensors) but its epoch."""
    out = {}
    for k, v in dict(metrics).items():
        v = v.item() if hasattr(v, "numel") and v.numel() == 1 else v
        if isinstance(v, (int, float)) and not isinstance(v, bool) and str(k) != "epoch":
            out[str(k)] = float(v)
    return out


def framework_selector(arm: Arm, selector: Selector | None) -> SelectiveBackprop | None:
    """``selector`` (the arm's), refused unless it is Selective Backprop or its twin: the only
    selection the frameworks' adapters run."""
    if selector is not None and not isinstance(selector, SelectiveBackprop):
        raise ContractError(
            f"{arm.label}: a framework's adapter selects with Selective Backprop and its uniform twin only; "
            f"{arm.kind} needs a plain loop with run.select(...)"
        )
    return selector


# ---------------------------------------------------------------------------- Lightning
def lightning_callback(
    run: Any, data: CountedInfoBatch, selector: SelectiveBackprop | None, **kwargs: Any
) -> Any:
    """The arm's :class:`~leanbatch.lightning.LeanBatchCallback` over ``data`` with ``selector`` (see the
    module docstring); ``kwargs``: the callback's other arguments."""
    from leanbatch.lightning import LeanBatchCallback

    off = contextlib.ExitStack()  # a validation's block off the clock

    class ArmCallback(LeanBatchCallback):  # type: ignore[misc, valid-type]
        """:class:`~leanbatch.lightning.LeanBatchCallback` for one arm: its budget, its clock, its log."""

        @property
        def progress(self) -> float:
            total = run.total_steps
            return super().progress if total is None else min(1.0, run.data.counts.steps / total)

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
            total = run.total_steps
            if total is not None and run.data.counts.steps >= total:
                trainer.should_stop = True  # the budget is spent: the fit ends after this batch

        def on_train_start(self, trainer: Any, module: Any) -> None:
            super().on_train_start(trainer, module)
            run.clock.start()  # the fit's set-up is the framework's, not the arm's

        def on_validation_start(self, trainer: Any, module: Any) -> None:
            off.enter_context(run.untimed())

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            off.close()
            if not trainer.sanity_checking:
                run.log(epoch=trainer.current_epoch, **_numbers(trainer.callback_metrics))

    return ArmCallback(data, selector, **kwargs)


# ---------------------------------------------------------------------------- Hugging Face
class _Steps:
    """A stock Trainer's arm: the rows and steps its training steps took, its progress."""

    def __init__(self, trainer: Any):
        self.counts, self.trainer = Counts(), trainer

    @property
    def progress(self) -> float:
        state = self.trainer.state
        return min(1.0, state.global_step / state.max_steps) if state.max_steps else 0.0


def _trainer_class(base: type, run: Any, selector: SelectiveBackprop | None) -> type:
    class ArmTrainer(base):  # type: ignore[misc, valid-type]
        """The arm's trainer: counts its steps, evaluates off the clock, logs each evaluation."""

        _training, _skipped = False, 0

        def train(self, *args: Any, **kwargs: Any) -> Any:
            self._training = True
            run.clock.start()  # the trainer's set-up is the framework's, not the arm's
            try:
                return super().train(*args, **kwargs)
            finally:
                self._training = False

        def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            tensors = (
                [v for v in inputs.values() if hasattr(v, "shape")] if isinstance(inputs, dict) else [inputs]
            )
            # rows the selection took out of this batch (before this step) count too
            skipped = 0 if selector is None else selector.stats.skipped - self._skipped
            self._skipped += skipped
            run.data.counts.add(len(tensors[0]) + skipped)
            return super().training_step(model, inputs, *args, **kwargs)

        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            with run.untimed():
                metrics = super().evaluate(*args, **kwargs)
            if self._training:
                epoch = max(0, math.ceil(float(self.state.epoch or 0.0)) - 1)
                run.log(epoch=epoch, **_numbers(metrics))
            return metrics

    return ArmTrainer


def hf_trainer(
    run: Any,
    args: Any,
    train_dataset: Any,
    data: CountedInfoBatch | None,
    selector: SelectiveBackprop | None,
    trainer_class: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The arm's ``transformers.Trainer`` (see the module docstring) and its data: ``data`` (a pruning
    arm's InfoBatch), else what counts the trainer's steps. ``trainer_class``: a ``Trainer`` subclass
    of your own (the default: ``Trainer``)."""
    from transformers import Trainer

    from leanbatch.hf import leanbatch_trainer

    base = trainer_class or Trainer
    if data is not None or selector is not None:
        lean = {"train_dataset": data if data is not None else train_dataset, "selective_backprop": selector}
        base = leanbatch_trainer(base)
    else:
        total = run.total_steps
        if total is not None:
            steps = math.ceil(total / max(1, args.gradient_accumulation_steps))
            args = dataclasses.replace(args, max_steps=steps)
        lean = {"train_dataset": train_dataset}
    trainer = _trainer_class(base, run, selector)(args=args, **lean, **kwargs)
    return trainer, data if data is not None else _Steps(trainer)
