"""What a loader fetched through the dataset: each batch by its key, to check updates against.

``InfoBatch.__getitems__`` sees every batch a ``DataLoader`` fetches. Its :data:`Key` (size,
first and last dataset index) is queued in this process, or, in a DataLoader worker process,
written into one pipe this process reads (:class:`_Pipe`). An update without indices trains the
next samples the sampler served; :meth:`Fetches.check_batch` refuses it unless a batch with their
key was fetched, so a loss of the wrong length, a second update of one batch or a batch sampler
that regroups the served indices fails before a score lands on a wrong sample, while fetches that
no update trains (an evaluation pass through the dataset) are dropped.

The pipe is correct by construction: a key is one write of 24 bytes, and POSIX makes a write of
at most ``PIPE_BUF`` bytes to a pipe atomic, so any number of writers (any process ids, several
loaders at once) never interleave or overwrite one another; the kernel orders a worker's write
before the batch that worker then sends through the DataLoader's own pipe, so the key is readable
here before its batch is trained, on any processor; and no bound is assumed: a write never blocks,
and a read that finds the pipe half full or more (keys may have been dropped: a long evaluation
through workers with no update) turns the missing-key check into the size check until the
sampler's next fresh iteration.

Example:
    >>> f = Fetches()
    >>> f.fetched([0, 1, 2, 3]); f.fetched([7, 5, 6, 4])     # an evaluation pass, then a batch
    >>> f.match((4, 7, 4)), f.match((4, 8, 9))
    (True, False)
    >>> Fetches().match((4, 7, 4)) is None                  # nothing fetched through the dataset
    True
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import sys
from collections import deque
from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

from leanbatch.ledger import Iteration, Key

__all__ = ["Fetches", "size_error", "why_not"]

QUEUE_LIMIT = 1024  # keys kept here: the oldest (fetches nothing trained, e.g. evaluation) age out
RECORD = struct.Struct("<3q")  # one key in the pipe: 24 bytes, one atomic write


class Fetches:
    """The keys of the batches fetched through the dataset (see the module docstring)."""

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
        for i, key in enumerate(queue):
            if key[0] == n:
                for _ in range(i + 1):
                    queue.popleft()
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
    def pending(self) -> bool:
        """Batches fetched in this process are queued, not trained."""
        return bool(self._queue)

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
            raise ValueError(why_not(key, self))


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
