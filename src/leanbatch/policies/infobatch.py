"""InfoBatch and dynamic random pruning: rescaled, unbiased epoch plans.

Both drop samples independently with a known probability and weight every kept
candidate by the exact inverse of its inclusion probability (see
:mod:`leanbatch.policies.base`). Options for short schedules, each off by default
(the defaults reproduce the paper's semantics exactly):

- ``target="all"``: prune ``prune_ratio`` of *all* scored samples per epoch, drawn
  from the below-mean ones (the paper's ``prune_ratio`` is a share of the
  below-mean samples only);
- ``warmup_epochs``: the first epochs train on all data, so the first pruned
  epochs do not meet the peak learning rate with up-weighted samples (epoch 0 has
  no scores yet and always trains on all data, so ``warmup_epochs=1`` changes
  nothing: ``2`` is the first value that delays pruning);
- ``refresh_every``: every ``refresh_every``-th epoch trains on all data, so no
  score is more than ``refresh_every`` epochs old;
- ``max_weight``: cap the rescaling weight (biased when it binds: the plan then
  trades unbiasedness for lower gradient variance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from leanbatch.checks import check_epochs, check_ratio, check_real
from leanbatch.policies.base import Policy, keyed_drop, plan_from_keep, pruning_epochs
from leanbatch.policies.keyed import draw_key
from leanbatch.policies.parts import Part, global_count, global_mean, split_part
from leanbatch.policies.plan import Plan, full_plan

__all__ = ["InfoBatchPolicy", "RandomPolicy", "make_policy"]

_TARGETS = ("below", "all")


@dataclass
class _Rescaled:
    """The fields and the epoch schedule shared by InfoBatch and random pruning."""

    prune_ratio: float = 0.5
    num_epochs: int = 1
    delta: float = 0.875
    target: str = "below"
    warmup_epochs: int = 0
    refresh_every: int = 0
    max_weight: float | None = None
    max_drop: float = 0.9

    def __post_init__(self) -> None:
        check_epochs(self.num_epochs, self.delta)
        check_ratio(
            self.prune_ratio,
            "prune_ratio",
            "it is the fraction of well-learned samples dropped per epoch (0.5 is the paper's default)",
        )
        if self.target not in _TARGETS:
            raise ValueError(
                f"target must be 'below' (prune_ratio is a share of the below-mean samples, the paper's "
                f"semantics) or 'all' (a share of all scored samples), got {self.target!r}"
            )
        for name in ("warmup_epochs", "refresh_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0 (0 = off), got {v!r}")
        if self.max_weight is not None:
            check_real(self.max_weight, "max_weight", 1.0, allow_inf=True, hint="or None (exact rescaling)")
        check_ratio(
            self.max_drop,
            "max_drop",
            "with target='all', the largest share of the below-mean samples dropped (0.9: InfoBatch's "
            "code never keeps fewer than 10%)",
            low_open=True,
        )

    def prunes(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) may prune: after the warm-up, before annealing, not a refresh.

        Example:
            >>> InfoBatchPolicy(num_epochs=8, warmup_epochs=1, refresh_every=3).prunes(3)
            False
        """
        if self.prune_ratio == 0 or epoch < self.warmup_epochs:
            return False
        if epoch >= pruning_epochs(self.num_epochs, self.delta):
            return False
        return not (self.refresh_every and epoch % self.refresh_every == 0)

    shardable = True  # plans a rank's part of the index space (``scores``: a sharded table's Part)

    def __call__(self, scores: Tensor | Part, epoch: int, generator: torch.Generator) -> Plan:
        """The epoch's plan (``scores``: every sample's, or one rank's :class:`~leanbatch.policies.parts.Part`)."""
        scores, sl = split_part(scores)
        uniform = isinstance(self, RandomPolicy)
        n = sl.num_samples
        if not self.prunes(epoch):
            return full_plan(epoch, n)
        scores = scores.detach().to("cpu", torch.float32)
        threshold, num_scored = global_mean(scores, sl)
        if threshold is None:
            return full_plan(epoch, n)
        below = scores < threshold  # NaN (never scored) compares False: always kept
        if uniform or self.target == "all":
            num_below = global_count(torch.count_nonzero(below), sl)
            drops = self.prune_ratio * num_below  # the expected drops, the same for both policies
            if self.target == "all":
                drops = min(self.prune_ratio * num_scored, self.max_drop * num_below)
        if uniform:  # random pruning: the same expected drops, spread over every scored sample
            del below
            candidates, q, num_candidates = ~torch.isnan(scores), drops / num_scored, num_scored
        elif self.target == "below":
            candidates, q, num_candidates = below, self.prune_ratio, n - 1  # exactly the paper's q
        else:
            candidates, q, num_candidates = below, (drops / num_below if num_below else 0.0), num_below
        drop, w = keyed_drop(candidates, q, draw_key(generator), sl, num_candidates)
        w = w if self.max_weight is None else min(w, float(self.max_weight))
        weights = candidates.to(torch.float32).mul_(w).clamp_(min=1.0)  # w >= 1 rounded once, as float32(w)
        del candidates
        return plan_from_keep(epoch, drop.logical_not_(), weights, threshold, sl)


@dataclass
class InfoBatchPolicy(_Rescaled):
    """InfoBatch (Qin et al., ICLR 2024): prune well-learned samples at random.

    Epoch ``e`` prunes iff ``e < floor(delta * num_epochs)``. The threshold is the
    mean of the scored samples; of the samples strictly below it, each is dropped
    with probability ``prune_ratio`` and, if kept, weighted by the exact inverse
    of its inclusion probability. Samples at or above the mean, and samples never
    scored, are always kept with weight 1. Later epochs keep all, weight exactly 1.

    Args:
        prune_ratio: share of the below-mean samples dropped (``target="below"``, the
            paper's default 0.5), or of all scored samples (``target="all"``).
        num_epochs, delta: the run's length; epochs from ``floor(delta * num_epochs)``
            train on all data (the paper's 0.875).
        target: ``"below"`` (default, the paper) or ``"all"``: drop ``prune_ratio`` of
            all scored samples per epoch in expectation, drawn from the below-mean ones
            with drop probability ``q = prune_ratio * n_scored / n_below`` and weight
            ``1 / (1 - q)``; ``q`` is capped at ``max_drop`` when too few are below the
            mean (then less than ``prune_ratio`` is pruned).
        warmup_epochs: the first epochs train on all data (default 0). Epoch 0 has no
            scores and trains on all data anyway: ``2`` is the first value that delays pruning.
        refresh_every: every ``refresh_every``-th epoch trains on all data (default 0 = never).
        max_weight: cap on the rescaling weight (default None = the exact inverse; 1 = no
            rescaling). Biased when it binds.
        max_drop: see ``target`` (default 0.9).

    Example:
        >>> import torch
        >>> pol = InfoBatchPolicy(prune_ratio=0.5, num_epochs=4, delta=0.75)
        >>> scores = torch.tensor([0.1, 0.2, 3.0, 4.0])
        >>> plan = pol(scores, 0, torch.Generator().manual_seed(0))
        >>> round(plan.threshold, 4), plan.weights.tolist()
        (1.825, [2.0, 2.0, 1.0, 1.0])
        >>> pol(scores, 3, torch.Generator()).pruning   # annealing epoch
        False
        >>> pol = InfoBatchPolicy(prune_ratio=0.25, num_epochs=4, target="all")  # a quarter of all 4
        >>> pol(scores, 0, torch.Generator().manual_seed(0)).weights.tolist()   # q = 0.25 * 4 / 2
        [2.0, 2.0, 1.0, 1.0]
    """


@dataclass
class RandomPolicy(_Rescaled):
    """Dynamic random pruning: the honest baseline for InfoBatch.

    Same expected amount of work as :class:`InfoBatchPolicy` with the same
    arguments (it drops as many samples in expectation as InfoBatch would:
    ``prune_ratio`` times the number of scored samples below the mean, or with
    ``target="all"`` ``prune_ratio`` of all scored samples), but chosen uniformly
    among all scored samples, with the same exact inverse-probability rescaling,
    the same annealing epochs and the same short-schedule options.

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


def make_policy(policy: str | Policy, prune_ratio: float, num_epochs: int, delta: float) -> Policy:
    """The policy object for ``InfoBatch(policy=...)``; a policy object must agree on ``num_epochs``."""
    kinds: dict[str, type[InfoBatchPolicy] | type[RandomPolicy]] = {
        "infobatch": InfoBatchPolicy,
        "random": RandomPolicy,
    }
    if isinstance(policy, str):
        if policy not in kinds:
            raise ValueError(f"policy must be one of {sorted(kinds)} or a Policy object, got {policy!r}")
        return kinds[policy](prune_ratio, num_epochs, delta)
    InfoBatchPolicy(prune_ratio, num_epochs, delta)  # validates the arguments all the same
    if not callable(policy):
        raise TypeError(
            f"policy must be 'infobatch', 'random' or a Policy object, got {type(policy).__name__}"
        )
    theirs = getattr(policy, "num_epochs", num_epochs)
    if theirs != num_epochs:
        raise ValueError(
            f"InfoBatch(num_epochs={num_epochs}) but the policy has num_epochs={theirs}: the policy would "
            "anneal at another epoch than the one progress counts to; build both with the same num_epochs"
        )
    return policy
