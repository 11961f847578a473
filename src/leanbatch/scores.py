"""The score table: one float32 score (the last observed loss) per dataset index.

Every method in leanbatch reads and writes per-sample losses keyed by dataset
index. This module keeps them. ``NaN`` marks "never scored"; non-finite losses
are skipped and counted, never stored, so a score is either a real loss or NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from leanbatch.checks import check_per_sample_loss
from leanbatch.rng import gather_step, is_distributed, mean_of_writers, same_group, world_size
from leanbatch.slices import Slice

if TYPE_CHECKING:
    from leanbatch.carrier import ScoreCarrier

__all__ = ["ScoreTable", "check_per_sample_loss"]


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

    With ``world=W, rank=r`` (sharded scores, see :mod:`leanbatch.slices`) the table holds the
    rows rank ``r`` owns, the indices ``i % W == r``: :attr:`values` is that slice (local row
    ``j`` is index ``r + j * W``). Indices stay global everywhere else; a row of another rank is
    not stored (``store(across=True)`` gathers every rank's rows, so each owner stores its own).

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
        *,
        world: int = 1,
        rank: int = 0,
    ):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        if ema is not None and not (isinstance(ema, (int, float)) and 0.0 <= float(ema) < 1.0):
            raise ValueError(f"ema must be None or a float in [0, 1), got {ema!r}")
        if not isinstance(variance, bool):
            raise TypeError(f"variance must be a bool, got {variance!r}")
        if variance and ema is None:
            raise ValueError(
                "variance=True keeps an exponentially weighted variance of the losses, which needs the EMA "
                "momentum: pass ema= as well (e.g. ScoreTable(n, ema=0.9, variance=True))"
            )
        self.num_samples = num_samples
        self.slice = Slice(num_samples, world, rank)  # the rows this table holds
        size = self.slice.size
        self.ema = None if ema is None else float(ema)
        self._follow_device = device is None
        self.flush_every = 8192
        # Queued writes: calls giving (indices, losses) when flushed: references, not copies (see
        # store), checked against their version counters; or a gather from every rank, awaited.
        self._pending: list[Callable[[], tuple[Tensor, Tensor]]] = []
        self._pending_shared = False  # the queued writes were gathered from every rank (merged)
        self._pending_n = 0
        dev = torch.device("cpu") if device is None else torch.device(device)
        # One slot past the end takes the writes of non-finite losses (see flush): never read.
        self._values = torch.full((size + 1,), float("nan"), dtype=torch.float32, device=dev)
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=dev)
        # EMA variance (optional), same layout as _values (the spare slot included).
        self._var: Tensor | None = torch.full_like(self._values, float("nan")) if variance else None
        self._touched: Tensor | None = None  # distributed: what this rank wrote since the last sync
        self._unmerged = False  # this process stored losses no other rank has seen
        self._numbers: Tensor | None = None  # flush scratch: 0, 1, 2, ... and -1, -1, ... (int32)
        self._carrier: ScoreCarrier | None = None  # sends gathered rows inside DDP's all-reduce

    def __getstate__(self) -> dict[str, Any]:
        self.flush()  # queued writes hold references and version counters that a copy would not keep
        return dict(self.__dict__, _numbers=None, _carrier=None)  # scratch and a live hook, not state

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
            self._values = self._values.to(device, non_blocking=True)
            self._nonfinite = self._nonfinite.to(device, non_blocking=True)
            if self._var is not None:
                self._var = self._var.to(device, non_blocking=True)
            if self._touched is not None:
                self._touched = self._touched.to(device, non_blocking=True)
            self._numbers = None  # scratch: made afresh on the new device
        return self

    def _index(self, indices: Tensor) -> Tensor:
        if indices.device != self._values.device:
            indices = indices.to(self._values.device, non_blocking=True)
        if indices.dtype != torch.int64:
            indices = indices.long()
        return indices

    # ------------------------------------------------------------------ core
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

    def store(
        self, indices: Tensor, losses: Tensor, check: bool = True, *, across: bool = False, group: Any = None
    ) -> Tensor:
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

        ``across=True`` in a distributed run: every rank of ``group`` stores every rank's rows of
        this step (one all-gather of :func:`~leanbatch.rng.gather_step`, or carried in DDP's
        gradient all-reduce after :meth:`send_with`; the same number of rows on every rank), in
        rank order, so every rank holds the same table at every flush and nothing is left to
        merge. The rows travel while the caller goes on (its backward pass); the flush waits.
        """
        if self._follow_device and losses.device != self._values.device:
            self.to(losses.device)
        idx = self._index(indices)
        if check:
            self.check_indices(idx)
        loss = losses.detach()
        shared = across and is_distributed(group)
        if shared != self._pending_shared:
            self.flush()  # gathered and local writes are flushed apart (only local ones await a merge)
            self._pending_shared = shared
        elif self._pending_n >= self.flush_every or (self.ema is not None and self._pending):
            self.flush()  # before queuing this step: its rows may still be on their way (a carrier)
        self._unmerged = self._unmerged or not shared
        self._pending.append(self._send(idx, loss, group) if shared else _unchanged(idx, loss))
        self._pending_n += idx.shape[0] * (world_size(group) if shared else 1)
        return idx

    def _send(self, idx: Tensor, loss: Tensor, group: Any) -> Callable[[], tuple[Tensor, Tensor]]:
        """Start sending a step's rows to every rank: with the carrier when it serves ``group``."""
        if self._carrier is not None and same_group(self._carrier.group, group):
            return self._carrier.post(idx, loss)
        return gather_step(idx, loss, group)

    def send_with(self, carrier: ScoreCarrier | None) -> None:
        """Send ``store(across=True)``'s rows with ``carrier`` (inside DDP's gradient all-reduce, see
        :class:`~leanbatch.carrier.ScoreCarrier`); ``None``: by an all-gather. Every rank alike.

        Example:
            >>> t = ScoreTable(4)
            >>> t.send_with(None)   # the default: one all-gather a step in a distributed run
        """
        self.flush()
        self._carrier = carrier

    @property
    def carrier(self) -> ScoreCarrier | None:
        """What ``store(across=True)``'s rows are sent with (:meth:`send_with`); ``None``: an all-gather."""
        return self._carrier

    def flush(self) -> None:
        """Write the queued losses into the table (skipping and counting non-finite ones).

        When one index was queued several times, its last finite loss wins (a non-finite one
        never replaces a score). The same vectorised code runs on every device: no boolean
        masks, no value read on the host, and every write of a repeated index carries the same
        value, so the result does not depend on the order a parallel scatter applies them.
        """
        pending = self._pending
        if not pending:
            return
        self._pending, self._pending_n = [], 0
        rows = [queued() for queued in pending]
        if len(rows) == 1:
            idx, new = rows[0]
        else:
            idx, new = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        idx = idx.to(self._values.device, non_blocking=True)
        step = 1 << 23  # bounded scratch (see _last_write); parts apply in order
        for start in range(0, idx.numel(), step):
            self._write(idx[start : start + step], new[start : start + step])

    def _write(self, idx: Tensor, new: Tensor) -> None:
        values = self._values
        new = new.to(values.device, torch.float32, non_blocking=True)
        finite = new.abs() < float("inf")  # False for NaN and +-Inf; cheaper than isfinite
        self._nonfinite += finite.numel() - torch.count_nonzero(finite)
        # Non-finite losses (and rows another rank owns) go to the spare slot instead: no boolean mask.
        if self.slice.world == 1:
            dest = torch.where(finite, idx, self.num_samples)
        else:
            mine = finite & (idx % self.slice.world == self.slice.rank) & (idx < self.num_samples)
            dest = torch.where(mine, torch.div(idx, self.slice.world, rounding_mode="floor"), self.slice.size)
        var = None
        if self.ema is not None:  # flushed every step (see store): blended with the stored score
            m = self.ema
            old = values.index_select(0, dest)
            unseen = torch.isnan(old)
            if self._var is not None:  # Finch's EMA variance, from the deviation to the old mean
                d = new - old
                var = torch.where(unseen, 0.0, (self._var.index_select(0, dest) + (1.0 - m) * d * d) * m)
            new = torch.where(unseen, new, old * m + new * (1.0 - m))
        # Every write of one slot carries the same value, so scatter's order does not matter; every
        # slot written holds at least one finite loss (the others went to the spare slot).
        last = self._last_write(dest)
        values.scatter_(0, dest, new.index_select(0, last))
        if var is not None and self._var is not None:
            self._var.scatter_(0, dest, var.index_select(0, last))
        if self._touched is not None and not self._pending_shared:
            self._touched.index_fill_(0, dest, True)

    def _last_write(self, dest: Tensor) -> Tensor:
        """For each queued write, the position in this flush of the last write to the same slot.

        The table's own slots are the scratch, read as int32: the slots written now are set to
        -1, then ``scatter_reduce`` with ``amax`` leaves in each the highest position that wrote
        it, the same whatever order a parallel device applies the writes in; reading them back
        tells every write which value its slot ends with. The caller then overwrites every
        written slot, so nothing of the scratch remains, and no memory is added per sample.
        Returns int32 positions.
        """
        m, dev = dest.numel(), dest.device
        numbers = self._numbers  # row 0: 0, 1, 2, ...; row 1: -1, -1, ...
        if numbers is None or numbers.shape[1] < m or numbers.device != dev:
            size = max(m, min(2 * self.flush_every, 1 << 16))
            numbers = torch.stack([torch.arange(size), torch.full((size,), -1)]).to(dev, torch.int32)
            if size <= 1 << 16:  # keep the usual size; a one-off large flush does not stay
                self._numbers = numbers
        slots = self._values.view(torch.int32)
        slots.scatter_(0, dest, numbers[1, :m])
        slots.scatter_reduce_(0, dest, numbers[0, :m], "amax")
        return slots.index_select(0, dest)

    @property
    def values(self) -> Tensor:
        """The scores, float32 (num_samples,) (sharded: this rank's rows), NaN where never scored."""
        self.flush()
        return self._values[: self.slice.size]

    @property
    def variances(self) -> Tensor:
        """The EMA variances, float32 (num_samples,), NaN where never scored (``variance=True`` only)."""
        if self._var is None:
            raise AttributeError(
                "this table keeps no variance: build it with ScoreTable(n, ema=m, variance=True)"
            )
        self.flush()
        return self._var[: self.slice.size]

    @property
    def tracks_variance(self) -> bool:
        """Whether the table keeps an EMA variance per sample."""
        return self._var is not None

    def get(self, indices: Tensor) -> Tensor:
        """Scores of ``indices`` (NaN where never scored)."""
        idx = self._index(indices)
        self.check_indices(idx)
        if self.slice.world > 1 and idx.device.type == "cpu" and not bool(self.slice.owns(idx).all()):
            raise IndexError(f"indices of another rank: this table holds those of rank {self.slice.rank}")
        return self.values[self.slice.local_rows(idx)]

    @property
    def nonfinite_count(self) -> Tensor:
        """Number of non-finite losses skipped so far (a 0-d tensor; reading it syncs on CUDA)."""
        self.flush()
        return self._nonfinite

    def num_scored(self) -> int:
        """How many indices hold a score (syncs; not for the per-step path)."""
        return int((~torch.isnan(self.values)).sum())

    def sync(self, group: Any = None) -> None:
        """Merge what every rank of ``group`` wrote since the last sync (a collective).

        Each rank contributes the scores it wrote; an index written by several ranks
        gets their mean. No-op outside an initialised process group of size > 1.
        """
        if not is_distributed(group):
            return
        if self.slice.world > 1:  # sharded: each owner stores its own rows; nothing to merge
            self._unmerged = False
            return
        self.flush()  # queued writes mark what they touch
        if self._touched is None:  # first sync: everything this rank scored counts
            self._touched = torch.cat(
                [~torch.isnan(self.values), self._values.new_zeros(1, dtype=torch.bool)]
            )
        var = self.variances if self._var is not None else None  # averaged over the writers too
        merged, merged_var = mean_of_writers(self.values, self._touched[: self.num_samples], var, group)
        if var is not None and merged_var is not None:
            var.copy_(merged_var)
        self.values.copy_(merged)
        self._touched = torch.zeros_like(self._touched)
        self._unmerged = False

    @property
    def unmerged(self) -> bool:
        """Whether this process stored losses since the last merge across ranks (or load)."""
        return self._unmerged or bool(self._pending)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``); sharded: this
        rank's rows, with ``world`` and ``rank``."""
        state = {
            "num_samples": self.num_samples,
            "ema": self.ema,
            "values": self.values.detach().cpu().clone(),
            "nonfinite": int(self.nonfinite_count),
            "variance": None if self._var is None else self.variances.detach().cpu().clone(),
        }
        if self.slice.world > 1:
            state.update(world=self.slice.world, rank=self.slice.rank)
        return state

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
        from leanbatch.state import score_state  # validation of a loaded state

        values, var, nonfinite = score_state(state, self)
        self._pending, self._pending_n = [], 0
        self._unmerged = False
        if var is not None and self._var is not None:
            self._var = torch.cat([var.to(self._var.device, torch.float32), self._var[-1:]])
        self._values = torch.cat([values.to(self._values.device, torch.float32), self._values[-1:]])
        # Every rank loads the same table, so the next merge takes only what each rank writes from
        # now on (treating the loaded scores as written would average them into fresh losses).
        self._touched = torch.zeros(self.slice.size + 1, dtype=torch.bool, device=self._values.device)
        self._nonfinite = torch.tensor(nonfinite, device=self._values.device)


def _unchanged(idx: Tensor, loss: Tensor) -> Callable[[], tuple[Tensor, Tensor]]:
    """A queued local write: ``(idx, loss)`` when flushed, refused if either was modified in place."""
    versions = idx._version, loss._version

    def result() -> tuple[Tensor, Tensor]:
        if (idx._version, loss._version) != versions:
            raise RuntimeError(
                "a loss or indices tensor passed to update() was modified in place before its scores "
                "were stored: modify a copy (e.g. loss = loss.clone()) after calling update()"
            )
        return idx, loss

    return result
