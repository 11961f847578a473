"""What a run counts, epoch by epoch (:class:`Tally`: an
:class:`~leanbatch.engine.judging.records.EpochRecord`'s counts, from the arm's data wrapper and
selection hook, never from the task), and a pruning arm's loss histograms: for a few of its epochs,
the per-sample scores the epoch was planned from.

Example:
    >>> import torch
    >>> h = histogram(torch.tensor([0.1, 1.0, float("nan")]), 0.5, epoch=2, bins=4)
    >>> h["num_scored"], h["below_threshold"], sum(h["counts"])
    (2, 1, 2)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from leanbatch import InfoBatch
from leanbatch.engine.running.data import CountedInfoBatch
from leanbatch.ranks import world_size

__all__ = ["Tally", "histogram", "served", "snapshot_epochs"]


def histogram(values: Tensor, threshold: float | None, epoch: int, bins: int = 60) -> dict[str, Any]:
    """Log-spaced histogram of the finite scores (for the report's loss-histogram plot)."""
    v = values.detach().float().cpu()
    v = v[torch.isfinite(v)]
    lo = max(float(v.min()) if v.numel() else 1e-6, 1e-6)
    hi = max(float(v.max()) if v.numel() else 1.0, lo * 10)
    edges = torch.logspace(math.log10(lo), math.log10(hi), bins + 1)
    counts = torch.histc(v.clamp(lo, hi).log10(), bins=bins, min=math.log10(lo), max=math.log10(hi))
    return {
        "epoch": epoch,
        "threshold": threshold,
        "num_scored": int(v.numel()),
        "below_threshold": None if threshold is None else int((v < threshold).sum()),
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
    }


def snapshot_epochs(policy: Any, epochs: int) -> set[int]:
    """Pruning epochs (first, middle, last) whose planning scores are kept: among epochs 1 to the
    policy's last pruning epoch (epoch 0 plans from no scores).

    Example:
        >>> from leanbatch import InfoBatchPolicy
        >>> snapshot_epochs(InfoBatchPolicy(0.5, 8, 0.875), 8), snapshot_epochs(None, 8)
        ({1, 3, 6}, set())
    """
    if policy is None:
        return set()
    last = min(int(math.floor(float(getattr(policy, "delta", 1.0)) * epochs)), epochs) - 1
    return set() if last < 1 else {1, 1 + (last - 1) // 2, last}


def served(data: Any, limited: bool) -> int:
    """Samples ``data`` (an arm's) served so far, this process's; a framework's budget arm, stopped
    inside an epoch (``limited``): what it trained.
    """
    if isinstance(data, CountedInfoBatch) and data.budget is not None:
        return sum(data.served.values())
    if isinstance(data, InfoBatch) and not limited:  # its plans count every process's samples
        return sum(math.ceil(int(s["kept"]) / world_size()) for s in data.epoch_stats)
    return 0 if data is None else int(data.counts.rows)


class Tally:
    """A run's counts since its last ``run.log`` (:meth:`epoch`), their totals, and the histograms.

    Example:
        >>> t = Tally()
        >>> t.epoch(None, None, False)["steps"], t.totals["steps"]
        (0, 0)
    """

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}  # every epoch's counts, the steps after the last run.log too
        self.histograms: list[dict[str, Any]] = []
        self._seen = (0, 0, 0, 0, 0)  # served, steps, rows, scored, skipped at the last count
        self._snapshot: Tensor | None = None  # the scores the next epoch is planned from

    def epoch(self, data: Any, stats: Any, limited: bool) -> dict[str, int]:
        """The counts of ``data`` (the arm's) and ``stats`` (its selector's) since the last call."""
        now = (
            served(data, limited),
            0 if data is None else data.counts.steps,
            0 if data is None else data.counts.rows,
            0 if stats is None else stats.forwarded,
            0 if stats is None else stats.skipped,
        )
        n_served, steps, rows, scored, skipped = (a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        trained = rows - skipped
        counts = dict(
            steps=steps, loaded=n_served, forwarded=trained, select_forwarded=scored,
            backpropagated=trained, dropped=max(0, n_served - rows),
        )  # fmt: skip
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + v
        return counts

    def plans(self, data: Any, policy: Any) -> tuple[float | None, bool | None]:
        """A pruning arm's latest plan (its threshold, whether it pruned); a histogram of the scores it
        was planned from when the epoch before kept them, and the scores of the next when it is one of
        :func:`snapshot_epochs`. ``(None, None)`` for the others (``policy`` None)."""
        if policy is None or not isinstance(data, InfoBatch) or not data.epoch_stats:
            return None, None
        stats = data.epoch_stats[-1]
        if self._snapshot is not None:
            self.histograms.append(histogram(self._snapshot, stats["threshold"], stats["epoch"]))
            self._snapshot = None
        if stats["epoch"] + 1 in snapshot_epochs(policy, data.num_epochs):
            self._snapshot = data.scores.values.detach().clone()
        return stats["threshold"], bool(stats["pruning"])
