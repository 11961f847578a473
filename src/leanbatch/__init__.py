"""leanbatch: cheaper PyTorch training at the same accuracy.

Example:
    >>> from leanbatch import InfoBatch, SelectiveBackprop, select_using_loss
"""

from leanbatch.infobatch import InfoBatch
from leanbatch.policies import InfoBatchPolicy, Plan, RandomPolicy
from leanbatch.sampler import PrunedSampler
from leanbatch.schedule import ProgressLR, cosine
from leanbatch.scores import ScoreTable
from leanbatch.selection import (
    Selection,
    SelectiveBackprop,
    per_sequence_loss,
    select_indices,
    select_using_loss,
    selection_losses,
    should_selective_backprop,
    training_progress,
)

__all__ = [
    "InfoBatch",
    "InfoBatchPolicy",
    "Plan",
    "ProgressLR",
    "PrunedSampler",
    "RandomPolicy",
    "ScoreTable",
    "Selection",
    "SelectiveBackprop",
    "cosine",
    "per_sequence_loss",
    "select_indices",
    "select_using_loss",
    "selection_losses",
    "should_selective_backprop",
    "training_progress",
]
__version__ = "0.1.0"
