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
``rho-loss`` need a plain loop's ``run.select``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

from leanbatch import SelectiveBackprop
from leanbatch.arms.registry import SelectorContext
from leanbatch.engine.data import ArmRun, ContractError, CountedInfoBatch, _Counts

__all__ = ["hf_trainer", "lightning_callback"]


def _numbers(metrics: Any) -> dict[str, float]:
    """The numbers among a framework's logged metrics (floats and one-element tensors)."""
    out = {}
    for k, v in dict(metrics).items():
        v = v.item() if hasattr(v, "numel") and v.numel() == 1 else v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[str(k)] = float(v)
    return out


def _selector(run: ArmRun, loss_fn: Any, proxy: Any) -> SelectiveBackprop | None:
    if not run.arm.selects:
        return None
    sel = run.arm.selector(
        SelectorContext(run.seed, run._sizes[0] if run._sizes else 1, proxy, None, loss_fn)
    )
    if not isinstance(sel, SelectiveBackprop):
        raise ContractError(
            f"{run.label}: a framework's adapter selects with Selective Backprop and its uniform twin only; "
            f"{run.kind} needs a plain loop with run.select(...)"
        )
    run._selector = sel
    return sel


def _data(run: ArmRun, dataset: Any, num_epochs: int, **options: Any) -> CountedInfoBatch:
    """The arm's InfoBatch (every sample kept with weight 1 for a keep-all arm)."""
    run._sizes = run._check_data(dataset, num_epochs)
    if run.arm.prunes:
        return CountedInfoBatch(
            dataset, num_epochs, seed=run.seed, policy=run.arm.policy(num_epochs, run.seed), **options
        )
    return CountedInfoBatch(dataset, num_epochs, 0.0, seed=run.seed, policy="random", **options)


def _limited(run: ArmRun) -> int | None:
    return run.total_steps if run.arm.budget != 1.0 or run.arm.batch != 1.0 else None


# ---------------------------------------------------------------------------- Lightning
_CALLBACK: list[type] = []


def _callback_class() -> type:
    if _CALLBACK:
        return _CALLBACK[0]
    from leanbatch.lightning import LeanBatchCallback

    class ArmCallback(LeanBatchCallback):  # type: ignore[misc, valid-type]
        """:class:`~leanbatch.lightning.LeanBatchCallback` for one arm: its budget, its clock, its log."""

        def __init__(self, run: ArmRun, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.run, self._off = run, contextlib.ExitStack()

        @property
        def progress(self) -> float:
            total = _limited(self.run)
            return super().progress if total is None else min(1.0, self.run.data.counts.steps / total)

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
            total = _limited(self.run)
            if total is not None and self.run.data.counts.steps >= total:
                trainer.should_stop = True  # the budget is spent: the fit ends after this batch

        def on_train_start(self, trainer: Any, module: Any) -> None:
            super().on_train_start(trainer, module)
            self.run.clock.start()  # the fit's set-up is the framework's, not the arm's

        def on_validation_start(self, trainer: Any, module: Any) -> None:
            self._off.enter_context(self.run.untimed())

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            self._off.close()
            if not trainer.sanity_checking:
                values = {k: v for k, v in _numbers(trainer.callback_metrics).items() if k != "epoch"}
                self.run.log(epoch=trainer.current_epoch, **values)

    _CALLBACK.append(ArmCallback)
    return ArmCallback


def lightning_callback(
    run: ArmRun, dataset: Any, num_epochs: int, *, loss_fn: Any = None, proxy: Any = None, **kwargs: Any
) -> Any:
    """The arm's :class:`~leanbatch.lightning.LeanBatchCallback` (see the module docstring); ``loss_fn``:
    Selective Backprop's ``loss_fn(output, target, reduction="none")`` for ``lb.select``."""
    ib = _data(run, dataset, num_epochs)
    cb = _callback_class()(run, ib, _selector(run, loss_fn, proxy), **kwargs)
    run.data = ib
    return cb


# ---------------------------------------------------------------------------- Hugging Face
class _Steps:
    """A stock Trainer's arm: the rows and steps its training steps took, its progress."""

    def __init__(self, trainer: Any):
        self.counts, self.trainer = _Counts(), trainer

    @property
    def progress(self) -> float:
        state = self.trainer.state
        return min(1.0, state.global_step / state.max_steps) if state.max_steps else 0.0


def _trainer_class(base: type) -> type:
    class ArmTrainer(base):  # type: ignore[misc, valid-type]
        """The arm's trainer: counts its steps, evaluates off the clock, logs each evaluation."""

        def __init__(self, *args: Any, run: ArmRun, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.run, self._training, self._skipped = run, False, 0

        def train(self, *args: Any, **kwargs: Any) -> Any:
            self._training = True
            self.run.clock.start()  # the trainer's set-up is the framework's, not the arm's
            try:
                return super().train(*args, **kwargs)
            finally:
                self._training = False

        def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            tensors = (
                [v for v in inputs.values() if hasattr(v, "shape")] if isinstance(inputs, dict) else [inputs]
            )
            sel = self.run._selector  # rows the selection took out of this batch (before this step) count too
            skipped = 0 if sel is None else sel.stats.skipped - self._skipped
            self._skipped += skipped
            self.run.data.counts.add(range(len(tensors[0]) + skipped), None)
            return super().training_step(model, inputs, *args, **kwargs)

        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            with self.run.untimed():
                metrics = super().evaluate(*args, **kwargs)
            if self._training:
                epoch = max(0, math.ceil(float(self.state.epoch or 0.0)) - 1)
                values = {k: v for k, v in _numbers(metrics).items() if k != "epoch"}
                self.run.log(epoch=epoch, **values)
            return metrics

    return ArmTrainer


def hf_trainer(
    run: ArmRun, *, args: Any, train_dataset: Any, trainer_class: Any = None, **kwargs: Any
) -> Any:
    """The arm's ``transformers.Trainer`` (see the module docstring); ``trainer_class``: a ``Trainer``
    subclass of your own (the default: ``Trainer``)."""
    from transformers import Trainer

    from leanbatch.hf import leanbatch_trainer

    base = trainer_class or Trainer
    epochs = args.num_train_epochs
    if float(epochs) != int(epochs):
        raise ContractError(f"args.num_train_epochs={epochs}: the arms plan whole epochs; use an integer")
    if run.arm.prunes or run.arm.selects:
        data: Any = _data(run, train_dataset, int(epochs), shard=False) if run.arm.prunes else None
        if data is None:
            run._sizes = run._check_data(train_dataset, int(epochs))
        sb = _selector(run, None, kwargs.pop("proxy", None))
        lean = {"train_dataset": data if data is not None else train_dataset, "selective_backprop": sb}
        trainer = _trainer_class(leanbatch_trainer(base))(run=run, args=args, **lean, **kwargs)
        run.data = data if data is not None else _Steps(trainer)
    else:
        run._sizes = run._check_data(train_dataset, int(epochs))
        if run._batch is None:
            run._batch = int(args.per_device_train_batch_size)
        total = _limited(run)
        if total is not None:
            args = dataclasses.replace(
                args, max_steps=math.ceil(total / max(1, args.gradient_accumulation_steps))
            )
        trainer = _trainer_class(base)(run=run, args=args, train_dataset=train_dataset, **kwargs)
        run.data = _Steps(trainer)
    return trainer
