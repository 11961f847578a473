"""SeTa (Zhou, Gao & Wang, "Scale Efficient Training for Large Datasets", CVPR 2025).

Each epoch:

1. **Random pruning.** A uniform random subset of ``k = round((1 - prune_ratio) * N)``
   samples is drawn (redundant samples are left out at random).
2. **Loss groups.** The subset's losses are clustered into ``num_groups`` groups by
   one-dimensional k-means, and the groups are ordered from the lowest mean loss
   (easy) to the highest (hard).
3. **Sliding window.** A window of ``w = round(num_groups * window_scale)`` consecutive
   groups is kept (Python's ``round``, as the authors' code: 5 groups at 0.9 give 4).
   In pruning epoch ``t`` it starts at group ``t mod (num_groups - w + 1)``: it slides
   from the easy end to the hard end and starts over, so the overly hard groups and the
   well-learned easy groups are left out in turn. The first epoch keeps every group.
4. **Partial annealing.** Epochs from ``floor(delta * num_epochs)`` keep the random
   subset of step 1 only.

Kept samples weigh 1 (SeTa does not rescale: it is a curriculum, not an unbiased
estimator). Samples without a score are always in the window. The one-dimensional
k-means (:func:`kmeans_boundaries`) starts from greedy k-means++ centres, as the authors'
scikit-learn ``KMeans`` does, and runs Lloyd's algorithm on the sorted losses (exact
cluster sums from prefix sums), keeping the best of 3 starts; it is fitted on at most
``2**18`` of the subset's losses (those first in a keyed uniform order beyond that, gathered
to every rank) and applied to all of them, from the same seeded starts on every rank and in every
epoch (the losses change), so every rank finds the same groups. Its local optimum may differ from scikit-learn's. When every loss in the subset is
equal, the groups are equal random chunks (as in the authors' code). Should the window hold no
sample, the whole random subset is kept. The random subset is the ``k`` samples first in a
keyed uniform order, so a rank's slice of the plan (``shard_scores=True``) is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from leanbatch.checks import check_epochs, check_ratio, check_real
from leanbatch.policies.base import plan_from_keep, pruning_epochs
from leanbatch.policies.budget import budget_size
from leanbatch.policies.keyed import draw_key
from leanbatch.policies.parts import Part, global_count, split_part
from leanbatch.policies.plan import Plan, full_plan
from leanbatch.policies.select import kth_largest, top_mask, uniform_keys

__all__ = ["SeTaPolicy", "kmeans_boundaries"]

_MAX_FIT = 1 << 18


def kmeans_boundaries(
    values: Tensor,
    num_groups: int,
    generator: torch.Generator | None = None,
    max_fit: int = _MAX_FIT,
    n_init: int = 3,
) -> Tensor | None:
    """Boundaries between ``num_groups`` one-dimensional k-means clusters of ``values``, ascending.

    ``torch.bucketize(v, boundaries)`` then gives each value its group, ``0`` being the
    lowest. Greedy k-means++ starts (as scikit-learn's ``KMeans``), then Lloyd's algorithm on
    the sorted values with exact cluster sums from prefix sums; the best of ``n_init`` runs
    (lowest within-group sum of squares) is kept. Beyond ``max_fit`` values it is fitted on a
    uniform sample. Draws come from ``generator`` (default: seeded with 0). Returns ``None``
    when all values are equal (no boundary separates them).

    Example:
        >>> import torch
        >>> b = kmeans_boundaries(torch.tensor([0.1, 0.2, 0.15, 5.0, 5.2, 9.0]), 3)
        >>> torch.bucketize(torch.tensor([0.1, 0.2, 0.15, 5.0, 5.2, 9.0]), b).tolist()
        [0, 0, 0, 1, 1, 2]
    """
    gen = torch.Generator().manual_seed(0) if generator is None else generator
    v = values.detach().reshape(-1)
    if v.numel() > max_fit:  # a uniform sample (with replacement) is plenty to place a few centres
        v = v[torch.randint(v.numel(), (max_fit,), generator=gen, device=v.device)]
    x = torch.sort(v.to("cpu", torch.float64)).values
    m = x.numel()
    if m == 0 or bool(x[0] == x[-1]):
        return None
    zero = torch.zeros(1, dtype=torch.float64)
    csum, csq = torch.cat([zero, torch.cumsum(x, 0)]), torch.cat([zero, torch.cumsum(x * x, 0)])
    runs = [_lloyd(x, csum, csq, _kmeans_plus_plus(x, num_groups, gen)) for _ in range(n_init)]
    bounds = min(runs, key=lambda run: run[1])[0]  # the lowest inertia (the first of equals)
    return bounds.to(values.dtype if values.is_floating_point() else torch.float32)


def _kmeans_plus_plus(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """Greedy k-means++ starting centres (``2 + floor(log k)`` candidates per step), sorted."""
    m = x.numel()
    centres = [x[int(torch.randint(m, (1,), generator=gen))]]
    d2 = (x - centres[0]) ** 2
    trials = 2 + int(math.log(k))
    for _ in range(1, k):
        cum = torch.cumsum(d2, 0)
        if float(cum[-1]) <= 0.0:  # every value sits on a centre already
            centres.append(centres[-1])
            continue
        picks = torch.searchsorted(cum, torch.rand(trials, generator=gen, dtype=torch.float64) * cum[-1])
        cand = x[picks.clamp(max=m - 1)]
        new = torch.minimum(d2, (x[None, :] - cand[:, None]) ** 2)  # (trials, m)
        j = int(torch.argmin(new.sum(1)))
        centres.append(cand[j])
        d2 = new[j]
    return torch.sort(torch.stack(centres)).values


def _lloyd(x: Tensor, csum: Tensor, csq: Tensor, centres: Tensor) -> tuple[Tensor, float]:
    """Lloyd's rounds on sorted ``x`` (clusters are intervals); boundaries and within-group sum of squares."""
    ends: Tensor | None = None
    for _ in range(100):
        bounds = (centres[:-1] + centres[1:]) / 2
        new_ends = torch.searchsorted(x, bounds, right=True)  # values <= a bound go to the lower group
        cuts = torch.cat([torch.zeros(1, dtype=torch.long), new_ends, torch.tensor([x.numel()])])
        counts = (cuts[1:] - cuts[:-1]).to(torch.float64)
        sums = csum[cuts[1:]] - csum[cuts[:-1]]
        if ends is not None and torch.equal(new_ends, ends):
            break
        ends = new_ends
        centres = torch.sort(torch.where(counts > 0, sums / counts.clamp(min=1), centres)).values
    squares = csq[cuts[1:]] - csq[cuts[:-1]]
    inertia = float((squares - sums * sums / counts.clamp(min=1)).sum())
    return bounds, inertia


@dataclass
class SeTaPolicy:
    """SeTa: random subset, loss groups, a window sliding from easy to hard (see the module doc).

    Args:
        prune_ratio: share left out by the random pruning of step 1 (default 0.1, the
            authors' CIFAR setting; the window then leaves out more).
        num_epochs: the run's length.
        num_groups: loss groups (default 5, the authors' CIFAR setting).
        window_scale: share of the groups in the window (default 0.9: 4 of 5 groups).
        delta: epochs from ``floor(delta * num_epochs)`` keep the random subset only (default
            0.875, as in the authors' scripts).

    Example:
        >>> import torch
        >>> pol = SeTaPolicy(prune_ratio=0.0, num_epochs=10, num_groups=2, window_scale=0.5)
        >>> scores = torch.tensor([0.1, 0.1, 0.2, 0.2, 3.0, 3.1, 3.2, 2.9])
        >>> pol.window(1), pol.window(2)           # (first group, groups kept)
        ((1, 1), (0, 1))
        >>> pol(scores, 1, torch.Generator().manual_seed(0)).kept.tolist()   # the hard group
        [4, 5, 6, 7]
        >>> pol(scores, 2, torch.Generator().manual_seed(0)).kept.tolist()   # the easy group
        [0, 1, 2, 3]
    """

    prune_ratio: float = 0.1
    num_epochs: int = 1
    num_groups: int = 5
    window_scale: float = 0.9
    delta: float = 0.875

    def __post_init__(self) -> None:
        check_epochs(self.num_epochs, self.delta)
        check_ratio(self.prune_ratio, "prune_ratio", "the share left out by SeTa's random pruning (0.1)")
        g = self.num_groups
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"num_groups must be an int >= 1, got {g!r}")
        ws = check_real(
            self.window_scale, "window_scale", 0.0, 1.0, low_open=True, hint="the share of groups kept"
        )
        if round(g * ws) < 1:
            raise ValueError(
                f"window_scale={ws} keeps round({g} * {ws}) = 0 of the {g} groups: raise window_scale"
            )

    def window(self, epoch: int) -> tuple[int, int]:
        """``(first group, number of groups)`` kept in pruning epoch ``epoch``."""
        size = round(self.num_groups * self.window_scale)
        if epoch == 0:
            return 0, self.num_groups
        return epoch % (self.num_groups - size + 1), size

    shardable = True  # plans a rank's part of the index space (``scores``: a sharded table's Part)

    def __call__(self, scores: Tensor | Part, epoch: int, generator: torch.Generator) -> Plan:
        """The epoch's plan (``scores``: every sample's, or one rank's :class:`~leanbatch.policies.parts.Part`)."""
        scores, sl = split_part(scores)
        n = sl.num_samples
        k = budget_size(n, self.prune_ratio)
        start, size = self.window(epoch)
        annealing = epoch >= pruning_epochs(self.num_epochs, self.delta)
        if k >= n and (annealing or size == self.num_groups):
            return full_plan(epoch, n)
        order = uniform_keys(draw_key(generator), sl)  # the random subset: the first k in this order
        subset = top_mask(order, k, sl)
        if annealing or size == self.num_groups:
            return plan_from_keep(epoch, subset, sl=sl)
        scores = scores.detach().to("cpu", torch.float32)
        scored = subset & ~torch.isnan(scores)
        num_scored = global_count(torch.count_nonzero(scored), sl)
        fit = scores[top_mask(order, min(num_scored, _MAX_FIT), sl, among=scored)]
        if not sl.whole:  # every rank's losses (kmeans_boundaries sorts them: the split does not show)
            counts = sl.comm.gather(torch.tensor([fit.numel()]))[:, 0]
            padded = torch.zeros(int(counts.max()), dtype=fit.dtype)
            padded[: fit.numel()] = fit
            fit = torch.cat([row[: int(c)] for row, c in zip(sl.comm.gather(padded), counts, strict=True)])
        bounds = kmeans_boundaries(fit, self.num_groups)  # fixed starts: a function of the losses alone
        if bounds is None:  # all scored losses equal: equal chunks of the (random) subset order
            cuts = [-(-j * num_scored // self.num_groups) for j in range(1, self.num_groups)]
            group = sum((order <= kth_largest(order, num_scored - c, sl, among=scored)).long() for c in cuts)
        else:
            group = torch.bucketize(scores, bounds)
        chosen = subset & (((group >= start) & (group < start + size)) | ~scored)
        return plan_from_keep(
            epoch, chosen if global_count(torch.count_nonzero(chosen), sl) else subset, sl=sl
        )
