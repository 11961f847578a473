"""Pruning policies: ``policy(scores, epoch, generator) -> Plan``, one module per family.

- :mod:`~leanbatch.policies.plan` - the :class:`~leanbatch.Plan` of an epoch;
- :mod:`~leanbatch.policies.base` - the :class:`Policy` protocol and the drawing tools every
  policy shares (drops keyed by index, weights that are exact inverse inclusion probabilities);
- :mod:`~leanbatch.policies.infobatch` - ``InfoBatchPolicy`` and ``RandomPolicy``;
- :mod:`~leanbatch.policies.budget` - fixed budgets: ``RS2Policy``, ``EpsilonGreedyPolicy``,
  ``UCBPolicy``;
- :mod:`~leanbatch.policies.seta` - ``SeTaPolicy``;
- :mod:`~leanbatch.policies.loss_rank` - ``LossRankPolicy`` (online batch selection per epoch);
- :mod:`~leanbatch.policies.parts`, :mod:`~leanbatch.policies.keyed`,
  :mod:`~leanbatch.policies.select` - the part of the index space a policy plans, its keyed draws
  and exact statistics, and the exact top-k: what lets a rank plan its own part of a sharded run.

The policies themselves are exported by :mod:`leanbatch` (``from leanbatch import RS2Policy``);
this package exports what a new policy is written with.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy
    >>> from leanbatch.policies import full_plan, pruning_epochs
    >>> pruning_epochs(8, 0.875), full_plan(0, 3).num_kept
    (7, 3)
"""

from leanbatch.policies.base import Policy, pruning_epochs
from leanbatch.policies.plan import full_plan

__all__ = ["Policy", "full_plan", "pruning_epochs"]
