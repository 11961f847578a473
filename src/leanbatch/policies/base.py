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
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from leanbatch.checks import check_epochs, check_ratio, check_saved_tensor

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
    _on_device: dict[torch.device, Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_kept(self) -> int:
        """Samples served this epoch."""
        return self.num_samples if self.kept is None else int(self.kept.numel())

    @property
    def num_pruned(self) -> int:
        """Samples skipped this epoch."""
        return self.num_samples - self.num_kept

    def weights_on(self, device: torch.device | str) -> Tensor | None:
        """The weights on ``device`` (copied once per device, asynchronously); ``None`` for all 1.

        Example:
            >>> import torch
            >>> p = plan_from_keep(0, torch.tensor([True, False]), torch.tensor([2.0, 1.0]))
            >>> p.weights_on("cpu") is p.weights_on("cpu"), full_plan(0, 3).weights_on("cpu")
            (True, None)
        """
        if self.weights is None:
            return None
        dev = torch.device(device)
        w = self._on_device.get(dev)
        if w is None:
            w = self.weights if self.weights.device == dev else self.weights.to(dev, non_blocking=True)
            self._on_device[dev] = w
        return w

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values (loads with ``torch.load(weights_only=True)``).

        Example:
            >>> Plan.from_state(full_plan(2, 5).state_dict(), num_samples=5).epoch
            2
        """
        return {
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "kept": self.kept,
            "weights": self.weights,
            "threshold": self.threshold,
            "pruning": self.pruning,
        }

    @staticmethod
    def from_state(state: Any, num_samples: int, name: str = "plan") -> Plan:
        """A plan from :meth:`state_dict`, validated; ``ValueError`` naming the key that is wrong.

        Example:
            >>> import torch
            >>> bad = {**full_plan(0, 3).state_dict(), "weights": torch.tensor([1.0, float("nan"), 1.0])}
            >>> try:
            ...     Plan.from_state(bad, num_samples=3)
            ... except ValueError as e:
            ...     print(str(e).split(":")[0])
            plan['weights'] must hold finite loss weights >= 1, shape (3,)
        """
        return _plan_from_state(state, num_samples, name)


def _plan_from_state(state: Any, n: int, name: str) -> Plan:
    """Validate a saved plan against a dataset of ``n`` samples (see :meth:`Plan.from_state`)."""
    if not isinstance(state, dict):
        raise ValueError(f"{name} must be a dict saved by Plan.state_dict(), got {type(state).__name__}")
    missing = [
        k for k in ("epoch", "num_samples", "kept", "weights", "threshold", "pruning") if k not in state
    ]
    if missing:
        raise ValueError(f"{name} lacks the key(s) {missing}: it was not saved by this version of leanbatch")
    epoch, size, kept, weights = state["epoch"], state["num_samples"], state["kept"], state["weights"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"{name}['epoch'] must be an int >= 0, got {epoch!r}")
    if size != n:
        raise ValueError(f"{name}['num_samples'] is {size!r} but the dataset has {n} samples")
    if kept is not None:
        ok = (
            isinstance(kept, Tensor) and kept.dim() == 1 and not kept.is_floating_point() and kept.numel() > 0
        )
        if not ok or int(kept.min()) < 0 or int(kept.max()) >= n or bool((kept[1:] <= kept[:-1]).any()):
            raise ValueError(
                f"{name}['kept'] must be a non-empty sorted 1-D integer tensor of distinct indices in [0, {n})"
            )
    if weights is not None:
        try:
            check_saved_tensor(state, "weights", (n,), nan=False, low=1.0)
        except ValueError:
            raise ValueError(f"{name}['weights'] must hold finite loss weights >= 1, shape ({n},)") from None
    threshold = state["threshold"]
    if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"{name}['threshold'] must be None or a finite number, got {threshold!r}")
    return Plan(
        epoch, n, kept, weights, None if threshold is None else float(threshold), bool(state["pruning"])
    )


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

    A float32 sum that overflows (losses near the float32 maximum, 3e38) is redone in float64,
    so the mean never becomes infinity (which would put every sample below it).

    Example:
        >>> import torch
        >>> mean_score(torch.tensor([1.0, float("nan"), 3.0]))
        (2.0, 2)
        >>> mean_score(torch.tensor([3e38, 3e38, 1.0]))[0] < float("inf")
        True
    """
    count = scores.numel() - int(torch.count_nonzero(torch.isnan(scores)))
    if count == 0:
        return None, 0
    total = float(scores.nansum())
    if not math.isfinite(total):  # scores are finite: only an overflowing float32 sum gets here
        total = float(scores.nansum(dtype=torch.float64))
    return total / count, count
