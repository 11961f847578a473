"""Batch-level selection: Selective Backprop, its rules, Stale-SB and online batch selection.

Selection is a composition (:class:`Selector`): a *schedule* (:class:`Window`: when) x a *source
of scores* (the selection forward, a scorer such as :class:`ProxyScorer`, a memory of last trained
losses, Stale-SB's stale memory) x a *rule* (Composer's rank rule, the paper's ``cdf ** beta``,
the loss-rank exponential, top-k, uniform). :class:`SelectiveBackprop` and
:class:`OnlineBatchSelection` choose the parts from their arguments.

Modules: :mod:`~leanbatch.selection.schedule`, :mod:`~leanbatch.selection.sources`,
:mod:`~leanbatch.selection.scoring` (the forward pass and loss checks),
:mod:`~leanbatch.selection.rules`, :mod:`~leanbatch.selection.history`,
:mod:`~leanbatch.selection.selector`, :mod:`~leanbatch.selection.selective_backprop`,
:mod:`~leanbatch.selection.online`, :mod:`~leanbatch.selection.rho` (RHO-LOSS),
:mod:`~leanbatch.selection.scope` (local or global selection across data-parallel ranks),
:mod:`~leanbatch.selection.functional` (Composer's
``select_using_loss``), :mod:`~leanbatch.selection.proxy`, :mod:`~leanbatch.selection.losses`,
:mod:`~leanbatch.selection.batches` and :mod:`~leanbatch.selection.layout` (batch structures),
:mod:`~leanbatch.selection.stats`.

Example:
    >>> from leanbatch.selection import Selector, Window, MemoryScores, LossRankRule
    >>> obs = Selector(Window(0.0, 1.0, interrupt=0), MemoryScores(100), LossRankRule(0.5), keys=None)
    >>> obs.is_active(0.5, 0)
    True
"""

from leanbatch.progress import training_progress
from leanbatch.selection.batches import BatchAccumulator
from leanbatch.selection.functional import select_using_loss, selection_losses
from leanbatch.selection.history import HistoryRule, LossHistory
from leanbatch.selection.layout import Selection
from leanbatch.selection.losses import per_sequence_loss
from leanbatch.selection.online import OnlineBatchSelection
from leanbatch.selection.proxy import ProxyScorer
from leanbatch.selection.rho import ReducibleScores, RhoLoss
from leanbatch.selection.rules import (
    LossRankRule,
    RankRule,
    Rule,
    TopRule,
    UniformRule,
    loss_rank_weights,
    num_selected,
    pressure_at,
    rank_weights,
    seed_selection,
    select_by_loss_rank,
    select_hardest,
    select_indices,
    select_uniform,
)
from leanbatch.selection.schedule import Window, should_selective_backprop
from leanbatch.selection.scoring import preserved_training_state
from leanbatch.selection.selective_backprop import SelectiveBackprop
from leanbatch.selection.selector import Selector
from leanbatch.selection.sources import ForwardScores, MemoryScores, ScorerScores, Source, StaleScores
from leanbatch.selection.stats import SelectionStats

__all__ = [
    "BatchAccumulator",
    "ForwardScores",
    "HistoryRule",
    "LossHistory",
    "LossRankRule",
    "MemoryScores",
    "OnlineBatchSelection",
    "ProxyScorer",
    "RankRule",
    "ReducibleScores",
    "RhoLoss",
    "Rule",
    "ScorerScores",
    "Selection",
    "SelectionStats",
    "SelectiveBackprop",
    "Selector",
    "Source",
    "StaleScores",
    "TopRule",
    "UniformRule",
    "Window",
    "loss_rank_weights",
    "num_selected",
    "per_sequence_loss",
    "preserved_training_state",
    "pressure_at",
    "rank_weights",
    "seed_selection",
    "select_by_loss_rank",
    "select_hardest",
    "select_indices",
    "select_uniform",
    "select_using_loss",
    "selection_losses",
    "should_selective_backprop",
    "training_progress",
]
