"""PyTorch Lightning adapter: InfoBatch and Selective Backprop with a stock ``Trainer``.

Install with ``pip install "leanbatch[lightning]"``. One callback wires the core to
Lightning's hooks; no algorithm lives here:

- :class:`LeanBatchCallback` - pass it to ``Trainer(callbacks=[...])``; build the train
  DataLoader from its :attr:`~LeanBatchCallback.dataset` and
  :attr:`~LeanBatchCallback.sampler`; in ``training_step`` call
  :meth:`~LeanBatchCallback.select` (Selective Backprop) and return
  :meth:`~LeanBatchCallback.loss`.
- :class:`WithIndex`, :class:`EpochSampler` - what goes in the DataLoader (items that
  carry their dataset index; the plan as Lightning counts an epoch's batches).

Example:
    >>> from leanbatch.lightning import LeanBatchCallback, WithIndex, EpochSampler
"""

from leanbatch.lightning.callback import LeanBatchCallback
from leanbatch.lightning.data import EpochSampler, WithIndex

__all__ = ["EpochSampler", "LeanBatchCallback", "WithIndex"]
