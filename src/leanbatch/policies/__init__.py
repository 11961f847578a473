"""Pruning policies: (scores, epoch, generator) -> the epoch's plan.

One module per family:

- :mod:`~leanbatch.policies.base` - the :class:`Plan`, the :class:`Policy` protocol and
  the drawing tools every policy shares;
- :mod:`~leanbatch.policies.infobatch` - :class:`InfoBatchPolicy` (with the target-fraction
  and short-schedule options) and :class:`RandomPolicy`, rescaled and unbiased;
- :mod:`~leanbatch.policies.budget` - fixed-budget plans: :class:`RS2Policy` (repeated random
  sampling without replacement), :class:`EpsilonGreedyPolicy` and :class:`UCBPolicy`;
- :mod:`~leanbatch.policies.seta` - :class:`SeTaPolicy` (random subset, loss groups, a
  window sliding from easy to hard);
- :mod:`~leanbatch.policies.loss_rank` - :class:`LossRankPolicy` (online batch selection in the
  paper's own form: each epoch drawn from the whole dataset by loss rank).

Example:
    >>> from leanbatch.policies import InfoBatchPolicy, RandomPolicy, Plan, full_plan, pruning_epochs
"""

from leanbatch.policies.base import Plan, Policy, full_plan, pruning_epochs
from leanbatch.policies.budget import EpsilonGreedyPolicy, RS2Policy, UCBPolicy
from leanbatch.policies.infobatch import InfoBatchPolicy, RandomPolicy
from leanbatch.policies.loss_rank import LossRankPolicy
from leanbatch.policies.seta import SeTaPolicy

__all__ = [
    "EpsilonGreedyPolicy",
    "InfoBatchPolicy",
    "LossRankPolicy",
    "Plan",
    "Policy",
    "RS2Policy",
    "RandomPolicy",
    "SeTaPolicy",
    "UCBPolicy",
    "full_plan",
    "pruning_epochs",
]
