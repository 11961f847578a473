"""Batch structures: a tensor, a tuple/list (namedtuples too), or a dict of tensors.

Selection keeps a subset of a batch's rows. Every tensor leaf whose first
dimension is the batch size is a per-example tensor and is indexed; every other
leaf (scalars, strings, tensors of another length) passes through unchanged. So
extra per-example tensors the loader yields - dataset indices, InfoBatch loss
weights, attention masks - stay aligned with the kept rows for free.

The structure is rebuilt with the input's own type where possible (tuple,
namedtuple, list, dict, OrderedDict, Hugging Face ``BatchEncoding``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["first_tensor", "index_batch", "slice_batch", "concat_batches", "is_batch"]


def is_batch(batch: Any) -> bool:
    """Whether ``batch`` is a structure selection understands (tensor, tuple/list, mapping)."""
    return isinstance(batch, (Tensor, Mapping)) or (
        isinstance(batch, Sequence) and not isinstance(batch, str)
    )


def _rebuild_sequence(template: Sequence[Any], items: list[Any]) -> Any:
    if isinstance(template, tuple) and hasattr(template, "_fields"):  # namedtuple
        return type(template)(*items)
    if isinstance(template, tuple):
        return tuple(items)
    if isinstance(template, list):
        return items
    return items


def _rebuild_mapping(template: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if type(template) is dict:
        return items
    try:
        return type(template)(items)  # type: ignore[call-arg]
    except Exception:  # a mapping type that cannot be built from a dict: a plain dict is still right
        return items


def map_leaves(batch: Any, fn: Callable[[Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor leaf of ``batch``; non-tensor leaves pass through."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: map_leaves(v, fn) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return _rebuild_sequence(batch, [map_leaves(v, fn) for v in batch])
    return batch


def first_tensor(batch: Any) -> Tensor | None:
    """The first tensor leaf with at least one dimension, depth first (``None`` if there is none)."""
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

    Example:
        >>> import torch
        >>> a = (torch.zeros(2, 3), torch.tensor([0, 1]))
        >>> b = (torch.ones(1, 3), torch.tensor([2]))
        >>> x, y = concat_batches([a, b], [2, 1])
        >>> x.shape, y.tolist()
        (torch.Size([3, 3]), [0, 1, 2])
    """
    if len(batches) != len(sizes) or not batches:
        raise ValueError("concat_batches needs one size per batch and at least one batch")
    if len(batches) == 1:
        return batches[0]
    head, n0 = batches[0], sizes[0]

    def walk(parts: list[Any]) -> Any:
        first = parts[0]
        if isinstance(first, Tensor):
            if _per_example(first, n0):
                return torch.cat(parts, dim=0)
            return first
        if isinstance(first, Mapping):
            return _rebuild_mapping(first, {k: walk([p[k] for p in parts]) for k in first})
        if isinstance(first, (tuple, list)):
            return _rebuild_sequence(first, [walk([p[i] for p in parts]) for i in range(len(first))])
        return first

    return walk([head, *batches[1:]])
