"""The score table: one float32 score (the last observed loss) per dataset index.

Every method in leanbatch reads and writes per-sample losses keyed by dataset index; this
module keeps them, for one process. ``NaN`` marks "never scored"; non-finite losses are skipped
and counted, never stored, so a score is either a real loss or NaN. How the scores of several
processes meet (gathered every step, carried in DDP's all-reduce, merged, or sharded) is
:mod:`leanbatch.distributed`'s business: it hands this table rows that arrive later
(:meth:`ScoreTable.receive`) and reads which rows this process wrote itself
(:meth:`ScoreTable.take_written`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_bool, check_per_sample_loss, check_saved_tensor, require

__all__ = ["ScoreTable"]

Rows = Callable[[], tuple[Tensor, Tensor]]  # a queued write: (indices, losses) when flushed


class ScoreTable:
    """One float32 score per dataset index, on CPU or on the training device.

    ``update(indices, losses)`` is a vectorised scatter. Non-finite losses are not
    stored (the old score stays) and are counted in ``nonfinite_count``. With
    ``ema=m`` a new loss is blended as ``m * old + (1 - m) * new`` (the first
    observation is stored as is). The per-step path does no host-device
    synchronisation: checks on tensor values run asynchronously on CUDA.

    The table may start on CPU and follow the losses to their device on the first
    update (``device=None``), so users need not say where training runs.

    With ``variance=True`` (needs ``ema``) the table also keeps an exponentially
    weighted variance of each sample's losses (Finch's update: with ``d = new - mean``,
    ``var <- m * (var + (1 - m) * d**2)``; 0 after the first observation, NaN before),
    read by :attr:`variances`; UCB pruning ranks by ``mean + c * sqrt(var)``.

    Example:
        >>> import torch
        >>> t = ScoreTable(4)
        >>> t.update(torch.tensor([0, 2]), torch.tensor([1.5, float("nan")]))
        >>> t.values.tolist()[:3], int(t.nonfinite_count)
        ([1.5, nan, nan], 1)
        >>> v = ScoreTable(2, ema=0.5, variance=True)
        >>> v.update(torch.tensor([0]), torch.tensor([1.0])); v.update(torch.tensor([0]), torch.tensor([3.0]))
        >>> v.values.tolist(), v.variances.tolist()   # mean 0.5 * 1 + 0.5 * 3; var 0.5 * (0 + 0.5 * 2**2)
        ([2.0, nan], [1.0, nan])
    """

    def __init__(
        self,
        num_samples: int,
        device: torch.device | str | None = None,
        ema: float | None = None,
        variance: bool = False,
    ):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        if ema is not None and not (isinstance(ema, (int, float)) and 0.0 <= float(ema) < 1.0):
            raise ValueError(f"ema must be None or a float in [0, 1), got {ema!r}")
        check_bool(variance, "variance")
        if variance and ema is None:
            raise ValueError(
                "variance=True keeps an exponentially weighted variance of the losses, which needs the EMA "
                "momentum: pass ema= as well (e.g. ScoreTable(n, ema=0.9, variance=True))"
            )
        self.num_samples = num_samples
        self.ema = None if ema is None else float(ema)
        self.flush_every = 8192
        self.version = 0  # stores so far (a write counter: what changed since a merge, a plan)
        self._follow_device = device is None
        # Queued writes: references, not copies, with their version counters (see store), checked
        # when flushed; or calls giving rows still on their way from elsewhere (receive).
        self._pending: list[Any] = []
        self._pending_received = False  # the queued writes are received rows, not this process's
        self._pending_n = 0
        dev = torch.device("cpu") if device is None else torch.device(device)
        # One slot past the end takes the writes that store nothing (non-finite losses, padding).
        self._values = torch.full((self.rows + 1,), float("nan"), dtype=torch.float32, device=dev)
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=dev)
        self._var: Tensor | None = torch.full_like(self._values, float("nan")) if variance else None
        self._written: Tensor | None = None  # rows this process wrote since take_written()

    @property
    def rows(self) -> int:
        """How many rows the table holds: one per dataset index (a shard holds fewer)."""
        return self.num_samples

    def __getstate__(self) -> dict[str, Any]:
        self.flush()  # queued writes hold references and version counters that a copy would not keep
        return dict(self.__dict__)

    # ------------------------------------------------------------------ device
    @property
    def device(self) -> torch.device:
        """Where the scores live."""
        return self._values.device

    def to(self, device: torch.device | str) -> ScoreTable:
        """Move the table to ``device`` (asynchronously where possible); returns self."""
        device = torch.device(device)
        self.flush()
        if device != self._values.device:
            for name in ("_values", "_nonfinite", "_var", "_written"):
                t = getattr(self, name)
                if t is not None:
                    setattr(self, name, t.to(device, non_blocking=True))
        return self

    def follow(self, device: torch.device) -> None:
        """Move to ``device`` if the table follows the losses (built with ``device=None``) and is elsewhere."""
        if self._follow_device and device != self._values.device:
            self.to(device)

    def _index(self, indices: Tensor) -> Tensor:
        if indices.device != self._values.device:
            indices = indices.to(self._values.device, non_blocking=True)
        return indices if indices.dtype == torch.int64 else indices.long()

    # ------------------------------------------------------------------ writes
    def check_indices(self, indices: Tensor, name: str = "indices") -> None:
        """Raise if any index is outside ``[0, num_samples)``; asynchronous on CUDA."""
        if indices.numel() == 0:
            return
        msg = (
            f"{name} out of range: every index must be in [0, {self.num_samples}) "
            "(is the table built for this dataset?)"
        )
        if indices.device.type == "cpu":
            lo, hi = torch.aminmax(indices)
            if int(lo) < 0 or int(hi) >= self.num_samples:
                raise IndexError(msg)
        else:  # device-side assert: no host sync
            torch._assert_async(((indices >= 0) & (indices < self.num_samples)).all(), msg)

    def update(self, indices: Tensor, losses: Tensor) -> None:
        """Store ``losses`` (any float dtype, detached) as the scores of ``indices``.

        Shapes must match; non-finite losses are skipped and counted.
        """
        if not isinstance(indices, Tensor) or indices.dim() != 1 or indices.is_floating_point():
            raise TypeError("indices must be a 1-D integer tensor of dataset indices")
        losses = check_per_sample_loss(losses, "losses")
        if losses.shape[0] != indices.shape[0]:
            raise ValueError(
                f"losses has {losses.shape[0]} entries but indices has {indices.shape[0]}: "
                "pass one per-sample loss per index"
            )
        if indices.device.type == "cpu":  # a copy: CPU memory can change behind torch's back (numpy)
            indices = indices.clone() if indices.dtype == torch.int64 else indices.long()
        self.store(indices, losses)

    def store(self, indices: Tensor, losses: Tensor, check: bool = True) -> Tensor:
        """The per-step path behind :meth:`update`, for callers that validated shapes.

        Queues references to ``indices`` and the detached ``losses`` (no copy: a step
        costs a list append); queued losses are written in one vectorised scatter
        every few thousand samples and whenever the scores are read (:attr:`values`,
        :meth:`get`, planning, ``state_dict``). Each queued tensor's version counter
        is recorded, so a tensor modified in place before it is written raises an
        error instead of storing wrong scores; callers pass CPU indices they own
        (the sampler's, or a copy), since memory shared with numpy changes without
        a version bump. An index equal to ``num_samples`` (the spare slot past the end) writes
        nowhere: a row that trains but does not score, e.g. padding. Returns the indices as an
        int64 tensor on the table's device.
        """
        device = self._values.device
        if self._follow_device and losses.device != device:
            self.to(losses.device)
            device = self._values.device
        idx = indices if indices.device == device else indices.to(device, non_blocking=True)
        if idx.dtype != torch.int64:
            idx = idx.long()
        if check:
            self.check_indices(idx)
        loss = losses.detach()
        if self._pending_received or self._pending_n >= self.flush_every or self.ema is not None:
            self.flush()  # own and received writes flush apart; EMA blends step by step
            self._pending_received = False
        self._pending.append((idx, loss, idx._version, loss._version))
        self._pending_n += idx.shape[0]
        self.version += 1
        return idx

    def receive(self, rows: Rows, count: int) -> None:
        """Queue ``count`` rows that arrive later: ``rows()`` gives ``(indices, losses)`` when the table
        flushes (a collective in flight, e.g. :func:`~leanbatch.distributed.collectives.gather_step`).

        Received rows are not this process's own writes: :meth:`take_written` does not count them.

        Example:
            >>> import torch
            >>> t = ScoreTable(3)
            >>> t.receive(lambda: (torch.tensor([2]), torch.tensor([0.5])), 1)
            >>> t.values.tolist()
            [nan, nan, 0.5]
        """
        if not self._pending_received or self._pending_n >= self.flush_every or self.ema is not None:
            self.flush()  # as in store (only own writes are marked written)
            self._pending_received = True
        self._pending.append(rows)
        self._pending_n += count
        self.version += 1

    def flush(self) -> None:
        """Write the queued losses into the table (skipping and counting non-finite ones).

        When one index was queued several times, its last finite loss wins (a non-finite one
        never replaces a score). No boolean masks, no value read on the host: on the CPU one
        scatter writes in order; on a device whose scatter runs in parallel, the writes are first
        sorted by slot and each given its slot's last value (:func:`_last_writes`), so the result
        does not depend on the order the scatter applies them.
        """
        pending = self._pending
        if not pending:
            return
        self._pending, self._pending_n = [], 0
        rows = (
            [queued() for queued in pending] if self._pending_received else [_unchanged(*q) for q in pending]
        )
        if len(rows) == 1:
            idx, new = rows[0]
        else:
            idx, new = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        idx = idx.to(self._values.device, non_blocking=True)
        step = 1 << 23  # bounded work per scatter; parts apply in order
        for start in range(0, idx.numel(), step):
            self._write(idx[start : start + step], new[start : start + step])

    def _slots(self, idx: Tensor, finite: Tensor) -> Tensor:
        """The row each write goes to: its index, or the spare slot for a non-finite loss."""
        return torch.where(finite, idx, self.rows)

    def _write(self, idx: Tensor, new: Tensor) -> None:
        values = self._values
        new = new.to(values.device, torch.float32, non_blocking=True)
        finite = new.abs() < float("inf")  # False for NaN and +-Inf; cheaper than isfinite
        self._nonfinite += finite.numel() - torch.count_nonzero(finite)
        slot = self._slots(idx, finite)
        if slot.device.type != "cpu":  # a parallel scatter: every write of a slot must carry its last value
            slot, new = _last_writes(slot, new)
        if self.ema is not None:  # flushed every step (see store): blended with the stored score
            m = self.ema
            old = values.index_select(0, slot)
            unseen = torch.isnan(old)
            if self._var is not None:  # Finch's EMA variance, from the deviation to the old mean
                d = new - old
                var = torch.where(unseen, 0.0, (self._var.index_select(0, slot) + (1.0 - m) * d * d) * m)
                self._var.scatter_(0, slot, var)
            new = torch.where(unseen, new, old * m + new * (1.0 - m))
        # On the CPU a 1-D scatter writes in index order, so a slot's last write wins.
        values.scatter_(0, slot, new)
        if self._written is not None and not self._pending_received:
            self._written.index_fill_(0, slot, True)

    # ------------------------------------------------------------------ reads
    @property
    def values(self) -> Tensor:
        """The scores, float32 (rows,), NaN where never scored: a view of the table (writes stick)."""
        self.flush()
        return self._values[: self.rows]

    @property
    def variances(self) -> Tensor:
        """The EMA variances, float32 (rows,), NaN where never scored (``variance=True`` only)."""
        if self._var is None:
            raise AttributeError(
                "this table keeps no variance: build it with ScoreTable(n, ema=m, variance=True)"
            )
        self.flush()
        return self._var[: self.rows]

    @property
    def tracks_variance(self) -> bool:
        """Whether the table keeps an EMA variance per sample."""
        return self._var is not None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the table holds between steps (scores, variances, the spare slot).

        Example:
            >>> ScoreTable(3).nbytes   # 3 float32 scores and the spare slot
            16
        """
        held = (self._values, self._var, self._written)
        return sum(t.nbytes for t in held if t is not None)

    # A table of one rank's slice (distributed/shards.py) answers these otherwise.
    owner: tuple[int, int] | None = None  # (world, rank) of a table holding one rank's slice

    def check_owned(self, indices: Tensor) -> None:
        """Raise unless this table holds every index (here it holds all of them)."""

    def plan(self, policy: Any, epoch: int, generator: torch.Generator, **layout: Any) -> Any:
        """Epoch ``epoch``'s plan by ``policy`` (``layout``: what a sharded table plans its part with).

        Example:
            >>> from leanbatch import RandomPolicy
            >>> ScoreTable(4).plan(RandomPolicy(0.5, 2), 0, torch.Generator()).num_samples
            4
        """
        return policy(self.values, epoch, generator)

    def load_plan(self, kind: Any, saved: Any, name: str) -> Any:
        """A saved plan of this table's epoch, validated by ``kind.from_state`` (``kind``: ``Plan``)."""
        return kind.from_state(saved, self.num_samples, name)

    def get(self, indices: Tensor) -> Tensor:
        """Scores of ``indices`` (NaN where never scored)."""
        idx = self._index(indices)
        self.check_indices(idx)
        return self.values[idx]

    @property
    def nonfinite_count(self) -> Tensor:
        """Number of non-finite losses skipped so far (a 0-d tensor; reading it syncs on CUDA)."""
        self.flush()
        return self._nonfinite

    def num_scored(self) -> int:
        """How many indices hold a score (syncs; not for the per-step path)."""
        return int((~torch.isnan(self.values)).sum())

    def take_written(self) -> Tensor:
        """Which rows this process wrote (:meth:`store`, not :meth:`receive`) since the last call, as a
        bool tensor (rows,); the first call, before any load: every row scored. Counting starts anew.

        What a merge across processes averages (:func:`leanbatch.distributed.merge_scores`).

        Example:
            >>> import torch
            >>> t = ScoreTable(3)
            >>> t.update(torch.tensor([0]), torch.tensor([1.0]))
            >>> t.take_written().tolist(), t.take_written().tolist()
            ([True, False, False], [False, False, False])
        """
        self.flush()
        written = ~torch.isnan(self.values) if self._written is None else self._written[: self.rows]
        self._written = torch.zeros(self.rows + 1, dtype=torch.bool, device=self._values.device)
        return written

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "num_samples": self.num_samples,
            "ema": self.ema,
            "values": self.values.detach().cpu().clone(),
            "nonfinite": int(self.nonfinite_count),
            "variance": None if self._var is None else self.variances.detach().cpu().clone(),
        }

    def _check_state(self, state: Any) -> dict[str, Any]:
        """``state``, checked to be a state of a table like this one (its size, its variance)."""
        state = dict(require(state, ("num_samples", "values"), "state_dict"))
        n = state["num_samples"]
        if n != self.num_samples:
            raise ValueError(
                f"state_dict is for {n} samples but this table has {self.num_samples}: "
                "load a checkpoint made with the same dataset"
            )
        if "world" in state:
            raise ValueError(
                f"state_dict holds the scores of rank {state.get('rank')} of {state['world']} (shard_scores=True): "
                "gather the shards with leanbatch.distributed.gather_states"
            )
        return state

    def _saved_variance(self, state: Mapping[str, Any], n: int) -> Tensor | None:
        """``state["variance"]`` (``n`` rows) checked, or ``None``: saved iff this table keeps variances."""
        if (state.get("variance") is None) == self.tracks_variance:
            raise ValueError(
                "state_dict and this table disagree on variance tracking: build the table with the same "
                "variance= as the one that saved it"
            )
        return None if state.get("variance") is None else check_saved_tensor(state, "variance", (n,), low=0.0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a table saved by :meth:`state_dict`, checked first; ``ValueError`` names the wrong key.

        Example:
            >>> import torch
            >>> t = ScoreTable(2)
            >>> try:
            ...     t.load_state_dict({**t.state_dict(), "values": torch.tensor([1.0, float("inf")])})
            ... except ValueError as e:
            ...     print(str(e).split(":")[0])
            state_dict['values'] must be a float tensor of shape (2,) with finite values or NaN
        """
        state = self._check_state(state)
        values = check_saved_tensor(state, "values", (self.rows,))
        var = self._saved_variance(state, self.rows)
        nonfinite = state.get("nonfinite", 0)
        if isinstance(nonfinite, bool) or not isinstance(nonfinite, int) or nonfinite < 0:
            raise ValueError(f"state_dict['nonfinite'] must be an int >= 0, got {nonfinite!r}")
        self._pending, self._pending_n = [], 0
        dev = self._values.device
        if var is not None and self._var is not None:
            self._var = torch.cat([var.to(dev, torch.float32), self._var[-1:]])
        self._values = torch.cat([values.to(dev, torch.float32), self._values[-1:]])
        # Every process loads the same table, so a merge takes only what each writes from now on
        # (treating the loaded scores as written would average them into fresh losses).
        self._written = torch.zeros(self.rows + 1, dtype=torch.bool, device=dev)
        self._nonfinite = torch.tensor(nonfinite, device=dev)
        self.version += 1


def _last_writes(slot: Tensor, new: Tensor) -> tuple[Tensor, Tensor]:
    """The writes sorted by slot, each carrying its slot's last value (no host sync), so a scatter that
    applies repeated slots in any order writes the same.

    Example:
        >>> slot, new = _last_writes(torch.tensor([3, 1, 3]), torch.tensor([1.0, 2.0, 5.0]))
        >>> slot.tolist(), new.tolist()
        ([1, 3, 3], [2.0, 5.0, 5.0])
    """
    ordered, order = torch.sort(slot, stable=True)
    last = order.index_select(0, torch.searchsorted(ordered, ordered, right=True) - 1)
    return ordered, new.index_select(0, last)


def _unchanged(idx: Tensor, loss: Tensor, idx_version: int, loss_version: int) -> tuple[Tensor, Tensor]:
    """A queued write's ``(idx, loss)``, refused if either was modified in place since it was queued."""
    if (idx._version, loss._version) != (idx_version, loss_version):
        raise RuntimeError(
            "a loss or indices tensor passed to update() was modified in place before its scores "
            "were stored: modify a copy (e.g. loss = loss.clone()) after calling update()"
        )
    return idx, loss
