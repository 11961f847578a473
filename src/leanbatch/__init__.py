"""leanbatch: cheaper PyTorch training at the same accuracy.

Example:
    >>> from leanbatch import InfoBatch, ScoreTable, PrunedSampler
"""

from leanbatch.infobatch import InfoBatch
from leanbatch.policies import InfoBatchPolicy, Plan, RandomPolicy
from leanbatch.sampler import PrunedSampler
from leanbatch.schedule import ProgressLR, cosine
from leanbatch.scores import ScoreTable

__all__ = [
    "InfoBatch",
    "InfoBatchPolicy",
    "Plan",
    "ProgressLR",
    "PrunedSampler",
    "RandomPolicy",
    "ScoreTable",
    "cosine",
]
__version__ = "0.1.0"
