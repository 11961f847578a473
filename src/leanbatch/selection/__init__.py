"""Batch-level selection: Selective Backprop, its rules, Stale-SB and online batch selection.

Selection is a composition (:class:`Selector`): a *schedule* (:class:`Window`: when) x a *source
of scores* (the selection forward, a scorer such as ``ProxyScorer``, a memory of last trained
losses, Stale-SB's stale memory) x a *rule* (Composer's rank rule, the paper's ``cdf ** beta``,
the loss-rank exponential, top-k, uniform). ``SelectiveBackprop`` and ``OnlineBatchSelection``
(exported by :mod:`leanbatch`, with Composer's functional ``select_using_loss``) choose the
parts from their arguments; this package exports the parts, to compose another selector.

Modules: :mod:`~leanbatch.selection.schedule`, :mod:`~leanbatch.selection.sources`,
:mod:`~leanbatch.selection.scoring` (the forward pass and loss checks),
:mod:`~leanbatch.selection.rules`, :mod:`~leanbatch.selection.history`,
:mod:`~leanbatch.selection.selector`, :mod:`~leanbatch.selection.selective_backprop`,
:mod:`~leanbatch.selection.online`, :mod:`~leanbatch.selection.rho` (RHO-LOSS),
:mod:`~leanbatch.selection.scope` (local or global selection across data-parallel ranks),
:mod:`~leanbatch.selection.functional` (Composer's
``select_using_loss``), :mod:`~leanbatch.selection.proxy`,
:mod:`~leanbatch.selection.batches` and :mod:`~leanbatch.selection.layout` (batch structures),
:mod:`~leanbatch.selection.stats`.

Example:
    >>> from leanbatch.selection import Selector, Window, MemoryScores, LossRankRule
    >>> obs = Selector(Window(0.0, 1.0, interrupt=0), MemoryScores(100), LossRankRule(0.5), keys=None)
    >>> obs.is_active(0.5, 0)
    True
"""

from leanbatch.selection.history import HistoryRule, LossHistory
from leanbatch.selection.rho import ReducibleScores, RhoLoss
from leanbatch.selection.rules import LossRankRule, RankRule, Rule, TopRule, UniformRule
from leanbatch.selection.schedule import Window
from leanbatch.selection.selector import Selector
from leanbatch.selection.sources import ForwardScores, MemoryScores, ScorerScores, Source, StaleScores
from leanbatch.selection.stats import SelectionStats

__all__ = [
    "ForwardScores",
    "HistoryRule",
    "LossHistory",
    "LossRankRule",
    "MemoryScores",
    "RankRule",
    "ReducibleScores",
    "RhoLoss",
    "Rule",
    "ScorerScores",
    "SelectionStats",
    "Selector",
    "Source",
    "StaleScores",
    "TopRule",
    "UniformRule",
    "Window",
]
