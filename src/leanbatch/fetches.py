"""What a loader fetched through the dataset: each batch by its key, to check updates against.

``InfoBatch.__getitems__`` sees every batch a ``DataLoader`` fetches. Its :data:`Key` (size,
first and last dataset index) is queued in this process, or, in a DataLoader worker process,
written into that worker's own ring of one shared-memory table (read here through a ``ctypes``
view: no tensor operation and no numpy per step). An update without indices trains the next
samples the sampler served; :meth:`Fetches.check_batch` refuses it unless a batch with their key
was fetched, so a loss of the wrong length, a second update of one batch or a batch sampler that
regroups the served indices fails before a score lands on a wrong sample, while fetches that no
update trains (an evaluation pass through the dataset) are dropped.

Example:
    >>> f = Fetches()
    >>> f.fetched([0, 1, 2, 3]); f.fetched([7, 5, 6, 4])     # an evaluation pass, then a batch
    >>> f.match((4, 7, 4)), f.match((4, 8, 9))
    (True, False)
    >>> Fetches().match((4, 7, 4)) is None                  # nothing fetched through the dataset
    True
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from leanbatch.ledger import Iteration, Key

__all__ = ["Fetches", "size_error", "why_not"]

WORKER_SLOTS = 256  # worker processes' rings (a worker's is its pid's, modulo this)
RING = 16  # keys a worker's ring holds (a worker is at most prefetch_factor batches ahead)
QUEUE_LIMIT = 1024  # keys kept here: the oldest (fetches nothing trained, e.g. evaluation) age out
HEAD = 1 + WORKER_SLOTS  # the table: [0] a worker wrote, [1 + s] keys slot s wrote, then the rings


class Fetches:
    """The keys of the batches fetched through the dataset (see the module docstring)."""

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._queue: deque[Key] = deque(maxlen=QUEUE_LIMIT)
        self._rings: _Rings | None = None
        self.recorded = False  # a fetch was ever queued in this process

    def track(self) -> None:
        """Share the keys fetched by DataLoader worker processes (call before they start)."""
        if self._rings is None:
            self._rings = _Rings()

    def fetched(self, indices: Sequence[int]) -> None:
        """A batch of dataset ``indices`` was fetched (``Dataset.__getitems__``)."""
        if not len(indices):
            return
        key = (len(indices), int(indices[0]), int(indices[-1]))
        if os.getpid() == self._owner:
            self._queue.append(key)
            self.recorded = True
        elif self._rings is not None:
            self._rings.write(key)

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
        found = None if self._rings is None else self._rings.take(key)
        if found:
            queue.clear()  # fetched by a worker: the ones queued here were evaluation passes
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
        rings = self._rings
        keys = [] if rings is None else rings.keys()
        sized = next((key for key in keys if key[0] == n), None)
        if rings is not None and sized is not None:
            rings.take(sized)
            return n
        return keys[0][0] if keys else queue[0][0] if queue else None

    def like(self, key: Key) -> Key | None:
        """A fetched batch that starts where ``key`` starts (``None``: none)."""
        keys = list(self._queue) + ([] if self._rings is None else self._rings.keys())
        return next((k for k in keys if k[1] == key[1]), None)

    @property
    def pending(self) -> bool:
        """Batches fetched in this process are queued, not trained."""
        return bool(self._queue)

    @property
    def any(self) -> bool:
        """A batch was ever fetched through the dataset (here or in a worker process)."""
        return self.recorded or (self._rings is not None and self._rings.written)

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


class _Rings:
    """The keys fetched in DataLoader worker processes: one ring per worker (its pid's slot, which
    only it writes) in one shared int64 table; this process reads the new keys of the slots that
    wrote into ``pending`` (insertion-ordered, the oldest aged out) and consumes them."""

    def __init__(self) -> None:
        self.table = torch.zeros(HEAD + WORKER_SLOTS * RING * 3, dtype=torch.int64).share_memory_()
        self._view: Any = None
        self._pid = -1
        self.seen = [0] * WORKER_SLOTS  # the keys of each slot read here
        self.active: list[int] = []  # the slots that wrote
        self.pending: dict[Key, None] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None, "_pid": -1}  # a view is this process's address

    def view(self) -> Any:
        """The table as a ``ctypes`` array over its shared memory, made once per process."""
        if self._pid != os.getpid():
            self._view = (ctypes.c_int64 * self.table.numel()).from_address(self.table.data_ptr())
            self._pid = os.getpid()
        return self._view

    @property
    def written(self) -> bool:
        return bool(self.view()[0])

    def write(self, key: Key) -> None:
        """In a worker process: ``key`` into this worker's ring, then its count, then the flag."""
        v, slot = self.view(), os.getpid() % WORKER_SLOTS
        count = v[1 + slot]
        at = HEAD + (slot * RING + count % RING) * 3
        v[at], v[at + 1], v[at + 2] = key
        v[1 + slot] = count + 1
        v[0] = 1

    def take(self, key: Key) -> bool | None:
        """Consume ``key`` if a worker fetched it; ``None`` when no worker ever wrote."""
        v = self.view()
        if not v[0]:
            return None
        if key not in self.pending:
            self._read(v, self.active)  # the slots known to write, then any that began since
        if key not in self.pending:
            self._read(v, self._discover(v))
        if key not in self.pending:
            return False
        del self.pending[key]
        return True

    def keys(self) -> list[Key]:
        """Every key fetched by a worker and not consumed."""
        v = self.view()
        if v[0]:
            self._read(v, self.active)
            self._read(v, self._discover(v))
        return list(self.pending)

    def _discover(self, v: Any) -> list[int]:
        counts = v[1:HEAD]
        new = [s for s in range(WORKER_SLOTS) if counts[s] != self.seen[s] and s not in self.active]
        self.active.extend(new)
        return new

    def _read(self, v: Any, slots: list[int]) -> None:
        pending = self.pending
        for s in slots:
            count, seen = v[1 + s], self.seen[s]
            for i in range(max(seen, count - RING), count):
                at = HEAD + (s * RING + i % RING) * 3
                pending[(v[at], v[at + 1], v[at + 2])] = None
            self.seen[s] = count
        while len(pending) > QUEUE_LIMIT:
            del pending[next(iter(pending))]


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
