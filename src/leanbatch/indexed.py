"""Items that carry their dataset index, so a batch names its samples: the one home for Lightning's
``lb.dataset``, Hugging Face's training items and a plain loop's.

:class:`WithIndex` attaches ``i`` to ``dataset[i]``. Two layouts, one rule each:

- ``flat=True`` (a collated batch carries its indices, for a loop or Lightning that reads them):
  tuples ``(x, y)`` become ``(x, y, i)``, mappings get ``i`` under ``key``, any other item ``v``
  becomes ``(v, i)``; :func:`split_index` takes the int64 tensor out of the collated batch and
  :func:`join_index` puts it back.
- ``flat=False`` (the indices ride beside the batch, for a collator that must not see them): a
  ``dict`` gets ``i`` under ``key`` (a column that survives column filters such as the
  Hugging Face Trainer's), any other item is wrapped, and
  :func:`untag` gives the items back exactly as the dataset returned them, with their indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["WithIndex", "join_index", "split_index", "untag"]


class _Tagged(NamedTuple):
    """A non-dict item and its dataset index (``flat=False``), taken apart by :func:`untag`."""

    idx: int
    item: Any


class WithIndex(Dataset):
    """Each item of ``dataset`` together with its index (the module docstring gives both layouts).

    ``key`` is where mapping items (``flat=False``: dict items) carry the index; items that
    already hold that key are refused at the first such item.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> ds = WithIndex(TensorDataset(torch.tensor([5.0, 6.0]), torch.tensor([0, 1])))
        >>> ds[1]
        (tensor(6.), tensor(1), 1)
        >>> WithIndex([{"x": 1.0}], key="idx")[0]
        {'x': 1.0, 'idx': 0}
        >>> WithIndex([(1, 2)], flat=False)[0]
        _Tagged(idx=0, item=(1, 2))
    """

    def __init__(self, dataset: Any, key: str = "index", *, flat: bool = True):
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str (the dict key of the index), got {key!r}")
        self.dataset = dataset
        self.key = key
        self.flat = bool(flat)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        item, index = self.dataset[index], int(index)
        if type(item) is dict or (self.flat and isinstance(item, Mapping)):
            if self.key in item:
                raise ValueError(
                    f"the dataset's items already have a {self.key!r} key, where their dataset index goes: "
                    "rename that key in the items, or pick another key for the index (index_key=)"
                )
            return {**item, self.key: index}
        if not self.flat:
            return _Tagged(index, item)
        if isinstance(item, (tuple, list)):
            return (*item, index)
        return (item, index)


def untag(items: list[Any], key: str) -> tuple[list[Any], list[int]] | None:
    """``(items as the dataset returned them, their indices)`` for items of ``WithIndex(..., flat=False)``;
    ``None`` for items that carry no index (an evaluation pass's).

    Example:
        >>> ds = WithIndex([{"a": 1}, "b"], key="i", flat=False)
        >>> untag([ds[1], ds[0]], "i"), untag([{"a": 1}], "i")
        ((['b', {'a': 1}], [1, 0]), None)
    """
    first = items[0] if items else None
    if not (isinstance(first, _Tagged) or (isinstance(first, Mapping) and key in first)):
        return None
    indices, out = [], []
    for it in items:
        if isinstance(it, _Tagged):
            indices.append(it.idx)
            out.append(it.item)
        else:
            indices.append(it[key])
            out.append({k: v for k, v in it.items() if k != key})
    return out, indices


def split_index(batch: Any, key: str) -> tuple[Any, Tensor]:
    """``(batch without its indices, indices)`` for a collated batch of ``WithIndex`` items (``flat=True``).

    Example:
        >>> import torch
        >>> split_index((torch.ones(2), torch.tensor([7, 9])), "index")
        ((tensor([1., 1.]),), tensor([7, 9]))
    """
    if isinstance(batch, Mapping):
        if key not in batch:
            raise KeyError(
                f"the batch has no {key!r} key: build the train DataLoader on WithIndex(dataset) "
                "(Lightning: lb.dataset)"
            )
        return {k: v for k, v in batch.items() if k != key}, batch[key]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and isinstance(batch[-1], Tensor):
        return tuple(batch[:-1]), batch[-1]
    raise TypeError(
        "the batch does not end with its dataset indices: build the train DataLoader on WithIndex(dataset) "
        f"(Lightning: lb.dataset; tuple items get their index appended, dict items under {key!r}), got "
        f"{type(batch).__name__}"
    )


def join_index(rest: Any, indices: Tensor, key: str) -> Any:
    """The inverse of :func:`split_index`.

    Example:
        >>> import torch
        >>> join_index({"x": torch.ones(1)}, torch.tensor([4]), "index")
        {'x': tensor([1.]), 'index': tensor([4])}
    """
    if isinstance(rest, Mapping):
        return {**rest, key: indices}
    return (*rest, indices)
