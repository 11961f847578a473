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

from typing import TYPE_CHECKING

from leanbatch.indexed import WithIndex
from leanbatch.lightning.data import EpochSampler
from leanbatch.optional import lazy_getattr

if TYPE_CHECKING:
    from leanbatch.lightning.callback import LeanBatchCallback

__all__ = ["EpochSampler", "LeanBatchCallback", "WithIndex"]


# LeanBatchCallback (and Lightning with it) loaded on first use
_HOME = {"LeanBatchCallback": "leanbatch.lightning.callback"}
__getattr__ = lazy_getattr(globals(), _HOME, "lightning", ("lightning", "pytorch_lightning"))
