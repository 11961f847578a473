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

if TYPE_CHECKING:  # what a type checker sees; at run time, _HOME (a test keeps the two equal)
    from leanbatch.infobatch import InfoBatch
    from leanbatch.keyed_scores import KeyedScoreTable
    from leanbatch.losses import per_sequence_loss
    from leanbatch.packing import packed_sequence_ids
    from leanbatch.policies.budget import EpsilonGreedyPolicy, RS2Policy, UCBPolicy
    from leanbatch.policies.infobatch import InfoBatchPolicy, RandomPolicy
    from leanbatch.policies.loss_rank import LossRankPolicy
    from leanbatch.policies.plan import Plan
    from leanbatch.policies.seta import SeTaPolicy
    from leanbatch.progress import training_progress
    from leanbatch.sampler import PrunedSampler
    from leanbatch.schedule import ProgressLR, cosine
    from leanbatch.scores import ScoreTable
    from leanbatch.selection.functional import select_using_loss, selection_losses
    from leanbatch.selection.layout import Selection
    from leanbatch.selection.online import OnlineBatchSelection
    from leanbatch.selection.proxy import ProxyScorer
    from leanbatch.selection.rules import select_by_loss_rank, select_indices
    from leanbatch.selection.schedule import should_selective_backprop
    from leanbatch.selection.selective_backprop import SelectiveBackprop
    from leanbatch.selection.tokens import TokenSelection
    from leanbatch.streams import StreamInfoBatch

_HOME = {
    "InfoBatch": "leanbatch.infobatch",
    "PrunedSampler": "leanbatch.sampler",
    "ScoreTable": "leanbatch.scores",
    "KeyedScoreTable": "leanbatch.keyed_scores",
    "StreamInfoBatch": "leanbatch.streams",
    "Plan": "leanbatch.policies.plan",
    "InfoBatchPolicy": "leanbatch.policies.infobatch",
    "RandomPolicy": "leanbatch.policies.infobatch",
    "RS2Policy": "leanbatch.policies.budget",
    "EpsilonGreedyPolicy": "leanbatch.policies.budget",
    "UCBPolicy": "leanbatch.policies.budget",
    "SeTaPolicy": "leanbatch.policies.seta",
    "LossRankPolicy": "leanbatch.policies.loss_rank",
    "training_progress": "leanbatch.progress",
    "ProgressLR": "leanbatch.schedule",
    "cosine": "leanbatch.schedule",
    "per_sequence_loss": "leanbatch.losses",
    "packed_sequence_ids": "leanbatch.packing",
    "SelectiveBackprop": "leanbatch.selection.selective_backprop",
    "OnlineBatchSelection": "leanbatch.selection.online",
    "ProxyScorer": "leanbatch.selection.proxy",
    "Selection": "leanbatch.selection.layout",
    "select_using_loss": "leanbatch.selection.functional",
    "selection_losses": "leanbatch.selection.functional",
    "should_selective_backprop": "leanbatch.selection.schedule",
    "select_by_loss_rank": "leanbatch.selection.rules",
    "select_indices": "leanbatch.selection.rules",
    "TokenSelection": "leanbatch.selection.tokens",
}
__all__ = sorted(_HOME)
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
