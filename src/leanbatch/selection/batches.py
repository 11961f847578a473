"""Batch structures: a tensor, a tuple/list (namedtuples too), or a dict of tensors.

Selection keeps a subset of a batch's rows. Every tensor leaf whose first dimension is the batch
size is a per-example tensor and is indexed; every other leaf (scalars, strings, tensors of another
length) passes through unchanged, so the dataset indices, InfoBatch loss weights and attention masks
a loader yields stay aligned with the kept rows. The structure is rebuilt with the input's own type
where possible (tuple, namedtuple, list, dict, OrderedDict, Hugging Face ``BatchEncoding``).
:class:`BatchAccumulator` collects selected rows into full-size batches (the paper's loop).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_int


def is_batch(batch: Any) -> bool:
    """Whether ``batch`` is a structure selection understands (tensor, tuple/list, mapping).

    Example:
        >>> is_batch((1, 2)), is_batch("text")
        (True, False)
    """
    return isinstance(batch, (Tensor, Mapping)) or (
        isinstance(batch, Sequence) and not isinstance(batch, str)
    )


def map_leaves(batch: Any, fn: Callable[[Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor leaf of ``batch``; non-tensor leaves pass through."""
    return _zip_leaves([batch], lambda leaves: fn(leaves[0]))


def _zip_leaves(parts: list[Any], fn: Callable[[list[Tensor]], Any]) -> Any:
    """``fn`` of the tensor leaves at each place of structurally identical ``parts``, rebuilt as
    the first; other leaves are the first's."""
    first = parts[0]
    if isinstance(first, Tensor):
        return fn(parts)
    if isinstance(first, Mapping):
        mapping = {k: _zip_leaves([p[k] for p in parts], fn) for k in first}
        if type(first) is dict:
            return mapping
        try:
            return type(first)(mapping)  # type: ignore[call-arg]
        except Exception:  # a mapping type that cannot be built from a dict: a plain dict is still right
            return mapping
    if isinstance(first, (tuple, list)):
        items = [_zip_leaves([p[i] for p in parts], fn) for i in range(len(first))]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
            return type(first)(*items)
        return tuple(items) if isinstance(first, tuple) else items
    return first


def first_tensor(batch: Any) -> Tensor | None:
    """The first tensor leaf with at least one dimension, depth first (``None`` if there is none).

    Example:
        >>> import torch
        >>> first_tensor({"n": torch.tensor(3), "x": torch.zeros(4, 2)}).shape
        torch.Size([4, 2])
    """
    if isinstance(batch, Tensor):
        return batch if batch.dim() > 0 else None
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    )
    for v in values:
        t = first_tensor(v)
        if t is not None:
            return t
    return None


def _per_example(t: Tensor, n: int) -> bool:
    return t.dim() > 0 and t.shape[0] == n


def index_batch(batch: Any, positions: Tensor, n: int) -> Any:
    """Keep rows ``positions`` of every per-example tensor (first dimension ``n``) of ``batch``.

    ``positions`` is copied to a leaf's device when they differ; copying device
    positions to a CPU leaf reads from the device, so keep per-example tensors on
    the training device when the step must stay sync-free.

    Example:
        >>> import torch
        >>> batch = {"x": torch.arange(8).view(4, 2), "y": torch.tensor([0, 1, 2, 3]), "tag": "digits"}
        >>> out = index_batch(batch, torch.tensor([1, 3]), n=4)
        >>> out["x"].tolist(), out["y"].tolist(), out["tag"]
        ([[2, 3], [6, 7]], [1, 3], 'digits')
    """
    cache: dict[torch.device, Tensor] = {positions.device: positions}

    def take(t: Tensor) -> Tensor:
        if not _per_example(t, n):
            return t
        pos = cache.get(t.device)
        if pos is None:
            pos = cache[t.device] = positions.to(t.device, non_blocking=True)
        return t.index_select(0, pos)

    return map_leaves(batch, take)


def slice_batch(batch: Any, start: int, stop: int, n: int) -> Any:
    """Rows ``start:stop`` of every per-example tensor (views, no copy)."""
    return map_leaves(batch, lambda t: t[start:stop] if _per_example(t, n) else t)


def concat_batches(batches: Sequence[Any], sizes: Sequence[int]) -> Any:
    """Concatenate structurally identical batches of ``sizes`` rows along their per-example tensors.

    Non-per-example leaves are taken from the first batch.
    """
    if len(batches) != len(sizes) or not batches:
        raise ValueError("concat_batches needs one size per batch and at least one batch")
    if len(batches) == 1:
        return batches[0]
    return _zip_leaves(list(batches), lambda ts: torch.cat(ts) if _per_example(ts[0], sizes[0]) else ts[0])


class BatchAccumulator:
    """Collect partial batches; hand out batches of exactly ``batch_size`` rows.

    Counts are host-side integers, so it adds no device read of its own.
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
        whole = self.flush()
        self.add(slice_batch(whole, self.batch_size, total, total), total - self.batch_size)
        return slice_batch(whole, 0, self.batch_size, total)

    def flush(self) -> Any | None:
        """Everything pending as one (possibly smaller) batch, or ``None`` if nothing is pending."""
        if not self._parts:
            return None
        whole = concat_batches(self._parts, self._sizes)
        self._parts, self._sizes = [], []
        return whole
