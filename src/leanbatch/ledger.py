"""The ledger of a training run: what an iteration served, and what was trained of it.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's one batch
ahead), so the samples a sampler has served run ahead of those an update has trained.
:class:`Iteration` keeps one ``iter()``'s served dataset indices in order, in the chunks they
were made in, and drops a chunk once it has been trained to its end (what a loader fetched is
:mod:`leanbatch.fetches`'). Counts are this rank's (local); :class:`Position` is where they
leave training in the epoch's global order. The :class:`~leanbatch.PrunedSampler` owns them.

Example:
    >>> import torch
    >>> from leanbatch.policies import full_plan
    >>> it = Iteration(0, full_plan(0, 10), world=2, rank=1, origin=0, length=5)
    >>> it.add(torch.tensor([7, 3, 9]), [7, 3, 9]); it.peek(2).tolist(), it.key(3)
    ([7, 3], (3, 7, 9))
    >>> it.take(2); it.order_position, it.scored(3)   # rank 1's positions 5, 7, 9 hold kept samples
    (4, 3)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from leanbatch.policies.plan import Plan

__all__ = ["Iteration", "Key", "Position", "Serving", "Step", "front"]

Key = tuple[int, int, int]  # a batch: (size, first dataset index, last dataset index)


class Position(NamedTuple):
    """Where training stands: ``trained`` of the ``length`` samples of epoch ``epoch`` (global order).

    ``length`` is 0 while the epoch is not planned yet. A fully trained epoch ``e`` reads
    ``Position(e + 1, 0, ...)``.

    Example:
        >>> Position(2, 30, 120).fraction
        0.25
    """

    epoch: int
    trained: int
    length: int

    @property
    def fraction(self) -> float:
        """The share of the epoch trained (0 while it is not planned)."""
        return self.trained / self.length if self.length else 0.0


class Step(NamedTuple):
    """What an update trains: the plan that served it, its dataset indices (if asked), the rows that score.

    ``scored`` counts the leading rows that are not padding: padding repeats samples at the end
    of an epoch so every rank trains as many; a padded row trains but never scores, so each
    sample is scored at most once per epoch and merging the ranks' scores is order-free.

    Example:
        >>> from leanbatch.policies import full_plan
        >>> Step(full_plan(0, 4), None, 4).scored
        4
    """

    plan: Plan
    indices: Tensor | None
    scored: int


@dataclass
class Iteration:
    """One ``iter()`` over one epoch's plan, and the ledger of what it served but has not trained.

    This rank serves the global positions ``origin + rank + k * world`` for local ``k`` in
    ``0 .. length - 1``; ``served`` runs ahead of ``trained`` by what the loader has read ahead,
    and ``chunks`` hold those served, untrained indices in order (see the module's example).
    """

    epoch: int
    plan: Plan
    world: int
    rank: int
    origin: int  # the global position this iteration started at
    length: int  # local samples it serves
    served: int = 0
    trained: int = 0
    chunks: deque[Tensor] = field(default_factory=deque)
    lists: deque[list[int]] = field(default_factory=deque)  # the same chunks as Python ints (keys)
    head: int = 0  # local position of chunks[0][0]
    head_end: int = 0  # local position just past chunks[0]
    ran_out: bool = False  # the consumer pulled past its last sample
    passed: bool = False  # ... after training all of it: the loop's pass is over (len(): the next epoch's)
    batch: int = 0  # size of its first update (checks later ones when no fetch is recorded)
    inside: int = field(init=False)  # local positions holding a kept sample (the rest is padding)

    def __post_init__(self) -> None:
        self.inside = self.plan.inside(self.origin, self.rank, self.world)

    @property
    def done(self) -> bool:
        """Every sample of the iteration has been trained."""
        return self.trained == self.length

    @property
    def in_flight(self) -> int:
        """Served samples not trained yet."""
        return self.served - self.trained

    @property
    def order_position(self) -> int:
        """The position reached in the epoch's order: ``origin + trained * world``, at most its length."""
        return min(self.plan.order_length, self.origin + self.trained * self.world)

    def scored(self, n: int) -> int:
        """How many of the next ``n`` local samples are not padding."""
        return min(n, max(0, self.inside - self.trained))

    def add(self, indices: Tensor, values: list[int]) -> None:
        """Record the next served chunk of dataset indices (``values``: the same, as Python ints)."""
        if not self.chunks:
            self.head, self.head_end = self.served, self.served + len(values)
        self.chunks.append(indices)
        self.lists.append(values)
        self.served += len(values)

    def serve(self, seed: int, chunk_size: int, asked: Callable[[Iteration], None]) -> Serving:
        """The iterator one ``iter()`` returns: the iteration's dataset indices, ``chunk_size``
        positions at a time, each chunk recorded as served before it is yielded (the plan's keyed
        order; a pure function of the plan, ``seed`` and the positions). Every ask past the end
        calls ``asked(self)``."""
        return Serving(self, seed, chunk_size, asked)

    def key(self, n: int) -> Key:
        """The :data:`Key` of the next ``n`` served, untrained samples (``n`` >= 1, served)."""
        offset, last = self.trained - self.head, self.trained + n - 1 - self.head
        for values in self.lists:
            if last < len(values):
                return n, self.lists[0][offset], values[last]
            last -= len(values)
        raise AssertionError("key() of samples not served")

    def train(self, n: int) -> Tensor:
        """The dataset indices of the next ``n`` served samples, marked trained (one step)."""
        trained = self.trained
        if trained + n < self.head_end:  # the common step: inside one chunk, which stays
            self.trained = trained + n
            offset = trained - self.head
            return self.chunks[0][offset : offset + n]
        indices = self.peek(n)
        self.take(n)
        return indices

    def take(self, n: int) -> None:
        """Mark the next ``n`` served samples trained, dropping chunks trained to their end."""
        self.trained += n
        while self.trained >= self.head_end and self.chunks:
            self.chunks.popleft()
            self.lists.popleft()
            self.head = self.head_end
            self.head_end += self.chunks[0].numel() if self.chunks else 0

    def peek(self, n: int) -> Tensor:
        """The dataset indices of the next ``n`` served, untrained samples (nothing marked)."""
        offset = self.trained - self.head
        if self.trained + n <= self.head_end:  # the common step: within one chunk
            return self.chunks[0][offset : offset + n]
        parts, need = [], n
        for chunk in self.chunks:
            step = min(need, chunk.numel() - offset)
            parts.append(chunk[offset : offset + step])
            need, offset = need - step, 0
            if not need:
                break
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def front(its: deque[Iteration], n: int) -> Iteration | None:
    """The iteration the next ``n`` trained samples come from: an older one (a consumer reading
    ahead across epochs) while they fit in what it has in flight; what it served but nobody
    trained (a DataLoader's ``drop_last`` remainder) is dropped from ``its``."""
    while len(its) > 1 and (its[0].done or its[0].in_flight < n):
        its.popleft()
    return its[0] if its else None


class Serving:
    """What ``iter(sampler)`` returns: an iterator object, not a generator, so that every ask past
    the end is seen (an exhausted generator runs no code). torch's ``BatchSampler`` asks once more
    after the last batch has been trained (the ``islice`` of the batch after it; after a short last
    batch, a second time), so "every sample trained, and asked again" is the end of the loop's pass.

    Example:
        >>> from leanbatch.policies import full_plan
        >>> it = Iteration(0, full_plan(0, 3), world=1, rank=0, origin=0, length=3)
        >>> serving = it.serve(0, 2, lambda it: print("asked past the end, trained", it.trained))
        >>> sorted(serving), iter(serving) is serving
        asked past the end, trained 0
        ([0, 1, 2], True)
    """

    __slots__ = ("_it", "_seed", "_chunk", "_asked", "_values")

    def __init__(self, it: Iteration, seed: int, chunk_size: int, asked: Callable[[Iteration], None]):
        self._it, self._seed, self._chunk, self._asked = it, seed, chunk_size, asked
        self._values: Iterator[int] = iter(())

    def __iter__(self) -> Serving:
        return self

    def __next__(self) -> int:
        try:
            return next(self._values)
        except StopIteration:
            pass
        it = self._it
        if it.served >= it.length:
            it.ran_out = True
            self._asked(it)
            raise StopIteration
        count = min(self._chunk, it.length - it.served)
        local = torch.arange(it.served, it.served + count, dtype=torch.int64)
        idx = it.plan.serve(self._seed, local * it.world + (it.origin + it.rank))
        values = idx.tolist()
        it.add(idx, values)
        self._values = iter(values)
        return next(self._values)
