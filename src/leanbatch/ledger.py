"""The ledger of a training run: what an iteration served, what a loader fetched, what was trained.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's one batch
ahead), so the samples a sampler has served run ahead of those an update has trained.
:class:`Iteration` keeps one ``iter()``'s served dataset indices in order, in the chunks they
were made in, and drops a chunk once it has been trained to its end; :class:`Fetches` keeps the
sizes of the batches fetched through the dataset, so an update is checked against the batch it
trains. Counts are this rank's (local); :class:`Position` is where they leave training in the
epoch's global order. The :class:`~leanbatch.PrunedSampler` owns the ledgers of its run.

Example:
    >>> import torch
    >>> from leanbatch.policies import full_plan
    >>> it = Iteration(0, full_plan(0, 10), world=2, rank=1, origin=0, length=5)
    >>> it.add(torch.tensor([7, 3, 9])); it.peek(2).tolist()
    [7, 3]
    >>> it.take(2); it.order_position, it.scored(3)   # rank 1's positions 5, 7, 9 hold kept samples
    (4, 3)
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from leanbatch.policies.plan import Plan

__all__ = ["Fetches", "Iteration", "Position", "Step"]

WORKER_SLOTS = 64  # DataLoader workers whose fetched sizes never share a slot (ids modulo this)


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
    head: int = 0  # local position of chunks[0][0]
    head_end: int = 0  # local position just past chunks[0]
    ran_out: bool = False  # the consumer pulled past its last sample
    batch: int = 0  # size of its first update (update(loss) checks later ones against it)
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

    def add(self, indices: Tensor) -> None:
        """Record the next served chunk of dataset indices."""
        if not self.chunks:
            self.head, self.head_end = self.served, self.served + indices.numel()
        self.chunks.append(indices)
        self.served += indices.numel()

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
    """The sizes of the batches a DataLoader fetched through the dataset, to check updates against.

    In this process (no worker processes) the sizes queue up in fetch order, which is the order
    the batches are trained in; worker processes share only the largest (a shared-memory tensor
    made by :meth:`track` before they start: one slot per worker, which only that worker writes).

    Example:
        >>> from leanbatch.policies import full_plan
        >>> f = Fetches()
        >>> f.fetched(4)
        >>> try:
        ...     f.check(Iteration(0, full_plan(0, 8), 1, 0, 0, 8), 3, implicit=True, subject="loss")
        ... except ValueError as e:
        ...     print(str(e).split(" (")[0])
        loss has 3 entries but the batches of this epoch have 4
    """

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._queue: deque[int] = deque()
        self._largest: Tensor | None = None

    def track(self) -> None:
        """Share the largest fetched size with worker processes (call before they start)."""
        if self._largest is None:
            self._largest = torch.zeros(WORKER_SLOTS, dtype=torch.int64).share_memory_()

    def fetched(self, n: int) -> None:
        """A batch of ``n`` samples was fetched (``Dataset.__getitems__``)."""
        if os.getpid() == self._owner:
            self._queue.append(n)
        elif self._largest is not None:
            info = get_worker_info()
            slot = 0 if info is None else info.id % WORKER_SLOTS  # this worker's own: one writer
            if n > int(self._largest[slot]):
                self._largest[slot] = n

    def trained(self) -> None:
        """The oldest fetched batch was trained."""
        if self._queue:
            self._queue.popleft()

    def train(self, it: Iteration, n: int) -> None:
        """:meth:`check` an update of ``n`` samples without indices from ``it``, then mark the oldest
        fetched batch trained (one step)."""
        queue = self._queue
        if queue and queue[0] == n:  # the common step: the batch the loader fetched
            queue.popleft()
            return
        self.check(it, n, implicit=True)
        self.trained()

    def clear(self) -> None:
        """Forget what was fetched (an abandoned iteration's batches are never trained)."""
        self._queue.clear()
        if self._largest is not None:
            self._largest.zero_()

    def check(self, it: Iteration, n: int, implicit: bool, subject: str = "loss") -> None:
        """Refuse an update of ``n`` samples from ``it`` that is not the size of the batch it trains."""
        if self._queue:
            expected = self._queue[0]
        else:
            shared = 0 if self._largest is None else int(self._largest.max())
            expected = shared or (it.batch if implicit else 0)
            if it.trained + n == it.length and n <= expected:  # a short last batch ends the iteration
                expected = n
        if expected and n != expected:
            raise ValueError(
                f"{subject} has {n} entries but the batches of this epoch have {expected} (the one it "
                "trains included): pass the whole batch, in order (one loss per sample, reduction='none', "
                "nothing filtered out), one update() per batch; for a subset of the batch pass its rows: "
                "update(loss, indices, positions=rows)"
            )
