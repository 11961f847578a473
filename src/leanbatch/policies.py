"""Pruning policies: (scores, epoch, generator) -> the epoch's plan.

A plan says which dataset indices are served this epoch and with which loss
weight. Policies are small, pure and vectorised (no Python loop over samples).
The order in which kept samples are served is not part of the plan: the sampler
shuffles lazily with a keyed permutation (see :mod:`leanbatch.sampler`).

Both policies drop each sample independently with a known probability ``q`` and
give every kept sample the exact inverse of its inclusion probability,
``1 / (1 - q)``, as loss weight, so the expected weighted loss over the plan's
randomness equals the full-data loss. Drop decisions compare uniform 32-bit
integers with a cut, so ``q`` is exactly ``m / 2**32`` and the weight is its exact
inverse (rounded once, to float32). No plan is ever empty: when every sample could
be dropped, the draw is conditioned on keeping at least one and the weight is the
inverse of the conditional inclusion probability, ``(1 - q**n) / (1 - q)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

__all__ = ["Plan", "Policy", "InfoBatchPolicy", "RandomPolicy", "full_plan", "pruning_epochs"]

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
    """What the sampler calls once per epoch."""

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


def _check_common(prune_ratio: float, num_epochs: int, delta: float) -> None:
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be an int >= 1, got {num_epochs!r}")
    if not isinstance(prune_ratio, (int, float)) or not (0.0 <= prune_ratio < 1.0):
        raise ValueError(
            f"prune_ratio must be in [0, 1), got {prune_ratio!r}: it is the fraction of well-learned "
            "samples dropped per epoch (0.5 is the paper's default)"
        )
    if not isinstance(delta, (int, float)) or not (0.0 < delta <= 1.0):
        raise ValueError(
            f"delta must be in (0, 1], got {delta!r}: epochs at or after delta * num_epochs train on "
            "all data (0.875 is the paper's default)"
        )


def _drop_mask(candidates: Tensor, q: float, generator: torch.Generator) -> tuple[Tensor, float, float]:
    """Drop each candidate with probability ``q' = m / 2**32`` (m = round(q * 2**32)), never all.

    Returns the drop mask and the weight of a kept candidate: the exact inverse of its
    inclusion probability. When every sample is a candidate, an epoch with nothing kept is
    not allowed: the draw is conditioned on keeping at least one (an all-dropped draw is
    replaced by one from the conditional distribution, see :func:`_redraw_nonempty`), which
    makes the inclusion probability ``(1 - q') / (1 - q'**n)`` and the weight its inverse
    (when ``q'**n < 2**-40`` that equals ``1 / (1 - q')`` at float32 precision, and the
    candidates are not even counted). Returns ``(drop, weight, q')``; an all-dropped draw is
    replaced in :func:`_plan_from_drop`, which counts the kept samples anyway.

    Draws are full-range 64-bit integers read as two uniform int32 each, made in chunks into
    one reused buffer (a fresh array per epoch would cost a page fault per 4 KiB): about half
    the time of ``torch.randint`` for the same stream length.
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
    p_empty = q_exact**n  # the chance of keeping nothing, were every sample a candidate
    if p_empty < 2**-40 or int(torch.count_nonzero(candidates)) < n:  # negligible, or something always kept
        return drop, _SCALE / (_SCALE - m), q_exact
    return drop, (1.0 - p_empty) / (1.0 - q_exact), q_exact


def _redraw_nonempty(drop: Tensor, q: float, generator: torch.Generator) -> None:
    """Overwrite ``drop`` (all True) with a draw of i.i.d. drops conditioned on keeping one.

    The first kept position ``j`` follows a geometric law truncated to ``[0, n)``:
    ``P(j) = q**j (1 - q) / (1 - q**n)``, drawn by inverting its CDF; positions before it are
    dropped and those after it are drawn independently as usual. Together this is exactly the
    conditional distribution, so rejection sampling is not needed.
    """
    n = drop.numel()
    p_empty = q**n
    u = float(torch.rand((), dtype=torch.float64, generator=generator))
    j = min(n - 1, int(math.floor(math.log1p(-u * (1.0 - p_empty)) / math.log(q)))) if q > 0 else 0
    drop[j] = False
    if j + 1 < n:
        rest = torch.rand(n - j - 1, dtype=torch.float64, generator=generator)
        torch.lt(rest, q, out=drop[j + 1 :])


def _plan_from_drop(
    epoch: int, drop: Tensor, weights: Tensor, threshold: float | None, q: float, generator: torch.Generator
) -> Plan:
    """The sorted indices of the samples not dropped, int32 when they fit, built chunk by chunk.

    A draw that dropped everything (possible only when every sample was a candidate) is
    replaced by one conditioned on keeping at least one (see :func:`_drop_mask`).
    """
    n = drop.numel()
    count = int(torch.count_nonzero(drop.logical_not_()))
    keep = drop
    if count == 0:
        _redraw_nonempty(keep.logical_not_(), q, generator)
        count = int(torch.count_nonzero(keep.logical_not_()))
    kept = torch.empty(count, dtype=torch.int32 if n < 2**31 else torch.int64)
    pos = 0
    for start in range(0, n, _CHUNK):
        part = torch.nonzero(keep[start : start + _CHUNK]).squeeze(1)  # int64 only per chunk
        out = kept[pos : pos + part.numel()]
        out.copy_(part)
        out += start
        pos += part.numel()
    return Plan(epoch, n, kept, weights, threshold, True)


def _weights(mask: Tensor, w: float) -> Tensor:
    """float32 weights: ``w`` where ``mask``, 1 elsewhere; ``w`` (>= 1) rounded once, exactly as float32(w)."""
    return mask.to(torch.float32).mul_(w).clamp_(min=1.0)


def _threshold(scores: Tensor) -> tuple[float | None, int]:
    """Mean of the scored entries and their count (scores hold finite losses or NaN)."""
    count = scores.numel() - int(torch.count_nonzero(torch.isnan(scores)))
    if count == 0:
        return None, 0
    return float(scores.nansum()) / count, count


@dataclass
class InfoBatchPolicy:
    """InfoBatch (Qin et al., ICLR 2024): prune well-learned samples at random.

    Epoch ``e`` prunes iff ``e < floor(delta * num_epochs)``. The threshold is the
    mean of the scored samples; of the samples strictly below it, each is dropped
    with probability ``prune_ratio`` and, if kept, weighted by the exact inverse
    of its inclusion probability. Samples at or above the mean, and samples never
    scored, are always kept with weight 1. Later epochs keep all, weight exactly 1.

    Example:
        >>> import torch
        >>> pol = InfoBatchPolicy(prune_ratio=0.5, num_epochs=4, delta=0.75)
        >>> scores = torch.tensor([0.1, 0.2, 3.0, 4.0])
        >>> plan = pol(scores, 0, torch.Generator().manual_seed(0))
        >>> round(plan.threshold, 4), plan.weights.tolist()
        (1.825, [2.0, 2.0, 1.0, 1.0])
        >>> pol(scores, 3, torch.Generator()).pruning   # annealing epoch
        False
    """

    prune_ratio: float = 0.5
    num_epochs: int = 1
    delta: float = 0.875

    def __post_init__(self) -> None:
        _check_common(self.prune_ratio, self.num_epochs, self.delta)

    def __call__(self, scores: Tensor, epoch: int, generator: torch.Generator) -> Plan:
        n = scores.numel()
        if epoch >= pruning_epochs(self.num_epochs, self.delta) or self.prune_ratio == 0:
            return full_plan(epoch, n)
        scores = scores.detach().to("cpu", torch.float32)
        threshold, _ = _threshold(scores)
        if threshold is None:
            return full_plan(epoch, n)
        below = scores < threshold  # NaN (never scored) compares False: always kept
        drop, w, q = _drop_mask(below, self.prune_ratio, generator)
        weights = _weights(below, w)
        del below
        return _plan_from_drop(epoch, drop, weights, threshold, q, generator)


@dataclass
class RandomPolicy:
    """Dynamic random pruning: the honest baseline for InfoBatch.

    Same expected amount of work as :class:`InfoBatchPolicy` with the same
    ``prune_ratio`` (it drops as many samples in expectation as InfoBatch would:
    ``prune_ratio`` times the number of scored samples below the mean), but chosen
    uniformly among all scored samples, with the same exact inverse-probability
    rescaling and the same annealing epochs.

    Example:
        >>> import torch
        >>> pol = RandomPolicy(prune_ratio=0.5, num_epochs=4, delta=0.75)
        >>> plan = pol(torch.tensor([0.1, 0.2, 3.0, 4.0, float("nan")]), 0, torch.Generator().manual_seed(0))
        >>> round(plan.weights[0].item(), 4), plan.weights[4].item()   # q = 0.5 * 2/4: 1 / (1 - 0.25)
        (1.3333, 1.0)
        >>> plan = pol(torch.tensor([0.1, 0.2, 3.0, 4.0]), 0, torch.Generator().manual_seed(0))
        >>> round(plan.weights[0].item(), 4)   # all 4 droppable: never empty, (1 - 0.25**4) / (1 - 0.25)
        1.3281
    """

    prune_ratio: float = 0.5
    num_epochs: int = 1
    delta: float = 0.875

    def __post_init__(self) -> None:
        _check_common(self.prune_ratio, self.num_epochs, self.delta)

    def __call__(self, scores: Tensor, epoch: int, generator: torch.Generator) -> Plan:
        n = scores.numel()
        if epoch >= pruning_epochs(self.num_epochs, self.delta) or self.prune_ratio == 0:
            return full_plan(epoch, n)
        scores = scores.detach().to("cpu", torch.float32)
        threshold, num_scored = _threshold(scores)
        if threshold is None:
            return full_plan(epoch, n)
        num_below = int(torch.count_nonzero(scores < threshold))
        q = self.prune_ratio * num_below / num_scored
        scored = ~torch.isnan(scores)
        drop, w, q_exact = _drop_mask(scored, q, generator)
        weights = _weights(scored, w)
        del scored
        return _plan_from_drop(epoch, drop, weights, threshold, q_exact, generator)
