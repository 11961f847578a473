"""The per-sample loss histograms of a pruning arm: the scores a few epochs were planned from.

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

__all__ = ["histogram", "snapshot_epochs"]


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


def snapshot_epochs(policy: Any, epochs: int, count: int = 3) -> set[int]:
    """Pruning epochs (first, middle, last) whose planning scores are kept: among epochs 1 to the
    policy's last pruning epoch (epoch 0 plans from no scores).

    Example:
        >>> from leanbatch import InfoBatchPolicy
        >>> snapshot_epochs(InfoBatchPolicy(0.5, 8, 0.875), 8), snapshot_epochs(None, 8)
        ({1, 3, 6}, set())
    """
    if policy is None or count <= 0:
        return set()
    last = min(int(math.floor(float(getattr(policy, "delta", 1.0)) * epochs)), epochs) - 1
    if last < 1:
        return set()
    if count == 1:
        return {last}
    return {p for k in range(count) if 1 <= (p := 1 + (k * (last - 1)) // (count - 1)) <= last}
