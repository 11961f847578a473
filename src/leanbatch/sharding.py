"""How an epoch's global order is split between ranks: pure arithmetic, no collective.

An epoch serves the plan's ``K`` kept samples in a keyed order, positions ``0 .. K - 1`` of
the epoch's *global* order. An iteration that starts at global position ``start`` gives rank
``r`` of ``W`` the positions ``start + r, start + r + W, ...``; shards are padded (positions
past ``K`` wrap to the start of the order) or, with ``drop_last``, truncated to equal length.
Because positions are global, a position saved by one world size is a place every other world
size can resume from: after ``t`` samples trained on each of ``W`` ranks, the epoch stands at
global position ``start + t * W``.

Example:
    >>> s = Sharding(num_replicas=2, rank=1)
    >>> s.resolve()
    (2, 1)
    >>> s.local_length(kept=5, start=0), Sharding.positions(0, rank=1, count=3, world=2).tolist()
    (3, [1, 3, 5])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_bool, check_int
from leanbatch.rng import process_rank, world_size

__all__ = ["Sharding"]


@dataclass
class Sharding:
    """Who serves which positions: ``num_replicas``/``rank`` given, or read from ``process_group``.

    Args:
        num_replicas, rank: the data-parallel world and this process's rank; ``None`` reads them
            from the process group each time they are resolved (1 and 0 without one).
        drop_last: truncate shards to equal length instead of padding them.
        process_group: the data-parallel group (default: the world).
        shard: ``False`` serves the whole order on every process (a framework shards the
            batches, as accelerate does); ``num_replicas``/``rank`` then do not apply.
        scores_sharded: each rank holds the scores and plan of its own slice of the index space
            and serves its own kept samples (see :mod:`leanbatch.slices`); needs ``shard=True``.

    Example:
        >>> Sharding(shard=False).resolve(), Sharding(num_replicas=3, drop_last=True).local_length(7, 0)
        ((1, 0), 2)
    """

    num_replicas: int | None = None
    rank: int | None = None
    drop_last: bool = False
    process_group: Any = None
    shard: bool = True
    multiple: int = 1  # each rank's share of an epoch is padded (or truncated) to a multiple of this
    scores_sharded: bool = False

    def __post_init__(self) -> None:
        if self.num_replicas is not None:
            try:
                check_int(self.num_replicas, "num_replicas", 1)
            except TypeError as e:
                raise ValueError(str(e)) from None
        if self.rank is not None:
            bad = isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0
            if bad or (self.num_replicas is not None and self.rank >= self.num_replicas):
                raise ValueError(f"rank must be in [0, num_replicas={self.num_replicas}), got {self.rank!r}")
        check_bool(self.shard, "shard")
        check_bool(self.drop_last, "drop_last")
        check_int(self.multiple, "multiple", 1)
        check_bool(self.scores_sharded, "shard_scores")
        if self.scores_sharded and not self.shard:
            raise ValueError(
                "shard_scores=True has each rank serve the samples it owns, so it needs shard=True: "
                "a framework that shards the batches of one global order (shard=False) cannot use it"
            )
        if not self.shard and (self.num_replicas not in (None, 1) or self.rank not in (None, 0)):
            raise ValueError(
                "shard=False serves the whole plan on every process (the framework shards the batches), "
                f"so num_replicas/rank do not apply: got num_replicas={self.num_replicas!r}, rank={self.rank!r}"
            )

    def resolve(self) -> tuple[int, int]:
        """``(world, rank)`` now: the given values, else the process group's (host-side reads)."""
        if not self.shard:
            return 1, 0
        world = world_size(self.process_group) if self.num_replicas is None else self.num_replicas
        rank = process_rank(self.process_group) if self.rank is None else self.rank
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, num_replicas={world}), got {rank!r}")
        return world, rank

    def local_length(self, kept: int, start: int, world: int | None = None) -> int:
        """Samples one rank serves of the positions ``start .. kept - 1`` (equal on every rank).

        The positions left are padded (or, with ``drop_last``, truncated) to whole rounds of
        ``world * multiple`` samples, so every rank serves as many, in whole multiples.
        """
        w = self.resolve()[0] if world is None else world
        unit = w * self.multiple
        left = max(0, kept - start)
        rounds = left // unit if self.drop_last else math.ceil(left / unit)
        return rounds * self.multiple

    @staticmethod
    def positions(start: int, rank: int, count: int, world: int, first: int = 0) -> Tensor:
        """Global positions of local samples ``first .. first + count - 1`` of ``rank`` (int64).

        Example:
            >>> Sharding.positions(10, 0, 3, world=4).tolist()
            [10, 14, 18]
        """
        return torch.arange(first, first + count, dtype=torch.int64) * world + (start + rank)
