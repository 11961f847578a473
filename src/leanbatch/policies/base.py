"""What every policy shares: the :class:`Policy` protocol and the drawing tools.

A plan says which dataset indices are served this epoch and with which loss
weight. Policies are small, pure and vectorised (no Python loop over samples).
The order in which kept samples are served is not part of the plan: the sampler
shuffles lazily with a keyed permutation (see :mod:`leanbatch.sampler`).

Rescaled policies drop each candidate independently with a known probability
``q`` (:func:`keyed_drop`) and give every kept candidate the exact inverse of its
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
from typing import Protocol

import torch
from torch import Tensor

from leanbatch.permutation import mix_seed
from leanbatch.policies.keyed import keyed_below
from leanbatch.policies.parts import Slice, global_count
from leanbatch.policies.plan import Plan

__all__ = [
    "Policy",
    "keyed_drop",
    "plan_from_keep",
    "pruning_epochs",
]

_SCALE = 1 << 32  # drop probabilities are multiples of 2**-32
_CHUNK = 1 << 20  # samples per chunk of random draws and index building


class Policy(Protocol):
    """What the sampler calls once per epoch: ``policy(scores, epoch, generator) -> Plan``.

    A policy that can plan one rank's part of the index space (``shard_scores=True``) says so with
    ``shardable = True``: a sharded table then hands it, as ``scores``, its
    :class:`~leanbatch.policies.parts.Part` (that rank's rows and their slice, with the collectives;
    :func:`~leanbatch.policies.parts.split_part` reads either kind), and its plan is the unsharded
    plan's part on that slice (:meth:`leanbatch.distributed.ShardedScores.plan`). Two optional hooks, for policies that read more of the score table than its values:
    ``score_table_options() -> dict`` (the ``ScoreTable`` keyword arguments the rule needs, e.g.
    ``{"ema": 0.9, "variance": True}``; :class:`~leanbatch.InfoBatch` builds its table with them)
    and ``bind(table)`` (``PrunedSampler`` calls it once with its table; it may refuse a table that
    lacks what the rule ranks by). See :class:`~leanbatch.UCBPolicy`.

    Example:
        >>> import torch
        >>> from leanbatch import RandomPolicy
        >>> policy: Policy = RandomPolicy(0.5, num_epochs=2)
        >>> policy(torch.rand(4), 0, torch.Generator()).num_kept <= 4
        True
    """

    num_epochs: int

    def __call__(self, scores: Tensor, epoch: int, generator: torch.Generator) -> Plan: ...


def pruning_epochs(num_epochs: int, delta: float) -> int:
    """Number of leading epochs that prune: ``floor(delta * num_epochs)``.

    Example:
        >>> pruning_epochs(10, 0.875), pruning_epochs(8, 0.875)
        (8, 7)
    """
    return math.floor(delta * num_epochs + 1e-9)


def keyed_drop(
    candidates: Tensor, q: float, key: int, sl: Slice, num_candidates: int
) -> tuple[Tensor, float]:
    """Drop each candidate (local rows of ``sl``) with probability ``q' = m / 2**32`` (m = round(q * 2**32)).

    Returns the drop mask and the weight of a kept candidate: the exact inverse of its
    inclusion probability. The decisions are keyed by ``(key, global index)``.
    ``num_candidates`` counts the candidates of every rank. When all ``N`` samples are candidates,
    an epoch with nothing kept is not allowed: the draw is conditioned on keeping at least one
    (inclusion probability ``(1 - q') / (1 - q'**N)``). When every rank dropped all of its own
    (one collective says so), the first kept index ``j`` follows a geometric law truncated to
    ``[0, N)`` (inverted from a keyed uniform), indices before it are dropped, and those after it
    are drawn anew with another key: exactly the conditional distribution, the same on every rank.

    Example:
        >>> import torch
        >>> drop, w = keyed_drop(torch.tensor([True, True]), 0.5, 7, Slice(4, 2, 1), 4)
        >>> drop.shape, round(w, 4)   # conditioned on one kept of 4: (1 - 0.5**4) / (1 - 0.5)
        (torch.Size([2]), 1.875)
    """
    n = sl.num_samples
    m = min(max(round(q * _SCALE), 0), _SCALE - 1)
    cut = m - (1 << 31)  # uniform int32 v: P(v < cut) = m / 2**32 exactly
    drop = torch.empty(sl.size, dtype=torch.bool)
    keyed_below(key, sl, cut, drop)
    drop &= candidates
    q_exact = m / _SCALE
    p_empty = q_exact**n if num_candidates >= n else 0.0
    if p_empty == 0.0:  # something is always kept (or an all-dropped draw is impossible in float64 terms)
        return drop, _SCALE / (_SCALE - m)
    if global_count(drop.numel() - int(torch.count_nonzero(drop)), sl) == 0:
        g = torch.Generator().manual_seed(mix_seed(key, 1))
        u = float(torch.rand((), dtype=torch.float64, generator=g))  # a keyed uniform in [0, 1)
        j = min(n - 1, int(math.floor(math.log1p(-u * (1.0 - p_empty)) / math.log(q_exact))))
        keyed_below(key, sl, cut, drop, tag=2)  # the indices after j, drawn anew
        idx = sl.indices()
        drop &= idx > j
        drop |= idx < j
    return drop, (1.0 - p_empty) / (1.0 - q_exact)


def plan_from_keep(
    epoch: int,
    keep: Tensor,
    weights: Tensor | None = None,
    threshold: float | None = None,
    sl: Slice | None = None,
) -> Plan:
    """A pruning plan serving the samples where the bool mask ``keep`` is True (at least one).

    The kept indices are sorted global indices (of the local rows of ``sl``, default all), int32
    when they fit, built chunk by chunk.
    """
    sl = Slice(keep.numel()) if sl is None else sl
    dtype = torch.int32 if sl.num_samples < 2**31 else torch.int64
    kept = torch.empty(int(torch.count_nonzero(keep)), dtype=dtype)
    pos = 0
    for start in range(0, keep.numel(), _CHUNK):
        part = torch.nonzero(keep[start : start + _CHUNK]).squeeze(1).add_(start)  # int64 only per chunk
        if sl.world > 1:
            part.mul_(sl.world).add_(sl.rank)
        kept[pos : pos + part.numel()] = part
        pos += part.numel()
    return Plan(epoch, sl.num_samples, kept, weights, threshold, True)
