"""Sharded scores and plans (``shard_scores=True``): each rank holds its own slice of the index space.

With ``W`` ranks, rank ``r`` owns the dataset indices ``i % W == r`` (a
:class:`~leanbatch.policies.parts.Slice`): :class:`ShardedScores` holds their scores (local row
``j`` is index ``r + j * W``; indices stay global everywhere else, and a row of another rank is
not stored), and :class:`ShardedPlan` the kept indices it owns and their weights.
:meth:`ShardedScores.plan` hands a shardable policy (``policy.shardable``) the table's
:class:`~leanbatch.policies.parts.Part` (its rows and their slice, with the collectives): the plan
is the unsharded plan's part on the slice. Each rank serves its own kept list in a keyed order,
every rank padded (or truncated) to one length: its ``k``-th sample sits at position
``k * world + rank`` of the epoch's order, so the sampler's arithmetic is the same as unsharded.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy
    >>> from leanbatch.policies.parts import LOCAL
    >>> table = ShardedScores(10, world=2, rank=1)
    >>> table.update(torch.tensor([1, 3, 5]), torch.tensor([0.1, 0.2, 9.0]))
    >>> g = torch.Generator().manual_seed(0)
    >>> plan = table.plan(InfoBatchPolicy(0.5, 2), 0, g, world=2, rank=1, comm=LOCAL)
    >>> table.values.shape, plan.counts, plan.threshold is not None
    (torch.Size([5]), (4,), True)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor

from leanbatch.distributed.collectives import DistComm
from leanbatch.permutation import KeyedPermutation, mix_seed
from leanbatch.policies.parts import Part, Slice
from leanbatch.policies.plan import Plan, plan_fields
from leanbatch.ranks import initialized, is_distributed, process_rank, world_size
from leanbatch.scores import ScoreTable

__all__ = ["ShardedPlan", "ShardedScores", "as_shard", "shard_of"]


def shard_of(num_samples: int, num_replicas: int | None, rank: int | None, group: Any) -> tuple[int, int]:
    """``(world, rank)`` of a sharded score table, known when it is built (``shard_scores=True``)."""
    if num_replicas is None and not initialized():
        raise ValueError(
            "shard_scores=True builds each rank's slice of the scores when the wrapper is built: call "
            "torch.distributed.init_process_group() first, or pass num_replicas= and rank="
        )
    world = world_size(group) if num_replicas is None else num_replicas
    r = process_rank(group) if rank is None else rank
    if not 0 <= r < world:
        raise ValueError(f"rank must be in [0, num_replicas={world}), got {r!r}")
    if num_samples < world:
        raise ValueError(
            f"shard_scores=True with {world} ranks needs at least {world} samples (one per rank), got {num_samples}"
        )
    return world, r


class ShardedScores(ScoreTable):
    """The score table of one rank's slice: the indices ``i % world == rank`` of ``num_samples``.

    :attr:`values` holds the slice (local row ``j`` is index ``rank + j * world``); every method
    takes global indices, and a write to an index another rank owns goes to the spare slot (no
    host sync), so every rank can store every rank's gathered rows. The state adds ``world`` and
    ``rank`` and loads only into the same rank of the same world (:mod:`.checkpoints` re-shards).

    Example:
        >>> import torch
        >>> t = ShardedScores(5, world=2, rank=1)
        >>> t.update(torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0, 3.0]))   # 2 is rank 0's
        >>> t.values.tolist(), t.get(torch.tensor([3])).tolist()
        ([1.0, 3.0], [3.0])
    """

    def __init__(
        self,
        num_samples: int,
        world: int,
        rank: int,
        device: torch.device | str | None = None,
        ema: float | None = None,
        variance: bool = False,
    ):
        self.slice = Slice(num_samples, world, rank)  # the rows this table holds
        super().__init__(num_samples, device, ema, variance)

    @property
    def rows(self) -> int:
        """Rows of this rank's slice."""
        return self.slice.size

    def _slots(self, idx: Tensor, finite: Tensor) -> Tensor:
        w = self.slice.world
        mine = finite & (idx % w == self.slice.rank) & (idx < self.num_samples)
        return torch.where(mine, torch.div(idx, w, rounding_mode="floor"), self.rows)

    @property
    def owner(self) -> tuple[int, int] | None:  # type: ignore[override]
        """``(world, rank)`` of the slice this table holds."""
        return self.slice.world, self.slice.rank

    def plan(self, policy: Any, epoch: int, generator: torch.Generator, **layout: Any) -> ShardedPlan:
        """This rank's part of epoch ``epoch``'s plan, and every rank's kept count (one gather).

        ``layout`` holds ``world``, ``rank`` (checked against the table's), ``comm`` (the collectives
        the policy's global statistics combine through; default: ``torch.distributed`` over
        ``group``) and ``drop_last`` (each rank serves the largest kept count, or the smallest)."""
        world, rank, comm, group = layout["world"], layout["rank"], layout.get("comm"), layout.get("group")
        if (self.slice.world, self.slice.rank) != (world, rank):
            raise ValueError(
                f"the score table holds the rows of rank {self.slice.rank} of {self.slice.world} but this "
                f"process is rank {rank} of {world}: build it (or InfoBatch(shard_scores=True)) with this "
                "rank's world and rank"
            )
        if comm is None and world > 1 and not is_distributed(group):
            raise RuntimeError(
                f"shard_scores=True with {world} ranks plans through collectives: call "
                "torch.distributed.init_process_group() before training"
            )
        sl = Slice(self.num_samples, world, rank, DistComm(group) if comm is None else comm)
        plan = policy(Part(self.values, sl), epoch, generator)
        mine = sl.size if plan.kept is None else int(plan.kept.numel())
        counts = tuple(int(c) for c in sl.comm.gather(torch.tensor([mine], dtype=torch.int64))[:, 0])
        return as_shard(plan, rank, counts, bool(layout.get("drop_last", False)))

    def load_plan(self, kind: Any, saved: Any, name: str) -> ShardedPlan:
        """A saved plan of this rank's part, validated; it loads only into the same rank of the same world."""
        if not (isinstance(saved, dict) and saved.get("shard") is not None):
            raise ValueError(
                f"{name} is unsharded but this sampler shards its scores: cut this rank's state out "
                "with leanbatch.distributed.shard_state (InfoBatch(shard_scores=True).load_state_dict does it)"
            )
        plan = ShardedPlan.from_state(saved, self.num_samples, name)
        if (plan.world, plan.rank) != (self.slice.world, self.slice.rank):
            raise ValueError(
                f"{name} is the plan of rank {plan.rank} of {plan.world} (shard_scores=True), this "
                f"sampler is rank {self.slice.rank} of {self.slice.world}: gather the ranks' states with "
                "leanbatch.distributed.gather_states (and re-shard them with shard_state)"
            )
        return plan

    def check_owned(self, indices: Tensor) -> None:
        """Raise unless every index is one this rank owns (asynchronous on CUDA: a device-side assert)."""
        sl = self.slice
        msg = (
            f"with shard_scores=True rank {sl.rank} of {sl.world} trains the indices i % {sl.world} == "
            f"{sl.rank} (those its sampler serves): these indices are another rank's"
        )
        if indices.device.type == "cpu":
            if indices.numel() and not bool(sl.owns(indices).all()):
                self.check_indices(indices)
                raise IndexError(msg)
        else:
            torch._assert_async(sl.owns(indices).all(), msg)

    def get(self, indices: Tensor) -> Tensor:
        """Scores of global ``indices``, each of which this rank must own (:meth:`check_owned`)."""
        idx = self._index(indices)
        self.check_owned(idx)
        return self.values[self.slice.local_rows(idx)]

    def state_dict(self) -> dict[str, Any]:
        """The table's state, with ``world`` and ``rank``."""
        return dict(super().state_dict(), world=self.slice.world, rank=self.slice.rank)

    def _check_state(self, state: Any) -> dict[str, Any]:
        where = (state.get("world", 1), state.get("rank", 0)) if isinstance(state, dict) else None
        if where is not None and where != (self.slice.world, self.slice.rank):
            raise ValueError(
                f"state_dict holds the scores of rank {where[1]} of {where[0]}, this table is rank "
                f"{self.slice.rank} of {self.slice.world}: gather the shards with "
                "leanbatch.distributed.gather_states and re-shard them with leanbatch.distributed.shard_state"
            )
        return super()._check_state({k: v for k, v in state.items() if k not in ("world", "rank")})


@dataclass(frozen=True)
class ShardedPlan(Plan):
    """One rank's part of an epoch's plan: the kept indices it owns, the weights of its rows.

    Attributes (besides :class:`~leanbatch.Plan`'s): ``world``, ``rank``, ``counts`` (every rank's
    kept count) and ``length`` (the samples each rank serves: the largest count; the smallest with
    ``drop_last``). ``kept`` ``None`` means every index this rank owns; ``weights`` has one entry
    per local row.

    Example:
        >>> p = ShardedPlan(0, 10, None, None, None, False, world=2, rank=0, counts=(5, 5), length=5)
        >>> p.num_kept, p.order_length, p.kept_before(4)
        (10, 10, 4)
    """

    world: int = 1
    rank: int = 0
    counts: tuple[int, ...] = ()
    length: int = 0
    _prefix: tuple[tuple[int, ...], list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.counts))
        prefix = [0, *accumulate(ordered)]
        object.__setattr__(self, "_prefix", (ordered, prefix))  # kept_before runs every step

    @property
    def num_listed(self) -> int:
        """Kept samples in this rank's list."""
        return self.counts[self.rank]

    @property
    def num_kept(self) -> int:
        """Kept samples over every rank (and those trained before a continuation plan)."""
        return self.trained_before + sum(self.counts)

    @property
    def order_length(self) -> int:
        """Positions of the epoch's order: ``world x length``."""
        return self.world * self.length

    def kept_before(self, position: int) -> int:
        """Kept samples trained over every rank once the order stands at ``position``."""
        step = min(position, self.order_length) // self.world  # each rank's samples served
        ordered, prefix = self._prefix
        below = bisect.bisect_left(ordered, step)  # ranks with fewer than `step` kept
        return self.trained_before + prefix[below] + step * (len(ordered) - below)

    def inside(self, origin: int, rank: int, world: int) -> int:
        """Positions ``origin + rank + k * world`` that hold a kept sample of ``rank``, not padding."""
        return max(0, self.counts[rank] - origin // world)

    def padding(self, length: int, world: int) -> tuple[int, int]:
        """``(padded, dropped)`` over the ranks, each serving ``length`` of its own kept count."""
        return sum(max(0, length - c) for c in self.counts), sum(max(0, c - length) for c in self.counts)

    def local_rows(self, indices: Tensor) -> Tensor:
        """Local rows (``i // world``) of indices this rank owns."""
        return indices if self.world == 1 else torch.div(indices, self.world, rounding_mode="floor")

    def serve(self, seed: int, positions: Tensor) -> Tensor:
        """The dataset indices at ``positions`` of the order: this rank's own list, keyed, wrapping."""
        w, r, n = self.world, self.rank, self.num_listed
        k = torch.div(positions, w, rounding_mode="floor")
        if n == 0:  # nothing of this rank's kept: its padding repeats its first own sample
            return torch.full_like(k, r)
        local = KeyedPermutation(n, mix_seed(seed, self.epoch, 1, w, r))(k % n)
        return local * w + r if self.kept is None else self.kept[local].to(torch.int64)

    def state_dict(self) -> dict[str, Any]:
        """The plan's state, with ``shard`` (world, rank, counts, length)."""
        shard = {"world": self.world, "rank": self.rank, "counts": list(self.counts), "length": self.length}
        return dict(super().state_dict(), shard=shard)

    @classmethod
    def from_state(cls, state: Any, num_samples: int, name: str = "plan") -> ShardedPlan:
        """A sharded plan from :meth:`state_dict`, validated (``ValueError`` naming the wrong key)."""
        shard = state.get("shard") if isinstance(state, dict) else None
        ok = isinstance(shard, dict) and all(k in shard for k in ("world", "rank", "counts", "length"))
        if ok and isinstance(shard, dict):
            world, rank, counts, length = shard["world"], shard["rank"], shard["counts"], shard["length"]
            ints = [world, rank, length, *counts] if isinstance(counts, (list, tuple)) else []
            ok = bool(ints) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)
            ok = ok and world >= 1 and rank < world and len(counts) == world
            ok = ok and all(c <= Slice(num_samples, world, r).size for r, c in enumerate(counts))
        if not ok:
            raise ValueError(
                f"{name}['shard'] must be a dict of world, rank, counts (one per rank) and length"
            )
        rows = Slice(num_samples, world, rank).size
        fields = plan_fields(state, num_samples, name, rows, (world, rank))
        listed = rows if fields["kept"] is None else int(fields["kept"].numel())
        if listed != counts[rank]:
            raise ValueError(
                f"{name}['shard'] counts {counts[rank]} kept on this rank, its list holds {listed}"
            )
        plan = cls(**fields, world=world, rank=rank, counts=tuple(counts), length=length)
        if plan.num_kept > num_samples:
            raise ValueError(f"{name} keeps {plan.num_kept} samples of {num_samples}")
        return plan


def as_shard(plan: Plan, rank: int, counts: tuple[int, ...], drop_last: bool) -> ShardedPlan:
    """``plan`` as rank ``rank``'s part, given every rank's kept count: each rank serves the largest
    (the smallest with ``drop_last``).
    """
    own = {f.name: getattr(plan, f.name) for f in fields(Plan) if f.name != "_on_device"}
    length = min(counts) if drop_last else max(counts)
    return ShardedPlan(**own, world=len(counts), rank=rank, counts=counts, length=length)
