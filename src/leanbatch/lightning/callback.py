"""``LeanBatchCallback``: InfoBatch and Selective Backprop in a stock Lightning ``Trainer`` (how it
is used: the package docstring, :mod:`leanbatch.lightning`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from torch import Tensor
from torch.utils.data import DataLoader

from leanbatch.checks import check_bool, check_per_sample_loss
from leanbatch.distributed import ScoreCarrier, carry_if_ddp
from leanbatch.indexed import WithIndex, join_index, split_index
from leanbatch.infobatch import InfoBatch
from leanbatch.lightning import loop
from leanbatch.lightning.data import EpochSampler
from leanbatch.ranks import initialized, is_distributed
from leanbatch.selection.selective_backprop import SelectiveBackprop

__all__ = ["LeanBatchCallback"]


class LeanBatchCallback(pl.Callback):
    """InfoBatch pruning and/or Selective Backprop for ``Trainer.fit``, wired through Lightning's hooks.

    Args:
        infobatch: an :class:`~leanbatch.InfoBatch` over the training set (``num_epochs`` must
            equal the Trainer's ``max_epochs``); the train DataLoader loads :attr:`dataset`
            with :attr:`sampler` (or is :meth:`dataloader`).
        selective_backprop: a :class:`~leanbatch.SelectiveBackprop`; ``training_step`` calls
            :meth:`select` on its batch first.
        index_key: where dict batches carry their dataset indices (tuple batches: last).
        log_stats: log per-epoch statistics through the Trainer's loggers (``leanbatch/...``).
        carry_scores: under DDP over several processes, send each step's score rows inside the
            backward's gradient all-reduce (:class:`~leanbatch.distributed.ScoreCarrier`,
            :attr:`score_carrier`) instead of an all-gather of their own: the same scores, 0.3-0.7 ms
            a step less on CPU gloo, not measured on NCCL. Off by default (the all-gather).

    In ``training_step``: ``x, y, idx = batch`` (tuple items get their index appended;
    dict items get it under ``index_key``), then ``return lb.loss(per_sample_loss, idx)``.
    Under DDP build the Trainer with ``use_distributed_sampler=False``: :attr:`sampler`
    shards the plan itself (Lightning's replacement would misalign scores; the callback
    stops with that advice if it finds it). Checkpoints hold the pruning and selection
    state (tensors and plain values) and a resumed fit continues exactly where it stopped.

    Example:
        >>> import torch, torch.nn.functional as F, lightning.pytorch as pl
        >>> from torch.utils.data import TensorDataset
        >>> from leanbatch import InfoBatch
        >>> data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        >>> lb = LeanBatchCallback(InfoBatch(data, num_epochs=3, delta=0.67, seed=0))
        >>> class Model(pl.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 2)
        ...     def train_dataloader(self):
        ...         return lb.dataloader(batch_size=16)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y, idx = batch
        ...         return lb.loss(F.cross_entropy(self.net(x), y, reduction="none"), idx)
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> trainer = pl.Trainer(max_epochs=3, callbacks=[lb], logger=False, enable_checkpointing=False,
        ...                      enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(Model())
        >>> [s["kept"] < 64 for s in lb.infobatch.epoch_stats], trainer.callback_metrics["leanbatch/kept_fraction"]
        ([False, True, False], tensor(1.))
    """

    def __init__(
        self,
        infobatch: InfoBatch | None = None,
        selective_backprop: SelectiveBackprop | None = None,
        *,
        index_key: str = "index",
        log_stats: bool = True,
        carry_scores: bool = False,
    ):
        if infobatch is None and selective_backprop is None:
            raise ValueError("pass infobatch=InfoBatch(...) and/or selective_backprop=SelectiveBackprop(...)")
        if infobatch is not None and not isinstance(infobatch, InfoBatch):
            raise TypeError(f"infobatch must be a leanbatch.InfoBatch, got {type(infobatch).__name__}")
        if selective_backprop is not None and not isinstance(selective_backprop, SelectiveBackprop):
            raise TypeError(
                f"selective_backprop must be a leanbatch.SelectiveBackprop, got {type(selective_backprop).__name__}"
            )
        self.infobatch = infobatch
        self.selective_backprop = selective_backprop
        self.index_key = index_key
        self.carry_scores = check_bool(carry_scores, "carry_scores")
        self.log_stats = bool(log_stats)
        self._dataset = None if infobatch is None else WithIndex(infobatch, index_key)
        self._sampler = None if infobatch is None else EpochSampler(infobatch.sampler, infobatch.num_epochs)
        self.select_time_s = 0.0  # host time spent in select(), all epochs
        self._trainer: Any = None
        self._pending: tuple[Tensor, Tensor] | None = None  # this batch's (indices, selected positions)
        self._calls = {"select": 0, "loss": 0}  # in the batch being trained
        self._recheck_length = False  # set the epoch's length again at the next batch (after a resume)
        self._epoch_start: dict[str, float] = {}
        self.score_carrier: ScoreCarrier | None = None  # with carry_scores under DDP: the scores' carrier

    # ------------------------------------------------------------------ data
    @property
    def dataset(self) -> WithIndex:
        """The dataset for the train DataLoader: the InfoBatch's items, each with its index."""
        return _needed(self._dataset, "dataset")

    @property
    def sampler(self) -> EpochSampler:
        """The sampler for the train DataLoader: the InfoBatch plan, this rank's shard of it."""
        return _needed(self._sampler, "sampler")

    def dataloader(self, **kwargs: Any) -> DataLoader:
        """``DataLoader(lb.dataset, sampler=lb.sampler, **kwargs)`` (``batch_size``, ``num_workers``, ...).

        Example:
            >>> from leanbatch import InfoBatch
            >>> lb = LeanBatchCallback(InfoBatch(list(range(10)), num_epochs=2))
            >>> items, idx = next(iter(lb.dataloader(batch_size=4)))    # (item, index) batches
            >>> bool((items == idx).all()), len(idx)
            (True, 4)
        """
        for name in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(name):
                raise ValueError(
                    f"dataloader() sets the sampler itself: drop {name}= (the plan decides the order)"
                )
        return DataLoader(self.dataset, sampler=self.sampler, **kwargs)

    # ------------------------------------------------------------------ training_step
    @property
    def progress(self) -> float:
        """Fraction of training done: InfoBatch's (trained samples) or the Trainer's batches.

        Drives Selective Backprop's window, and ``leanbatch.ProgressLR(opt, lb, cosine())``.
        """
        if self.infobatch is not None:
            return self.infobatch.progress
        t = self._trainer
        if t is None or not t.max_epochs or t.max_epochs < 1 or not t.num_training_batches:
            return 0.0  # no fit, or no end to measure progress against
        done = t.fit_loop.epoch_loop.batch_progress.current.processed / t.num_training_batches
        return min(1.0, (t.current_epoch + done) / t.max_epochs)

    def select(
        self, batch: Any, model: Any, batch_idx: int, loss_fn: Callable[..., Tensor] | None = None
    ) -> Any:
        """The rows of ``batch`` to train on (Selective Backprop); the batch itself outside SB's window.

        ``loss_fn(output, target, reduction="none")`` defaults to the SelectiveBackprop's
        ``loss_fn``. The indices stay with the kept rows; :meth:`loss` then counts the whole
        batch as trained.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> from leanbatch import SelectiveBackprop
            >>> lb = LeanBatchCallback(selective_backprop=SelectiveBackprop(start=0.0, keep=0.5,
            ...                        scale_factor=1.0, interrupt=0, loss_fn=F.cross_entropy))
            >>> x, y = lb.select((torch.randn(8, 3), torch.randint(0, 2, (8,))), torch.nn.Linear(3, 2), 0)
            >>> x.shape[0], float(lb.loss(torch.ones(4)))
            (4, 1.0)
        """
        self._calls["select"] += 1
        self._pending = None
        sb = self.selective_backprop
        if sb is None:
            return batch
        rest, idx = (batch, None) if self.infobatch is None else split_index(batch, self.index_key)
        t0 = time.perf_counter()
        sel = sb.select(rest, model, loss_fn, progress=self.progress, batch_idx=batch_idx)
        self.select_time_s += time.perf_counter() - t0
        if sel.positions is None or idx is None:
            return sel.batch if idx is None else batch
        self._pending = (idx, sel.positions)
        return join_index(sel.batch, idx.index_select(0, sel.positions.to(idx.device)), self.index_key)

    def loss(self, per_sample_loss: Tensor, indices: Tensor | None = None) -> Tensor:
        """Return the loss to backpropagate: InfoBatch's weighted mean (scores stored), else the mean.

        Args:
            per_sample_loss: one loss per trained row (``reduction="none"``).
            indices: the dataset indices of those rows, from the batch (needed with InfoBatch);
                after :meth:`select`, the kept rows' indices it returned.

        Example:
            >>> import torch
            >>> from leanbatch import InfoBatch
            >>> lb = LeanBatchCallback(InfoBatch(list(range(4)), num_epochs=2))
            >>> _, idx = next(iter(lb.dataloader(batch_size=4)))
            >>> float(lb.loss(torch.tensor([1.0, 2.0, 3.0, 4.0]), idx)), lb.infobatch.progress
            (2.5, 0.5)
        """
        self._calls["loss"] += 1
        pending, self._pending = self._pending, None
        ib = self.infobatch
        if ib is None:
            return check_per_sample_loss(per_sample_loss, "per_sample_loss").mean()
        if indices is None:
            raise TypeError(
                "loss() needs the batch's dataset indices with InfoBatch: x, y, idx = batch; "
                "return lb.loss(per_sample_loss, idx)"
            )
        if pending is None:
            return ib.update(per_sample_loss, indices)
        full, positions = pending
        if indices.shape[0] != positions.shape[0]:
            raise ValueError(
                f"select() kept {positions.shape[0]} rows but loss() got {indices.shape[0]} indices: pass the "
                "indices of the batch select() returned"
            )
        return ib.update(per_sample_loss, full, positions=positions)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        ib = self.infobatch
        if (
            stage == "fit"
            and ib is not None
            and not getattr(trainer, "fast_dev_run", False)
            and trainer.max_epochs != ib.num_epochs
        ):
            raise ValueError(
                f"InfoBatch(num_epochs={ib.num_epochs}) but Trainer(max_epochs={trainer.max_epochs}): the "
                "pruning schedule (annealing in the last epochs) and the progress need the same number"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._snapshot()
        if self.infobatch is None:
            return
        if self.carry_scores:
            self.score_carrier = carry_if_ddp(self.infobatch, trainer.strategy.model)  # wrapped by now
        dl = loop.train_loader(trainer, self.sampler, self.dataset)
        ready = loop.batches_done(trainer)  # restored by a resume: batches of Lightning's epoch done
        if ready and self.infobatch.position.trained == 0:
            loop.set_epoch_length(trainer, ready, closing=True)  # that epoch was fully trained
        else:
            loop.set_epoch_length(trainer, len(dl))
        self._recheck_length = True

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._snapshot()
        if self.infobatch is not None:
            loop.set_epoch_length(trainer, len(loop.train_loader(trainer, self.sampler, self.dataset)))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._calls = {"select": 0, "loss": 0}
        self._pending = None
        if self._recheck_length:  # the first batch after a resume may open the next epoch
            self._recheck_length = False
            loop.set_epoch_length(trainer, len(loop.train_loader(trainer, self.sampler, self.dataset)))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        calls = self._calls  # a step that returned None (a skipped batch) may have called neither
        if self.selective_backprop is not None and calls["select"] != 1 and (outputs or calls["select"]):
            raise RuntimeError(
                f"training_step called lb.select() {calls['select']} times for this batch: call it once, "
                "first: batch = lb.select(batch, self, batch_idx)"
            )
        if self.infobatch is not None and calls["loss"] != 1 and (outputs or calls["loss"]):
            raise RuntimeError(
                f"training_step called lb.loss() {calls['loss']} times for this batch: return "
                "lb.loss(per_sample_loss, idx) once per batch (it stores the scores and weights the loss)"
            )
        if self.infobatch is not None and batch_idx + 1 >= trainer.num_training_batches:
            # Lightning's epoch is over: planned samples it will not train (a DataLoader's drop_last
            # remainder, a fractional limit_train_batches) are given up now, so a checkpoint saved
            # from here on resumes in the next epoch, with its full length (see loop.py).
            self.infobatch.set_epoch(trainer.current_epoch + 1)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ib, sb = self.infobatch, self.selective_backprop
        if not self.log_stats:
            return
        if ib is not None:
            # InfoBatch's figures are the same on every rank (one plan, one score table): logged with
            # no collective (rank_zero_only turns Lightning's sync off without its "use sync_dist" warning).
            shared: dict[str, float] = {"leanbatch/pruned_so_far": float(ib.get_pruned_count())}
            stats = next((s for s in ib.epoch_stats if s["epoch"] == trainer.current_epoch), None)
            if stats is not None:
                shared["leanbatch/kept_fraction"] = stats["kept"] / stats["num_samples"]
                threshold = stats["threshold"]  # None: this epoch does not prune
                shared["leanbatch/threshold"] = float("nan") if threshold is None else float(threshold)
            pl_module.log_dict(shared, on_step=False, on_epoch=True, sync_dist=True, rank_zero_only=True)
        if sb is not None:
            # Selective Backprop's are each rank's own: averaged across ranks, the skipped count summed.
            st, start = sb.stats, self._epoch_start
            seen = st.examples - start["examples"]
            own = {
                "leanbatch/sb_backprop_fraction": (st.backpropagated - start["bp"]) / seen if seen else 1.0,
                "leanbatch/sb_selection_time_s": self.select_time_s - start["time"],
            }
            pl_module.log_dict(own, on_step=False, on_epoch=True, sync_dist=initialized())
            totals = {"leanbatch/sb_skipped_so_far": float(st.skipped)}
            pl_module.log_dict(totals, on_step=False, on_epoch=True, sync_dist=initialized(), reduce_fx="sum")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A barrier at the end of a distributed fit: under gloo, the thread that ran the last synced
        logs' all-reduce frees its tensor later, taking the GIL, and aborts a process exiting by then
        ("terminate called without an active exception"). The barrier waits with the GIL released."""
        if is_distributed():
            trainer.strategy.barrier("leanbatch_train_end")

    def _snapshot(self) -> None:
        sb = self.selective_backprop
        if sb is not None:
            st = sb.stats
            self._epoch_start = {"examples": st.examples, "bp": st.backpropagated, "time": self.select_time_s}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The pruning and selection state: tensors and plain values (a DDP collective: scores merged)."""
        ib, sb = self.infobatch, self.selective_backprop
        if ib is not None:
            ib.sampler.merge()  # every rank saves: the checkpoint holds every rank's scores
        # [epoch, samples]: what Lightning counts as trained in the epoch being trained, on this rank
        # (its batches done x the loader's batch size); a resume on another number of ranks needs it
        counted, t = None, self._trainer
        if t is not None and ib is not None and getattr(t.fit_loop, "_combined_loader", None) is not None:
            size = getattr(loop.train_loader(t, self.sampler, self.dataset), "batch_size", None) or 0
            counted = [ib.epoch, loop.batches_done(t) * size]
        return {
            "version": 1,
            "infobatch": None if ib is None else ib.state_dict(),
            "selective_backprop": None if sb is None else sb.state_dict(),
            "select_time_s": self.select_time_s,
            "lightning_counted": counted,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (Lightning calls it before the train loader is set up)."""
        ib, sb = self.infobatch, self.selective_backprop
        for name, obj in (("infobatch", ib), ("selective_backprop", sb)):
            if (state_dict.get(name) is None) != (obj is None):
                raise ValueError(
                    f"the checkpoint's leanbatch state {'has no' if obj is not None else 'has a'} {name}: "
                    "resume with the same LeanBatchCallback(infobatch=..., selective_backprop=...) set-up"
                )
        if ib is not None:
            ib.load_state_dict(state_dict["infobatch"])
            counted = state_dict.get("lightning_counted")
            if counted is not None and ib.position.trained:  # resumed inside an epoch
                self.sampler.counted_before(*counted)
        if sb is not None:
            sb.load_state_dict(state_dict["selective_backprop"])
        self.select_time_s = float(state_dict.get("select_time_s", 0.0))


def _needed(part: Any, name: str) -> Any:
    if part is None:
        raise AttributeError(f"lb.{name} needs infobatch=: with Selective Backprop alone keep your {name}")
    return part
