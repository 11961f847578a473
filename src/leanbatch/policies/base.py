"""What every policy shares: the :class:`Plan`, the :class:`Policy` protocol and the drawing tools.

A plan says which dataset indices are served this epoch and with which loss
weight. Policies are small, pure and vectorised (no Python loop over samples).
The order in which kept samples are served is not part of the plan: the sampler
shuffles lazily with a keyed permutation (see :mod:`leanbatch.sampler`).

Rescaled policies drop each candidate independently with a known probability
``q`` (:func:`drop_mask`) and give every kept candidate the exact inverse of its
inclusion probability, ``1 / (1 - q)``, as loss weight, so the expected weighted
loss over the plan's randomness equals the full-data loss. Drop decisions compare
uniform 32-bit integers with a cut, so ``q`` is exactly ``m / 2**32`` and the weight
is its exact inverse (rounded once, to float32). No plan is ever empty: when every
sample could be dropped, the draw is conditioned on keeping at least one and the
weight is the inverse of the conditional inclusion probability,
``(1 - q**n) / (1 - q)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

__all__ = [
    "Plan",
    "Policy",
    "full_plan",
    "pruning_epochs",
    "check_epochs",
    "check_ratio",
    "drop_mask",
    "plan_from_drop",
    "plan_from_keep",
    "mean_score",
    "weights_where",
]

_SCALE = 1 << 32  # drop probabilities are multiples of 2**-32
_CHUNK = 1 << 20  # samples per chunk of random draws and index building


@dataclass(frozen=True)
class Plan:
    """One epoch's plan.

    Attributes:
        epoch: the epoch it was made for.
        num_samples: dataset size N.
        kept: sorted int32/int64 dataset indices served this epoch, or ``None`` for all N.
        weights: float32 (N,) loss weight per dataset index, or ``None`` for all 1.
        threshold: the pruning threshold (mean score) or ``None`` when not pruning.
        pruning: whether this epoch prunes.

    Example:
        >>> p = full_plan(0, 10)
        >>> p.num_kept, p.num_pruned, p.weights is None
        (10, 0, True)
    """

    epoch: int
    num_samples: int
    kept: Tensor | None
    weights: Tensor | None
    threshold: float | None
    pruning: bool

    @property
    def num_kept(self) -> int:
        """Samples served this epoch."""
        return self.num_samples if self.kept is None else int(self.kept.numel())

    @property
    def num_pruned(self) -> int:
        """Samples skipped this epoch."""
        return self.num_samples - self.num_kept


class Policy(Protocol):
    """What the sampler calls once per epoch: ``policy(scores, epoch, generator) -> Plan``.

    Two optional hooks, for policies that read more of the score table than its values:
    ``score_table_options() -> dict`` (the ``ScoreTable`` keyword arguments the rule needs,
    e.g. ``{"ema": 0.9, "variance": True}``; :class:`~leanbatch.InfoBatch` builds its table
    with them) and ``bind(table)`` (``PrunedSampler`` calls it once with its table; it may
    refuse a table that lacks what the rule ranks by). See :class:`~leanbatch.UCBPolicy`.
    """

    num_epochs: int

    def __call__(self, scores: Tensor, epoch: int, generator: torch.Generator) -> Plan: ...


def full_plan(epoch: int, num_samples: int) -> Plan:
    """Every sample, weight exactly 1.

    Example:
        >>> full_plan(3, 5).kept is None
        True
    """
    return Plan(epoch, num_samples, None, None, None, False)


def pruning_epochs(num_epochs: int, delta: float) -> int:
    """Number of leading epochs that prune: ``floor(delta * num_epochs)``.

    Example:
        >>> pruning_epochs(10, 0.875), pruning_epochs(8, 0.875)
        (8, 7)
    """
    return math.floor(delta * num_epochs + 1e-9)


def check_epochs(num_epochs: object, delta: object) -> None:
    """Raise ``ValueError`` naming ``num_epochs`` or ``delta`` unless both are valid.

    Example:
        >>> check_epochs(8, 0.875)
        >>> try:
        ...     check_epochs(8, 0.0)
        ... except ValueError as e:
        ...     print(str(e).split(":")[0])
        delta must be in (0, 1], got 0.0
    """
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be an int >= 1, got {num_epochs!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (0.0 < delta <= 1.0):
        raise ValueError(
            f"delta must be in (0, 1], got {delta!r}: epochs at or after delta * num_epochs train on "
            "all data (0.875 is InfoBatch's default)"
        )


def check_ratio(value: object, name: str, meaning: str, low_open: bool = False) -> float:
    """``value`` as a float in [0, 1) (or (0, 1) with ``low_open``); ``ValueError`` naming ``name``.

    Example:
        >>> check_ratio(0.3, "prune_ratio", "the share pruned")
        0.3
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    v = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not ok or not (0.0 <= v < 1.0) or (low_open and v == 0.0):
        interval = "(0, 1)" if low_open else "[0, 1)"
        raise ValueError(f"{name} must be in {interval}, got {value!r}: {meaning}")
    return v


def _check_common(prune_ratio: float, num_epochs: int, delta: float) -> None:
    check_epochs(num_epochs, delta)
    check_ratio(
        prune_ratio,
        "prune_ratio",
        "it is the fraction of well-learned samples dropped per epoch (0.5 is the paper's default)",
    )


def drop_mask(candidates: Tensor, q: float, generator: torch.Generator) -> tuple[Tensor, float]:
    """Drop each candidate with probability ``q' = m / 2**32`` (m = round(q * 2**32)), never all.

    Returns the drop mask and the weight of a kept candidate: the exact inverse of its
    inclusion probability. When every sample is a candidate, an epoch with nothing kept is
    not allowed: the draw is conditioned on keeping at least one (an all-dropped draw is
    replaced by one from the conditional distribution, see :func:`_redraw_nonempty`), which
    makes the inclusion probability ``(1 - q') / (1 - q'**n)`` and the weight its inverse.

    Draws are full-range 64-bit integers read as two uniform int32 each, made in chunks into
    one reused buffer (a fresh array per epoch would cost a page fault per 4 KiB): about half
    the time of ``torch.randint`` for the same stream length.

    Example:
        >>> import torch
        >>> drop, w = drop_mask(torch.tensor([True, True, False]), 0.5, torch.Generator().manual_seed(0))
        >>> bool(drop[2]), w      # non-candidates are never dropped; kept candidates weigh 1 / (1 - 0.5)
        (False, 2.0)
    """
    n = candidates.numel()
    m = min(max(round(q * _SCALE), 0), _SCALE - 1)
    cut = m - (1 << 31)  # uniform int32 v: P(v < cut) = m / 2**32 exactly
    drop = torch.empty(n, dtype=torch.bool)
    draws = torch.empty((min(n, _CHUNK) + 1) // 2, dtype=torch.int64)
    draws32 = draws.view(torch.int32)
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        draws.random_(-(1 << 63), None, generator=generator)
        torch.lt(draws32[: stop - start], cut, out=drop[start:stop])
    drop &= candidates
    q_exact = m / _SCALE
    num_candidates = int(torch.count_nonzero(candidates))
    if num_candidates < n or m == 0:  # something is always kept: no conditioning needed
        return drop, _SCALE / (_SCALE - m)
    p_empty = q_exact**n
    if p_empty == 0.0:  # an all-dropped draw is impossible in float64 terms: the plain weight
        return drop, _SCALE / (_SCALE - m)
    if bool(drop.all()):
        _redraw_nonempty(drop, q_exact, p_empty, generator)
    return drop, (1.0 - p_empty) / (1.0 - q_exact)


def _redraw_nonempty(drop: Tensor, q: float, p_empty: float, generator: torch.Generator) -> None:
    """Overwrite ``drop`` (all True) with a draw of i.i.d. drops conditioned on keeping one.

    The first kept position ``j`` follows a geometric law truncated to ``[0, n)``:
    ``P(j) = q**j (1 - q) / (1 - q**n)``, drawn by inverting its CDF; positions before it are
    dropped and those after it are drawn independently as usual. Together this is exactly the
    conditional distribution, so rejection sampling is not needed.
    """
    n = drop.numel()
    u = float(torch.rand((), dtype=torch.float64, generator=generator))
    j = min(n - 1, int(math.floor(math.log1p(-u * (1.0 - p_empty)) / math.log(q)))) if q > 0 else 0
    drop[j] = False
    if j + 1 < n:
        rest = torch.rand(n - j - 1, dtype=torch.float64, generator=generator)
        torch.lt(rest, q, out=drop[j + 1 :])


def plan_from_drop(epoch: int, drop: Tensor, weights: Tensor | None, threshold: float | None) -> Plan:
    """A pruning plan keeping the samples not dropped (``drop`` is consumed: negated in place).

    The kept indices are sorted, int32 when they fit, built chunk by chunk.

    Example:
        >>> import torch
        >>> plan_from_drop(2, torch.tensor([True, False, False, True]), None, None).kept.tolist()
        [1, 2]
    """
    n = drop.numel()
    keep = drop.logical_not_()
    kept = torch.empty(int(torch.count_nonzero(keep)), dtype=torch.int32 if n < 2**31 else torch.int64)
    pos = 0
    for start in range(0, n, _CHUNK):
        part = torch.nonzero(keep[start : start + _CHUNK]).squeeze(1)  # int64 only per chunk
        out = kept[pos : pos + part.numel()]
        out.copy_(part)
        out += start
        pos += part.numel()
    return Plan(epoch, n, kept, weights, threshold, True)


def weights_where(mask: Tensor, w: float) -> Tensor:
    """float32 weights: ``w`` where ``mask``, 1 elsewhere; ``w`` (>= 1) rounded once, exactly as float32(w).

    Example:
        >>> import torch
        >>> weights_where(torch.tensor([True, False]), 2.0).tolist()
        [2.0, 1.0]
    """
    return mask.to(torch.float32).mul_(w).clamp_(min=1.0)


def plan_from_keep(
    epoch: int, keep: Tensor, weights: Tensor | None = None, threshold: float | None = None
) -> Plan:
    """A pruning plan serving the samples where the bool mask ``keep`` is True (at least one).

    Example:
        >>> import torch
        >>> plan_from_keep(0, torch.tensor([False, True, True])).kept.tolist()
        [1, 2]
    """
    return plan_from_drop(epoch, keep.logical_not(), weights, threshold)


def mean_score(scores: Tensor) -> tuple[float | None, int]:
    """Mean of the scored entries and their count (scores hold finite losses or NaN).

    Example:
        >>> import torch
        >>> mean_score(torch.tensor([1.0, float("nan"), 3.0]))
        (2.0, 2)
    """
    count = scores.numel() - int(torch.count_nonzero(torch.isnan(scores)))
    if count == 0:
        return None, 0
    return float(scores.nansum()) / count, count
