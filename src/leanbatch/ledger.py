"""The ledger of a training run: what an iteration served, what a loader fetched, what was trained.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's one batch
ahead), so the samples a sampler has served run ahead of those an update has trained.
:class:`Iteration` keeps one ``iter()``'s served dataset indices in order, in the chunks they
were made in, and drops a chunk once it has been trained to its end; :class:`Fetches` keeps a
key of each batch fetched through the dataset (its size, first and last index), so an update
without indices is checked against the batch it trains. Counts are this rank's (local); :class:`Position` is where they leave training in the
epoch's global order. The :class:`~leanbatch.PrunedSampler` owns the ledgers of its run.

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

import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from leanbatch.policies.plan import Plan

__all__ = ["Fetches", "Iteration", "Key", "Position", "Step", "front", "size_error", "why_not"]

Key = tuple[int, int, int]  # a batch: (size, first dataset index, last dataset index)
WORKER_SLOTS = 256  # worker processes' rings of fetched keys (by pid modulo this)
RING = 16  # keys each worker process keeps (a worker is at most prefetch_factor batches ahead)
QUEUE_LIMIT = 1024  # keys kept in this process: the oldest (fetches nothing trained: evaluation) age out


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

    def serve(self, seed: int, chunk_size: int) -> Iterator[int]:
        """Serve the iteration's dataset indices, ``chunk_size`` positions at a time, each chunk
        recorded as served before it is yielded (the plan's keyed order; a pure function of the
        plan, ``seed`` and the positions)."""
        while self.served < self.length:
            count = min(chunk_size, self.length - self.served)
            local = torch.arange(self.served, self.served + count, dtype=torch.int64)
            idx = self.plan.serve(seed, local * self.world + (self.origin + self.rank))
            values = idx.tolist()
            self.add(idx, values)
            yield from values
        self.ran_out = True

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


class Fetches:
    """The keys of the batches a DataLoader fetched through the dataset, to check updates against.

    A fetch in this process queues its :data:`Key` in fetch order; a DataLoader worker process
    writes it into its own ring of a shared-memory table (made by :meth:`track` before workers
    start; the ring is the pid's, modulo :data:`WORKER_SLOTS`). An update without indices trains
    the next samples the sampler served; :meth:`match` says whether a batch with their key was
    fetched, dropping the fetches before it that nothing trained (an evaluation pass through the
    dataset, an abandoned iteration's read-ahead).

    Example:
        >>> f = Fetches()
        >>> f.fetched([0, 1, 2, 3]); f.fetched([7, 5, 6, 4])     # an evaluation pass, then a batch
        >>> f.match((4, 7, 4)), f.match((4, 8, 9))
        (True, False)
        >>> Fetches().match((4, 7, 4)) is None                  # nothing fetched through the dataset
        True
    """

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._queue: deque[Key] = deque(maxlen=QUEUE_LIMIT)
        self._ring: Tensor | None = None
        self._written = 0  # keys this (worker) process wrote into its ring
        self.recorded = False  # a fetch was ever queued in this process

    def track(self) -> None:
        """Share the fetched keys of DataLoader worker processes (call before they start)."""
        if self._ring is None:
            self._ring = torch.zeros(WORKER_SLOTS * RING, 3, dtype=torch.int64).share_memory_()

    def fetched(self, indices: Sequence[int]) -> None:
        """A batch of dataset ``indices`` was fetched (``Dataset.__getitems__``)."""
        if not len(indices):
            return
        key = (len(indices), int(indices[0]), int(indices[-1]))
        if os.getpid() == self._owner:
            self._queue.append(key)
            self.recorded = True
        elif self._ring is not None:  # a worker process: its own ring, written only by it
            row = (os.getpid() % WORKER_SLOTS) * RING + self._written % RING
            self._ring[row] = torch.tensor(key, dtype=torch.int64)
            self._written += 1

    def match(self, key: Key) -> bool | None:
        """Whether a batch with ``key`` was fetched (consumed; the fetches queued before it are
        dropped), ``None`` when no batch was ever fetched through the dataset."""
        queue = self._queue
        if queue:
            if queue[0] == key:  # the common step: the batch this process fetched last
                queue.popleft()
                return True
            if key in queue:
                while queue.popleft() != key:
                    pass
                return True
        ring = self._ring
        if ring is not None and bool(ring[:, 0].any()):
            found = bool((ring == torch.tensor(key, dtype=torch.int64)).all(1).any())
            if found:
                queue.clear()  # fetched here: the queued ones were evaluation passes
                return found
            return False
        return False if self.recorded else None

    def size(self, n: int) -> int | None:
        """``n`` when a batch of ``n`` samples was fetched (consumed like :meth:`match`), else the
        size of a batch that was, ``None`` when no batch was ever fetched through the dataset."""
        queue = self._queue
        for i, key in enumerate(queue):
            if key[0] == n:
                for _ in range(i + 1):
                    queue.popleft()
                return n
        ring = self._ring
        sizes = ring[:, 0] if ring is not None else None
        if sizes is not None and bool(sizes.any()):
            return n if bool((sizes == n).any()) else int(sizes.max())
        return queue[0][0] if queue else None

    def like(self, key: Key) -> Key | None:
        """A fetched batch that starts where ``key`` starts (``None``: none)."""
        found = next((k for k in self._queue if k[1] == key[1]), None)
        ring = self._ring
        if found is None and ring is not None:
            rows = ring[(ring[:, 0] > 0) & (ring[:, 1] == key[1])]
            found = (int(rows[0, 0]), key[1], int(rows[0, 2])) if len(rows) else None
        return found

    @property
    def pending(self) -> bool:
        """Batches fetched in this process are queued, not trained."""
        return bool(self._queue)

    @property
    def any(self) -> bool:
        """A batch was ever fetched through the dataset (here or in a worker process)."""
        return self.recorded or (self._ring is not None and bool(self._ring[:, 0].any()))

    def clear(self) -> None:
        """Forget the batches fetched in this process (an abandoned iteration's are never trained)."""
        self._queue.clear()

    def check_size(self, it: Iteration, n: int, subject: str) -> None:
        """Refuse ``n`` samples of ``it`` that are not the size of a batch fetched through the dataset
        (with none fetched, of the iteration's first update; a short last batch ends it)."""
        expected = self.size(n)
        if expected is None:
            expected = it.batch
            if it.trained + n == it.length and n <= expected:
                return
        if expected and n != expected:
            raise ValueError(size_error(subject, n, expected))

    def check_batch(self, it: Iteration, n: int) -> None:
        """Refuse an update without indices whose ``n`` losses are not the next batch ``it`` served and
        a loader fetched: the wrong size, a second update of one batch, a batch the loader regrouped."""
        key = it.key(n)
        found = self.match(key)
        if found is None:  # nothing fetched through the dataset: the sizes alone
            self.check_size(it, n, "loss")
        elif not found:
            raise ValueError(why_not(key, self))


def front(its: deque[Iteration], n: int) -> Iteration | None:
    """The iteration the next ``n`` trained samples come from: an older one (a consumer reading
    ahead across epochs) while they fit in what it has in flight; what it served but nobody
    trained (a DataLoader's ``drop_last`` remainder) is dropped from ``its``."""
    while len(its) > 1 and (its[0].done or its[0].in_flight < n):
        its.popleft()
    return its[0] if its else None


def size_error(subject: str, n: int, expected: int) -> str:
    """The message for an update of ``n`` samples where the batch it trains has ``expected``."""
    return (
        f"{subject} has {n} entries but the batch it trains has {expected}: pass the whole batch, in "
        "order (one loss per sample, reduction='none', nothing filtered out), one update() per batch; "
        "for a subset of the batch pass its rows: update(loss, indices, positions=rows)"
    )


def why_not(key: Key, fetches: Fetches) -> str:
    """Why an update of the next served samples ``key`` matches no fetched batch: the message."""
    n, first, last = key
    like = fetches.like(key)
    if like is not None and like[0] != n:
        return size_error("loss", n, like[0])
    if fetches.recorded and not fetches.pending:
        return (
            f"update() was given {n} losses but no batch was fetched since the last update(): call "
            "update() once per batch, with every loss of it (for two heads, add their per-sample losses "
            "and update once; for a selected subset, update(loss, indices, positions=rows))"
        )
    return (
        f"update(loss) trains the next {n} samples ds.sampler served (dataset indices {first} .. {last}) "
        "but no batch fetched through the dataset holds them: a batch sampler that reorders or regroups "
        "ds.sampler's indices (length bucketing) needs the batch's dataset indices, update(loss, "
        "indices); otherwise pass one loss per sample of the batch (reduction='none'), one update() "
        "per batch"
    )
