"""Accumulate selected rows into full-size batches (the paper's training loop).

With selection, a loaded batch of ``B`` examples leaves fewer than ``B`` to
train on. The paper's implementation keeps collecting selected examples until
``B`` are ready, so every optimiser step sees a full batch and the learning-rate
and batch-norm behaviour of the baseline is kept. :class:`BatchAccumulator` does
that for any batch structure; counts are host-side integers, so it adds no
device read of its own.
"""

from __future__ import annotations

from typing import Any

from leanbatch.selection._checks import check_int
from leanbatch.selection.batches import concat_batches, slice_batch

__all__ = ["BatchAccumulator"]


class BatchAccumulator:
    """Collect partial batches; hand out batches of exactly ``batch_size`` rows.

    Example:
        >>> import torch
        >>> acc = BatchAccumulator(4)
        >>> acc.add((torch.arange(3), torch.zeros(3)), 3)
        >>> acc.pop() is None
        True
        >>> acc.add((torch.arange(3, 6), torch.ones(3)), 3)
        >>> x, _ = acc.pop(); x.tolist()
        [0, 1, 2, 3]
        >>> x, _ = acc.flush(); x.tolist()
        [4, 5]
    """

    def __init__(self, batch_size: int):
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self._parts: list[Any] = []
        self._sizes: list[int] = []

    @property
    def pending(self) -> int:
        """Rows collected and not handed out yet."""
        return sum(self._sizes)

    def add(self, batch: Any, n: int) -> None:
        """Add a batch of ``n`` rows (ignored when ``n == 0``)."""
        if n > 0:
            self._parts.append(batch)
            self._sizes.append(n)

    def pop(self) -> Any | None:
        """A batch of ``batch_size`` rows if that many are pending, else ``None``."""
        total = self.pending
        if total < self.batch_size:
            return None
        whole = concat_batches(self._parts, self._sizes)
        head = slice_batch(whole, 0, self.batch_size, total)
        rest = total - self.batch_size
        self._parts = [slice_batch(whole, self.batch_size, total, total)] if rest else []
        self._sizes = [rest] if rest else []
        return head

    def flush(self) -> Any | None:
        """Everything pending as one (possibly smaller) batch, or ``None`` if nothing is pending."""
        if not self._parts:
            return None
        whole = concat_batches(self._parts, self._sizes)
        self._parts, self._sizes = [], []
        return whole
