"""leanbatch: skip the training work your model does not need, and measure whether it paid.

Example:
    >>> from leanbatch import InfoBatch, SelectiveBackprop, select_using_loss
    >>> from leanbatch import RS2Policy, UCBPolicy, SeTaPolicy, ProxyScorer, OnlineBatchSelection

``import leanbatch`` itself is light: each name below is imported (with torch) on first use,
so the ``leanbatch`` command starts at once and can answer a Ctrl-C during torch's import with
one line instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanbatch.infobatch import InfoBatch
    from leanbatch.losses import per_sequence_loss
    from leanbatch.policies import (
        EpsilonGreedyPolicy,
        InfoBatchPolicy,
        LossRankPolicy,
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
        select_by_loss_rank,
        select_indices,
        select_using_loss,
        selection_losses,
        should_selective_backprop,
    )

# where each public name lives; imported on first use by __getattr__
_HOME = {
    "InfoBatch": "leanbatch.infobatch",
    "EpsilonGreedyPolicy": "leanbatch.policies",
    "InfoBatchPolicy": "leanbatch.policies",
    "LossRankPolicy": "leanbatch.policies",
    "Plan": "leanbatch.policies",
    "RandomPolicy": "leanbatch.policies",
    "RS2Policy": "leanbatch.policies",
    "SeTaPolicy": "leanbatch.policies",
    "UCBPolicy": "leanbatch.policies",
    "PrunedSampler": "leanbatch.sampler",
    "ProgressLR": "leanbatch.schedule",
    "cosine": "leanbatch.schedule",
    "ScoreTable": "leanbatch.scores",
    "OnlineBatchSelection": "leanbatch.selection",
    "ProxyScorer": "leanbatch.selection",
    "Selection": "leanbatch.selection",
    "SelectiveBackprop": "leanbatch.selection",
    "per_sequence_loss": "leanbatch.losses",
    "select_by_loss_rank": "leanbatch.selection",
    "select_indices": "leanbatch.selection",
    "select_using_loss": "leanbatch.selection",
    "selection_losses": "leanbatch.selection",
    "should_selective_backprop": "leanbatch.selection",
    "training_progress": "leanbatch.progress",
}

__all__ = [
    "EpsilonGreedyPolicy",
    "InfoBatch",
    "InfoBatchPolicy",
    "LossRankPolicy",
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
]  # the names of _HOME
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name (or a subpackage, e.g. ``leanbatch.selection``) on first use."""
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
