"""Fixed-budget plans: each pruning epoch serves exactly ``k = max(1, round((1 - prune_ratio) * N))``.

- :class:`RS2Policy` - repeated random sampling without replacement (Okanovic et al., 2023):
  a fresh uniform subset every epoch, cycling through the data before repeating;
- :class:`EpsilonGreedyPolicy` and :class:`UCBPolicy` - dynamic data pruning by a bandit rule
  (Raju, Daruwalla & Lipasti, 2021): rank the samples by the EMA of their loss (UCB: plus ``c``
  times its EMA standard deviation), keep the best ``(1 - epsilon)`` of the budget and fill the
  rest uniformly at random from the others.

None of them rescales the loss (every kept sample weighs 1), as in the papers: RS2 is unbiased
up to a constant (every sample has inclusion probability ``k / N``), the bandit rules are not
meant to be. Epochs from ``floor(delta * num_epochs)`` train on all data (``delta=1``, the
papers' setting, never anneals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from leanbatch.checks import check_epochs, check_ratio, check_real, check_seed
from leanbatch.permutation import KeyedPermutation, mix_seed
from leanbatch.policies.base import plan_from_keep, pruning_epochs
from leanbatch.policies.keyed import draw_key
from leanbatch.policies.parts import Part, Slice, global_count, split_part
from leanbatch.policies.plan import Plan, full_plan
from leanbatch.policies.select import score_keys, top_mask, uniform_keys

if TYPE_CHECKING:
    from leanbatch.scores import ScoreTable

__all__ = ["RS2Policy", "EpsilonGreedyPolicy", "UCBPolicy", "budget_size"]

_RS2_TAG = 0x525332  # "RS2": keys the pass permutations apart from other uses of the seed


def budget_size(num_samples: int, prune_ratio: float) -> int:
    """Samples a fixed-budget epoch serves: ``max(1, round((1 - prune_ratio) * num_samples))``.

    Example:
        >>> budget_size(1000, 0.3), budget_size(3, 0.9)
        (700, 1)
    """
    return max(1, round((1.0 - prune_ratio) * num_samples))


@dataclass
class _Budget:
    prune_ratio: float = 0.3
    num_epochs: int = 1
    delta: float = 1.0

    def __post_init__(self) -> None:
        check_epochs(self.num_epochs, self.delta)
        check_ratio(
            self.prune_ratio, "prune_ratio", "the share of all samples left out of each pruning epoch"
        )

    shardable = True  # plans a rank's part of the index space (``scores``: a sharded table's Part)

    def _budget(self, epoch: int, n: int) -> int:
        """``k`` in a pruning epoch (before ``floor(delta * num_epochs)``) that leaves a sample out, else 0."""
        k = budget_size(n, self.prune_ratio)
        return k if k < n and epoch < pruning_epochs(self.num_epochs, self.delta) else 0


@dataclass
class RS2Policy(_Budget):
    """Repeated random sampling without replacement (RS2, Okanovic et al., 2023).

    Each pruning epoch serves a fresh uniform subset of ``k`` samples. The subsets cycle
    through the data: a *pass* is a random permutation of all ``N`` samples (keyed by
    ``(seed, pass)``), and epoch ``e`` takes positions ``[e*k, (e+1)*k)`` of the passes laid
    end to end, so every sample is served once per pass before any is served again. The
    plan is a pure function of ``(seed, epoch)``: resuming and every DDP rank give the same
    epochs without extra state. An epoch that spans the end of a pass and the start of the
    next may draw a sample from both; it is served once and replaced by a sample drawn
    uniformly from the rest (the generator's draw), so every epoch serves exactly ``k``
    distinct samples (about ``m (k - m) / N`` replacements, ``m`` taken from the old pass); the
    replacements are the samples first in a keyed uniform order, so every rank of a sharded plan
    finds them. A pass is a keyed permutation (:class:`~leanbatch.permutation.KeyedPermutation`),
    evaluated forward on the epoch's positions or, for one rank's slice, backward on its indices.
    Scores are not read: RS2 is the baseline a scoring rule must beat at equal budget.

    Args:
        prune_ratio: share of all samples left out of each epoch (the paper sweeps the kept
            share from 1% to 30%; 0.3 here matches InfoBatch's saving at its defaults).
        num_epochs, delta: epochs from ``floor(delta * num_epochs)`` train on all data
            (default ``delta=1``: RS2 samples every epoch).
        seed: keys the passes; the same on every rank.

    Example:
        >>> import torch
        >>> pol = RS2Policy(prune_ratio=0.5, num_epochs=4, seed=0)
        >>> plans = [pol(torch.full((6,), float("nan")), e, torch.Generator()) for e in range(2)]
        >>> [p.num_kept for p in plans], sorted(plans[0].kept.tolist() + plans[1].kept.tolist())
        ([3, 3], [0, 1, 2, 3, 4, 5])
    """

    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seed(self.seed)

    def _in_pass(self, sl: Slice, pass_index: int, lo: int, hi: int) -> Tensor:
        """Bool mask of the local rows at positions ``[lo, hi)`` of pass ``pass_index`` (keyed by ``(seed, pass)``)."""
        perm = KeyedPermutation(sl.num_samples, mix_seed(self.seed, pass_index, _RS2_TAG))
        if sl.whole:  # forward on the positions: O(hi - lo)
            keep = torch.zeros(sl.num_samples, dtype=torch.bool)
            keep[perm(torch.arange(lo, hi))] = True
            return keep
        pos = perm.inverse(sl.indices())  # backward on this rank's indices: O(N / world)
        return (pos >= lo) & (pos < hi)

    def __call__(self, scores: Tensor | Part, epoch: int, generator: torch.Generator) -> Plan:
        """The epoch's plan (``scores``: every sample's, or one rank's :class:`~leanbatch.policies.parts.Part`)."""
        scores, sl = split_part(scores)
        n = sl.num_samples
        k = self._budget(epoch, n)
        if not k:
            return full_plan(epoch, n)
        start, end = epoch * k, (epoch + 1) * k
        first, last = start // n, (end - 1) // n  # k <= n: at most two passes
        keep = self._in_pass(sl, first, start - first * n, min(end, (first + 1) * n) - first * n)
        if last > first:
            head = self._in_pass(sl, last, 0, end - last * n)
            repeats = global_count(torch.count_nonzero(keep & head), sl)
            keep |= head
            if repeats:  # served once; the budget is filled uniformly from the others
                keep |= top_mask(uniform_keys(draw_key(generator), sl), repeats, sl, among=~keep)
        return plan_from_keep(epoch, keep, sl=sl)


@dataclass
class EpsilonGreedyPolicy(_Budget):
    """Epsilon-greedy dynamic data pruning (Raju, Daruwalla & Lipasti, 2021).

    Each pruning epoch keeps ``k`` samples: the ``k - round(epsilon * k)`` with the highest
    score (the EMA of their loss: the score table's values), and ``round(epsilon * k)`` drawn
    uniformly from the others (exploration: "sometimes" samples get trained and re-scored).
    Samples never scored rank first (their loss is unknown); an epoch with nothing scored
    trains on all data. Ties in the score go to the lower index; the exploration takes the
    first of the others in a keyed uniform order, so a sharded plan is the same (the top
    ``k`` over every rank: :func:`~leanbatch.policies.select.top_mask`).

    Args:
        prune_ratio: share of all samples left out per pruning epoch (default 0.3).
        num_epochs, delta: annealing as in InfoBatch (default ``delta=1``: no annealing).
        epsilon: the random share of the budget (default 0.1).
        ema: the momentum of the loss EMA the ranking reads, ``m * old + (1 - m) * new``
            (default 0.9); :class:`~leanbatch.InfoBatch` builds its score table with it,
            and :meth:`bind` refuses a table with another.

    Example:
        >>> import torch
        >>> pol = EpsilonGreedyPolicy(prune_ratio=0.5, num_epochs=2, epsilon=0.5)
        >>> plan = pol(torch.tensor([0.1, 5.0, 0.2, 4.0, 0.3, 3.0, 0.4, 2.0]), 0, torch.Generator().manual_seed(0))
        >>> plan.num_kept, {1, 3} <= set(plan.kept.tolist()), plan.weights is None   # top 2 + 2 at random
        (4, True, True)
    """

    epsilon: float = 0.1
    ema: float | None = 0.9
    _table: ScoreTable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real(self.epsilon, "epsilon", 0.0, 1.0, hint="the random share of the budget")
        if self.ema is not None:
            check_real(self.ema, "ema", 0.0, 1.0, high_open=True, hint="a momentum, or None: the last loss")

    def score_table_options(self) -> dict[str, Any]:
        """What the score table must keep for this rule (``InfoBatch`` builds its table with it)."""
        return {"ema": self.ema}

    def bind(self, table: ScoreTable) -> None:
        """Check that ``table`` keeps what this rule ranks by (``PrunedSampler`` calls it)."""
        if self._table is not None and self._table is not table:
            raise ValueError(
                f"this {type(self).__name__} is bound to another score table already: build one policy per "
                "sampler (it ranks by the table it is bound to)"
            )
        if table.ema != self.ema:
            raise ValueError(
                f"{type(self).__name__}(ema={self.ema}) ranks by an EMA of the loss with momentum "
                f"{self.ema}, but the score table keeps ema={table.ema}: build it with "
                f"ScoreTable(n, **policy.score_table_options())"
            )
        self._table = table

    def ranking(self, scores: Tensor) -> Tensor:
        """The score each sample is ranked by (higher = kept first); never scored = +inf."""
        return torch.nan_to_num(scores, nan=float("inf"))

    def __call__(self, scores: Tensor | Part, epoch: int, generator: torch.Generator) -> Plan:
        """The epoch's plan (``scores``: every sample's, or one rank's :class:`~leanbatch.policies.parts.Part`)."""
        scores, sl = split_part(scores)
        n = sl.num_samples
        k = self._budget(epoch, n)
        if not k:
            return full_plan(epoch, n)
        scores = scores.detach().to("cpu", torch.float32)
        if global_count(scores.numel() - int(torch.count_nonzero(torch.isnan(scores))), sl) == 0:
            return full_plan(epoch, n)
        explore = round(self.epsilon * k)
        keep = top_mask(score_keys(self.ranking(scores), sl), k - explore, sl)
        if explore:
            keep |= top_mask(uniform_keys(draw_key(generator), sl), explore, sl, among=~keep)
        return plan_from_keep(epoch, keep, sl=sl)


@dataclass
class UCBPolicy(EpsilonGreedyPolicy):
    """UCB dynamic data pruning (Raju, Daruwalla & Lipasti, 2021).

    As :class:`EpsilonGreedyPolicy`, ranking by the upper confidence bound
    ``mean + c * std`` of each sample's loss, with mean and variance exponentially
    weighted (the score table's ``ema`` and ``variance=True``): samples whose loss
    varies a lot are kept even when their mean is low.

    Args:
        c: weight of the standard deviation (default 1.0).
        Other arguments as in :class:`EpsilonGreedyPolicy`.

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable
        >>> pol = UCBPolicy(prune_ratio=0.5, num_epochs=2, epsilon=0.0, c=1.0)
        >>> table = ScoreTable(4, **pol.score_table_options())
        >>> pol.bind(table)
        >>> for losses in ([1.3, 1.0, 1.5, 0.1], [1.3, 3.0, 1.5, 0.1]):   # sample 1's loss varies
        ...     table.update(torch.arange(4), torch.tensor(losses))
        >>> [round(x, 2) for x in table.values.tolist()]   # by the mean alone, 2 and 0 would be kept
        [1.3, 1.2, 1.5, 0.1]
        >>> sorted(pol(table.values, 0, torch.Generator()).kept.tolist())   # 1.2 + sqrt(0.36) = 1.8
        [1, 2]
    """

    c: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real(self.c, "c", 0.0, allow_inf=True, hint="the weight of the loss's standard deviation")
        if self.ema is None:
            raise ValueError("UCBPolicy needs ema= (a momentum in [0, 1)): the mean and variance are EMAs")

    def score_table_options(self) -> dict[str, Any]:
        """The table keeps the EMA and its variance."""
        return {"ema": self.ema, "variance": True}

    def bind(self, table: ScoreTable) -> None:
        """Check that ``table`` keeps the EMA variance this rule ranks by."""
        if not table.tracks_variance:
            raise ValueError(
                "UCBPolicy ranks by mean + c * std of the loss: build the score table with "
                "ScoreTable(n, **policy.score_table_options()) (ema and variance=True)"
            )
        super().bind(table)

    def ranking(self, scores: Tensor) -> Tensor:
        """``mean + c * sqrt(var)`` from the bound table (never scored = +inf)."""
        if self._table is None:
            raise RuntimeError(
                "UCBPolicy reads the EMA variance from its score table: call policy.bind(table) first "
                "(PrunedSampler and InfoBatch do it)"
            )
        var = self._table.variances.detach().to("cpu", torch.float32)
        return super().ranking(scores + self.c * var.clamp(min=0.0).sqrt())
