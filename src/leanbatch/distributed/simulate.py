"""Several ranks in one process: each rank's local work runs alone, in turn; collectives combine exactly.

For measuring a sharded plan per rank on one machine (``leanbatch micro plan --world 8 --shard``)
and for testing it without processes. :class:`SimulatedWorld` runs one thread per rank, but only
one at a time: a rank runs until it calls a collective, then hands over to the next rank; the
last one combines every rank's input as the collective would (element-wise sums in
rank order, gathers stacked in rank order) and rank 0 carries on. Each rank's time is the sum of
its own turns (:attr:`SimulatedWorld.busy`), so it is what the rank would spend on its own
machine, waiting aside.

Example:
    >>> import torch
    >>> world = SimulatedWorld(3)
    >>> world.run([lambda r=r: int(world.comm(r).sum(torch.tensor([r + 1]))[0]) for r in range(3)])
    [6, 6, 6]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from leanbatch.policies.parts import Comm

__all__ = ["SimulatedWorld"]


class _RankComm(Comm):
    """Rank ``rank``'s view of a :class:`SimulatedWorld`: its collectives."""

    def __init__(self, world: SimulatedWorld, rank: int):
        self.world, self.rank = world, rank

    def sum(self, t: Tensor) -> Tensor:
        """``all_reduce`` SUM."""
        return self.world._collective(self.rank, t, lambda ts: torch.stack(ts).sum(0))

    def gather(self, t: Tensor) -> Tensor:
        """``all_gather``, stacked in rank order."""
        return self.world._collective(self.rank, t, torch.stack)


class SimulatedWorld:
    """``world`` ranks taking turns in one process (see the module docstring).

    Example:
        >>> import torch
        >>> w = SimulatedWorld(2)
        >>> w.run([lambda: w.comm(0).gather(torch.tensor([5])), lambda: w.comm(1).gather(torch.tensor([7]))])[1].tolist()
        [[5], [7]]
    """

    def __init__(self, world: int):
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be an int >= 1, got {world!r}")
        self.world = world
        self.busy = [0.0] * world  # seconds each rank ran, its turns summed
        self._cond = threading.Condition()
        self._turn = 0
        self._inputs: list[Tensor | None] = [None] * world
        self._result: Tensor | None = None
        self._round = 0
        self._since = [0.0] * world

    def comm(self, rank: int) -> _RankComm:
        """Rank ``rank``'s collectives."""
        return _RankComm(self, rank)

    def _take_turn(self, rank: int) -> None:  # the lock is held
        while self._turn != rank:
            self._cond.wait()
        self._since[rank] = time.perf_counter()

    def _hand_over(self, rank: int) -> None:  # the lock is held
        self.busy[rank] += time.perf_counter() - self._since[rank]
        self._turn = rank + 1
        self._cond.notify_all()

    def _collective(self, rank: int, t: Tensor, combine: Callable[[list[Tensor]], Tensor]) -> Tensor:
        with self._cond:
            self._inputs[rank] = t.detach().cpu().clone()
            self._hand_over(rank)
            mine = self._round
            if rank == self.world - 1:  # every input is in: combine, and rank 0 goes on
                self._result = combine([x for x in self._inputs if x is not None])
                self._round += 1
                self._turn = 0
                self._cond.notify_all()
            while self._round == mine:
                self._cond.wait()
            assert self._result is not None
            out = self._result.clone()
            self._take_turn(rank)
        return out

    def run(self, work: list[Callable[[], Any]]) -> list[Any]:
        """Run ``work[r]()`` as rank ``r`` for every rank, in turns; their results in rank order.

        Every rank must make the same collectives in the same order (as real ranks must).
        """
        if len(work) != self.world:
            raise ValueError(f"one piece of work per rank: {self.world} ranks, {len(work)} given")
        results: list[Any] = [None] * self.world
        errors: list[BaseException] = []

        def rank_main(rank: int) -> None:
            with self._cond:
                self._take_turn(rank)
            try:
                results[rank] = work[rank]()
            except BaseException as e:  # reported by run(); the other ranks may wait forever
                errors.append(e)
            finally:
                with self._cond:
                    self._hand_over(rank)

        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(self.world)]
        self._turn = 0
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) and not errors:
            threads[0].join(timeout=0.05)
            threads = [t for t in threads if t.is_alive()] or threads
        if errors:
            raise errors[0]
        return results
