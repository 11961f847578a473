"""PyTorch Lightning adapter: InfoBatch and Selective Backprop with a stock ``Trainer``.

Install with ``pip install "leanbatch[lightning]"``. One callback wires the core to
Lightning's hooks; no algorithm lives here:

- :class:`LeanBatchCallback` - pass it to ``Trainer(callbacks=[...])``; build the train
  DataLoader from its :attr:`~LeanBatchCallback.dataset` and
  :attr:`~LeanBatchCallback.sampler`; in ``training_step`` call
  :meth:`~LeanBatchCallback.select` (Selective Backprop) and return
  :meth:`~LeanBatchCallback.loss`.
- :class:`WithIndex`, :class:`EpochSampler` - what goes in the DataLoader (items that
  carry their dataset index, the core's :mod:`leanbatch.indexed`; the plan as Lightning
  counts an epoch's batches). Both are
  plain torch and import without Lightning; :class:`LeanBatchCallback` loads Lightning on
  first use and, where it is missing, says which extra to install.

Example:
    >>> from leanbatch.lightning import LeanBatchCallback, WithIndex, EpochSampler
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leanbatch.indexed import WithIndex
from leanbatch.lightning.data import EpochSampler
from leanbatch.optional import import_with_extra

if TYPE_CHECKING:
    from leanbatch.lightning.callback import LeanBatchCallback

__all__ = ["EpochSampler", "LeanBatchCallback", "WithIndex"]


def __getattr__(name: str) -> Any:
    """Load :class:`LeanBatchCallback` (and Lightning with it) on first use."""
    if name != "LeanBatchCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = import_with_extra(
        "leanbatch.lightning.callback", "lightning", ("lightning", "pytorch_lightning")
    )
    value = module.LeanBatchCallback
    globals()[name] = value
    return value
