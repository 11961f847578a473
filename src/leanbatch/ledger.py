"""The ledger of a training run: what an iteration served, what a loader fetched, what was trained.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's one batch
ahead), so the samples a sampler has served run ahead of those an update has trained.
:class:`Iteration` keeps one ``iter()``'s served dataset indices in order, in the chunks they
were made in, dropping a chunk once trained to its end; its account (:mod:`leanbatch.accounts`)
checks the indices updates named against those served. Counts are this rank's (local);
:class:`~leanbatch.progress.Position` places them in the epoch's global order.

:class:`Fetches` holds the :data:`Key` (size, first and last dataset index) of every batch a
``DataLoader`` fetched through ``InfoBatch.__getitems__``: queued in this process, or, from a
worker process, written into one pipe this process reads (:class:`_Pipe`). An update without
indices must train a fetched batch (:meth:`Fetches.check_batch`), so a loss of the wrong length,
a second update of one batch or a batch sampler that regroups the served indices fails before a
score lands on a wrong sample; fetches no update trains (evaluation) are dropped. The pipe is
correct by construction: a key is one atomic write of 24 bytes (POSIX: at most ``PIPE_BUF``), so
writers never mix; the kernel orders it before the batch the worker then sends; a write never
blocks, and a read that finds the pipe half full checks sizes alone until the next fresh iteration.

Example:
    >>> import torch
    >>> from leanbatch.policies import full_plan
    >>> it = Iteration(0, full_plan(0, 10), world=2, rank=1, origin=0, length=5)
    >>> it.add(torch.tensor([7, 3, 9]), [7, 3, 9]); it.peek(2).tolist(), it.key(3)
    ([7, 3], (3, 7, 9))
    >>> it.mark(2); it.order_position, it.scored(3)   # rank 1's positions 5, 7, 9 hold kept samples
    (4, 3)
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import get_spawning_popen
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from leanbatch.accounts import IndexAccount
from leanbatch.misuse import size_error, why_not
from leanbatch.policies.plan import Plan

if TYPE_CHECKING:
    from leanbatch.scores import ScoreTable

__all__ = ["Fetches", "Iteration", "Key", "Serving", "Step", "front"]

Key = tuple[int, int, int]  # a batch: (size, first dataset index, last dataset index)


class Step(NamedTuple):
    """What an update trains: the plan that served it, its dataset indices (if asked), the rows that
    score, how many samples, and the iteration they come from (``None``: none is served; nothing counts).

    ``scored`` counts the leading rows that are not padding (repeats at an epoch's end so every rank
    trains as many): a padded row trains but never scores, so merging ranks' scores is order-free.

    Example:
        >>> from leanbatch.policies import full_plan
        >>> Step(full_plan(0, 4), None, 4, 4, None).scored
        4
    """

    plan: Plan
    indices: Tensor | None
    scored: int
    n: int
    iteration: Iteration | None


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
    account: IndexAccount | None = None  # the indices updates named (opened by the first that names any)
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
        if self.account is not None:
            self.account.serve(indices)

    def record(self, indices: Tensor | None, table: ScoreTable | None = None) -> None:
        """The next update names ``indices`` (the first opens the account, counting the rows of the
        score ``table``: see :class:`~leanbatch.accounts.IndexAccount`), or ``None``: some do not."""
        account = self.account
        if indices is None:
            if account is not None:
                account.exact = False  # that step's samples are served, not counted as trained
        else:
            if account is None:
                assert table is not None, "the first update that names indices opens the account"
                account = self.account = IndexAccount(table.rows, self.peek(self.in_flight), table.owner)
            account.train(indices)

    def close(self) -> None:
        """Check its account once, as it leaves the sampler (trained to its end, or left early)."""
        account, self.account = self.account, None
        if account is not None:
            account.close(self.epoch, whole=self.done)

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

    def take(self, n: int) -> Tensor:
        """:meth:`peek` the dataset indices of the next ``n`` served samples and :meth:`mark` them
        (one step)."""
        trained = self.trained
        if trained + n < self.head_end:  # the common step: inside one chunk, which stays
            self.trained = trained + n
            offset = trained - self.head
            return self.chunks[0][offset : offset + n]
        indices = self.peek(n)
        self.mark(n)
        return indices

    def mark(self, n: int) -> None:
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
        its.popleft().close()
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
        value = next(self._values, None)
        if value is not None:
            return value
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


QUEUE_LIMIT = 1024  # keys kept here: the oldest (fetches nothing trained, e.g. evaluation) age out
RECORD = struct.Struct("<3q")  # one key in the pipe: 24 bytes, one atomic write


class Fetches:
    """The keys of the batches fetched through the dataset (see the module docstring).

    Example:
        >>> f = Fetches()
        >>> f.fetched([0, 1, 2, 3]); f.fetched([7, 5, 6, 4])     # an evaluation pass, then a batch
        >>> f.match((4, 7, 4)), f.match((4, 8, 9)), Fetches().match((4, 7, 4))   # None: none fetched
        (True, False, None)
    """

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._queue: deque[Key] = deque(maxlen=QUEUE_LIMIT)
        self._pipe: _Pipe | None = None
        self.recorded = False  # a fetch was ever queued in this process

    def __getstate__(self) -> dict[str, Any]:
        # A DataLoader starting a worker by spawn (or forkserver) pickles the dataset: the worker
        # gets the pipe (multiprocessing passes its descriptor). Any other copy (pickle, deepcopy)
        # is no worker of this run: it gets none.
        return {**self.__dict__, "_pipe": self._pipe if get_spawning_popen() is not None else None}

    def track(self) -> None:
        """Receive the keys fetched by DataLoader worker processes (call before they start)."""
        if self._pipe is None:
            self._pipe = _Pipe.open()

    def fetched(self, indices: Sequence[int]) -> None:
        """A batch of dataset ``indices`` was fetched (``Dataset.__getitems__``)."""
        if not len(indices):
            return
        key = (len(indices), int(indices[0]), int(indices[-1]))
        if os.getpid() == self._owner:
            self._queue.append(key)
            self.recorded = True
        elif self._pipe is not None:
            self._pipe.write(key)

    def match(self, key: Key) -> bool | None:
        """Whether a batch with ``key`` was fetched (consumed; the fetches queued here before it are
        dropped), ``None`` when no batch was ever fetched through the dataset."""
        queue = self._queue
        if queue:
            if queue[0] == key:  # the common step: the batch this process fetched first
                queue.popleft()
                return True
            if key in queue:
                while queue.popleft() != key:
                    pass
                return True
        found = None if self._pipe is None else self._pipe.take(key)
        if found:
            queue.clear()  # fetched by a worker: the ones queued here were evaluation passes
        if not found and self._pipe is not None and self._pipe.lost:
            return None  # keys may have been dropped: the sizes alone
        return (False if self.recorded else None) if found is None else found

    def size(self, n: int) -> int | None:
        """``n`` when a batch of ``n`` samples was fetched (consumed like :meth:`match`), else the
        size of one that was, ``None`` when no batch was ever fetched through the dataset."""
        queue = self._queue
        if any(key[0] == n for key in queue):
            while queue.popleft()[0] != n:
                pass
            return n
        pipe = self._pipe
        keys = [] if pipe is None else pipe.keys()
        sized = next((key for key in keys if key[0] == n), None)
        if pipe is not None and sized is not None:
            pipe.take(sized)
            return n
        return keys[0][0] if keys else queue[0][0] if queue else None

    def like(self, key: Key) -> Key | None:
        """A fetched batch that starts where ``key`` starts (``None``: none)."""
        keys = list(self._queue) + ([] if self._pipe is None else self._pipe.keys())
        return next((k for k in keys if k[1] == key[1]), None)

    @property
    def any(self) -> bool:
        """A batch was ever fetched through the dataset (here or in a worker process)."""
        if self.recorded or self._pipe is None:
            return self.recorded
        self._pipe.read()
        return self._pipe.written

    def clear(self, workers: bool = False) -> None:
        """Forget the batches fetched in this process (an abandoned iteration's are never trained);
        ``workers``: those of worker processes too (no earlier iteration has samples in flight)."""
        self._queue.clear()
        if workers and self._pipe is not None:
            self._pipe.read()  # what was written: a full pipe drops nothing from now on
            self._pipe.pending.clear()
            self._pipe.lost = False

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
            raise ValueError(why_not(key, self.like(key), self.recorded and not self._queue))


class _Pipe:
    """The keys fetched in DataLoader worker processes: one pipe, written and read without blocking
    (see the module docstring); this process reads the keys into ``pending`` (insertion-ordered,
    the oldest aged out) and consumes them."""

    def __init__(self, reader: Any, writer: Any, capacity: int):
        self._reader, self._writer = reader, writer
        self.half = capacity // 2  # a read of this many bytes: the pipe may have been full
        self.pending: dict[Key, None] = {}
        self.written = False  # a worker ever wrote
        self.lost = False  # keys may have been dropped since the last fresh iteration

    @classmethod
    def open(cls) -> _Pipe | None:
        """A pipe, or ``None`` where the platform has no non-blocking pipes (the sizes alone)."""
        try:
            reader, writer = multiprocessing.Pipe(duplex=False)  # Connections: spawned workers get them
            os.set_blocking(reader.fileno(), False)
            os.set_blocking(writer.fileno(), False)  # a full pipe drops a key, never stalls a worker
        except (OSError, AttributeError):
            return None
        capacity = 16384  # the least a pipe holds on the platforms with non-blocking pipes
        if sys.platform.startswith("linux"):
            import fcntl

            capacity = fcntl.fcntl(writer.fileno(), 1032)  # F_GETPIPE_SZ
        return cls(reader, writer, capacity)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "pending": {}}  # a worker only writes

    def write(self, key: Key) -> None:
        """In a worker process: ``key``, in one write (dropped if the pipe is full)."""
        try:
            os.write(self._writer.fileno(), RECORD.pack(*key))
        except (BlockingIOError, BrokenPipeError):
            pass

    def keys(self) -> list[Key]:
        """Every key a worker fetched and this process did not consume (reads the pipe)."""
        self.read()
        return list(self.pending)

    def read(self) -> None:
        """Move what the workers wrote into ``pending``."""
        got, size, pending = 0, RECORD.size * 2048, self.pending
        while self._reader is not None:
            try:
                data = os.read(self._reader.fileno(), size)
            except BlockingIOError:
                break
            got += len(data)
            for key in RECORD.iter_unpack(data):
                pending[key] = None
            if len(data) < size:
                break
        if got:
            self.written = True
            self.lost = self.lost or got >= self.half
            while len(pending) > QUEUE_LIMIT:
                del pending[next(iter(pending))]

    def take(self, key: Key) -> bool | None:
        """Consume ``key`` if a worker fetched it; ``None`` when no worker ever wrote."""
        if key not in self.pending:
            self.read()
        if key in self.pending:
            del self.pending[key]
            return True
        return False if self.written else None
