"""What the Lightning adapter's DataLoader draws from (its items are the core's
:class:`~leanbatch.indexed.WithIndex`): :class:`EpochSampler`."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from leanbatch.sampler import PrunedSampler

__all__ = ["EpochSampler"]


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
