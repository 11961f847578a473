"""leanbatch: skip the training work your model does not need, and measure whether it paid.

Example:
    >>> from leanbatch import InfoBatch, SelectiveBackprop, select_using_loss
    >>> from leanbatch import RS2Policy, UCBPolicy, SeTaPolicy, ProxyScorer, OnlineBatchSelection
"""

from leanbatch.infobatch import InfoBatch
from leanbatch.policies import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    Plan,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.progress import training_progress
from leanbatch.sampler import PrunedSampler
from leanbatch.schedule import ProgressLR, cosine
from leanbatch.scores import ScoreTable
from leanbatch.selection import (
    OnlineBatchSelection,
    ProxyScorer,
    Selection,
    SelectiveBackprop,
    per_sequence_loss,
    select_by_loss_rank,
    select_indices,
    select_using_loss,
    selection_losses,
    should_selective_backprop,
)

__all__ = [
    "EpsilonGreedyPolicy",
    "InfoBatch",
    "InfoBatchPolicy",
    "OnlineBatchSelection",
    "Plan",
    "ProgressLR",
    "ProxyScorer",
    "PrunedSampler",
    "RS2Policy",
    "RandomPolicy",
    "ScoreTable",
    "SeTaPolicy",
    "Selection",
    "SelectiveBackprop",
    "UCBPolicy",
    "cosine",
    "per_sequence_loss",
    "select_by_loss_rank",
    "select_indices",
    "select_using_loss",
    "selection_losses",
    "should_selective_backprop",
    "training_progress",
]
__version__ = "0.1.0"
