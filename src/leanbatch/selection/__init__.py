"""Batch-level selection: Selective Backprop, its paper rule, and Stale-SB.

An extra no-grad forward pass scores every example of a loaded batch and only
the hardest get a backward pass. Beside InfoBatch's epoch-level pruning, this
saves backward compute inside the batches that are loaded; Stale-SB also skips
the scoring pass for examples whose loss is recent enough.

Modules, one concept each:

- :mod:`~leanbatch.selection.functional` - ``select_using_loss`` (Composer's
  signature) and ``selection_losses``;
- :mod:`~leanbatch.selection.rank` - the rank rule, ``select_indices``;
- :mod:`~leanbatch.selection.history` - the paper's ``cdf ** beta`` rule;
- :mod:`~leanbatch.selection.scoring` - the selection forward pass that leaves
  BatchNorm statistics and train/eval modes untouched;
- :mod:`~leanbatch.selection.selective_backprop` - ``SelectiveBackprop``, the
  schedule object, and its loader wrapper;
- :mod:`~leanbatch.selection.stale` - Stale-SB's per-index memory;
- :mod:`~leanbatch.selection.online` - online batch selection by the last known loss
  (Loshchilov & Hutter), ``select_by_loss_rank``;
- :mod:`~leanbatch.selection.proxy` - ``ProxyScorer``, a small model trained alongside
  the main one that scores batches in its place;
- :mod:`~leanbatch.selection.losses` - ``per_sequence_loss`` for token models;
- :mod:`~leanbatch.selection.batches`, :mod:`~leanbatch.selection.accumulate`,
  :mod:`~leanbatch.selection.stats`, :mod:`~leanbatch.selection.rng` - batch
  structures, full-batch accumulation, counters, private generators.
"""

from leanbatch.selection.accumulate import BatchAccumulator
from leanbatch.selection.functional import select_using_loss, selection_losses
from leanbatch.selection.history import LossHistory
from leanbatch.selection.losses import per_sequence_loss
from leanbatch.selection.online import loss_rank_weights, select_by_loss_rank
from leanbatch.selection.proxy import ProxyScorer
from leanbatch.selection.rank import num_selected, rank_weights, select_hardest, select_indices
from leanbatch.selection.rng import seed_selection
from leanbatch.selection.scoring import preserved_training_state
from leanbatch.selection.selective_backprop import (
    Selection,
    SelectiveBackprop,
    should_selective_backprop,
    training_progress,
)
from leanbatch.selection.stale import StaleScores
from leanbatch.selection.stats import SelectionStats

__all__ = [
    "BatchAccumulator",
    "LossHistory",
    "ProxyScorer",
    "Selection",
    "SelectionStats",
    "SelectiveBackprop",
    "StaleScores",
    "loss_rank_weights",
    "num_selected",
    "per_sequence_loss",
    "preserved_training_state",
    "rank_weights",
    "seed_selection",
    "select_by_loss_rank",
    "select_hardest",
    "select_indices",
    "select_using_loss",
    "selection_losses",
    "should_selective_backprop",
    "training_progress",
]
