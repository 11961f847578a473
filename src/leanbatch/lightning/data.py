"""What the Lightning adapter puts in the DataLoader: items that carry their index, and the sampler.

:class:`WithIndex` makes every item carry its dataset index, so the index travels with
the batch through collation, worker processes and Lightning's transfer to the device.
:class:`EpochSampler` is the :class:`~leanbatch.sampler.PrunedSampler` as Lightning
counts batches: on a resumed epoch Lightning keeps counting from the batches already
trained, so the length it reads must be the whole epoch's, not what is left of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset, Sampler

from leanbatch.sampler import PrunedSampler

__all__ = ["EpochSampler", "WithIndex", "join_index", "split_index"]


class WithIndex(Dataset):
    """Each item of ``dataset`` together with its index: appended to tuples, under ``key`` in dicts.

    ``(x, y)`` becomes ``(x, y, i)`` (a plain tuple, for namedtuples and lists too);
    ``{"x": ..., "y": ...}`` becomes ``{"x": ..., "y": ..., "index": i}``; any other item ``v``
    becomes ``(v, i)``. Collated batches then hold the
    dataset indices as their last element (or under ``key``), as an int64 tensor.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> ds = WithIndex(TensorDataset(torch.tensor([5.0, 6.0]), torch.tensor([0, 1])))
        >>> ds[1]
        (tensor(6.), tensor(1), 1)
        >>> WithIndex([{"x": 1.0}], key="idx")[0]
        {'x': 1.0, 'idx': 0}
    """

    def __init__(self, dataset: Any, key: str = "index"):
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str (the dict key of the index), got {key!r}")
        self.dataset = dataset
        self.key = key

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        item = self.dataset[index]
        if isinstance(item, Mapping):
            if self.key in item:
                raise KeyError(
                    f"the dataset's items already have a {self.key!r} key: pick another index_key= for the "
                    "dataset index"
                )
            return {**item, self.key: index}
        if isinstance(item, (tuple, list)):
            return (*item, index)
        return (item, index)


def split_index(batch: Any, key: str) -> tuple[Any, Tensor]:
    """``(batch without its indices, indices)`` for a batch of :class:`WithIndex` items.

    Example:
        >>> import torch
        >>> split_index((torch.ones(2), torch.tensor([7, 9])), "index")
        ((tensor([1., 1.]),), tensor([7, 9]))
    """
    if isinstance(batch, Mapping):
        if key not in batch:
            raise KeyError(f"the batch has no {key!r} key: build the train DataLoader with lb.dataset")
        return {k: v for k, v in batch.items() if k != key}, batch[key]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and isinstance(batch[-1], Tensor):
        return tuple(batch[:-1]), batch[-1]
    raise TypeError(
        "the batch does not end with its dataset indices: build the train DataLoader with lb.dataset "
        f"(tuple items get their index appended, dict items under {key!r}), got {type(batch).__name__}"
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


class EpochSampler(Sampler[int]):
    """A :class:`~leanbatch.sampler.PrunedSampler` whose ``len()`` is the whole epoch being trained.

    Serving is the wrapped sampler's (a resumed epoch serves what is left of it); only the
    length differs on a resumed epoch: Lightning counts the batches trained before the
    checkpoint and reads the loader's length as the epoch's, so this reports the whole
    epoch, its trained part included. Once ``num_epochs`` epochs are trained the length is 0
    and nothing is planned (Lightning reads it once more when it tears the loader down).
    ``set_epoch`` is forwarded.

    Example:
        >>> import torch
        >>> from leanbatch import InfoBatch
        >>> ib = InfoBatch(list(range(10)), num_epochs=2)
        >>> s = EpochSampler(ib.sampler, num_epochs=2)
        >>> it = iter(s); _ = [next(it) for _ in range(4)]
        >>> _ = ib.update(torch.ones(4), ib.next_indices(4))
        >>> state = ib.state_dict()
        >>> ib.load_state_dict(state)                   # resumed 4 samples into epoch 0
        >>> len(ib.sampler), len(s), len(list(s))       # left, whole epoch, served
        (6, 10, 6)
    """

    def __init__(self, sampler: PrunedSampler, num_epochs: int | None = None):
        if not isinstance(sampler, PrunedSampler):
            raise TypeError(f"sampler must be a leanbatch PrunedSampler, got {type(sampler).__name__}")
        self.sampler = sampler
        self.num_epochs = num_epochs
        self._counted: tuple[int, int] | None = None  # (epoch, samples Lightning counted before a resume)

    def __iter__(self) -> Iterator[int]:
        if self._over():
            return iter(())  # training is over (a resumed finished fit): nothing to plan or serve
        return iter(self.sampler)

    def __len__(self) -> int:
        if self._over():
            return 0
        sampler = self.sampler
        if self._counted is not None and self._counted[0] == sampler.epoch:
            return self._counted[1] + len(sampler)  # resumed: Lightning's count, then what is left
        self._counted = None
        return sampler.epoch_length()

    def counted_before(self, epoch: int, samples: int) -> None:
        """Lightning counted ``samples`` of ``epoch`` on this rank before a resume (its batches done x
        the batch size): the epoch's length is that plus what the sampler has left, on any number of
        ranks (the same world gives the whole epoch again)."""
        self._counted = (epoch, samples)

    def _over(self) -> bool:
        return self.num_epochs is not None and self.sampler.epoch >= self.num_epochs

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the wrapped sampler (Lightning calls it at every epoch start)."""
        self.sampler.set_epoch(epoch)
