"""``EpochPlanner``: each epoch's plan, made once, from the score table and a private generator.

The planner asks its policy for epoch ``e``'s plan the first time the plan is needed, with a
``torch.Generator`` seeded from ``(seed, e)``, and keeps it: a plan is never re-made, however
often it is asked for. It refuses to plan from scores the other ranks never saw (a rank with
``num_replicas > 1`` but no process group), and it keeps one statistics dict per planned epoch.
It runs no collective: the training record merges the ranks' scores where every rank is at
the same point (an epoch's end, ``set_epoch``), so planning is a local, deterministic function
of the merged table.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy, ScoreTable
    >>> table = ScoreTable(4)
    >>> table.update(torch.arange(4), torch.tensor([0.1, 0.2, 3.0, 4.0]))
    >>> planner = EpochPlanner(table, InfoBatchPolicy(0.5, num_epochs=2, delta=1.0), seed=0)
    >>> plan = planner.plan(0)
    >>> plan is planner.plan(0), plan.weights.tolist(), planner.epoch_stats[-1]["kept"] == plan.num_kept
    (True, [2.0, 2.0, 1.0, 1.0], True)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from leanbatch.checks import check_seed
from leanbatch.permutation import mix_seed
from leanbatch.policies import Plan, Policy
from leanbatch.policies.plan import ShardInfo
from leanbatch.rng import initialized, is_distributed, world_size
from leanbatch.scores import ScoreTable
from leanbatch.sharding import Sharding
from leanbatch.slices import Comm, DistComm, Slice

__all__ = ["EpochPlanner"]


class EpochPlanner:
    """Makes and keeps epoch plans; see the module docstring.

    Args:
        scores: the score table plans are made from.
        policy: ``policy(scores, epoch, generator) -> Plan`` (see :class:`~leanbatch.policies.Policy`).
        seed: seeds every epoch's generator, with the epoch.
        sharding: how the epoch is split between ranks (for the merge check and the padding
            statistics; default: one process).

    Example:
        >>> from leanbatch import RandomPolicy, ScoreTable
        >>> EpochPlanner(ScoreTable(3), RandomPolicy(0.5, 2)).plan(0).num_kept   # nothing scored yet
        3
    """

    def __init__(
        self,
        scores: ScoreTable,
        policy: Policy,
        seed: int = 0,
        sharding: Sharding | None = None,
        comm: Comm | None = None,
    ):
        self.scores = scores
        self.comm = comm  # sharded scores: the collectives (default: over the sharding's process group)
        self.policy = policy
        bind = getattr(policy, "bind", None)
        if callable(bind):  # a policy that reads more of the table than its scores (UCB: the variance)
            bind(scores)
        self.seed = check_seed(seed)
        self.sharding = Sharding() if sharding is None else sharding
        self.epoch_stats: list[dict[str, Any]] = []
        self._plan: Plan | None = None  # the latest plan; older ones live on in the iterations using them

    @property
    def latest(self) -> Plan | None:
        """The most recently made (or restored) plan, if any."""
        return self._plan

    def plan(self, epoch: int) -> Plan:
        """Epoch ``epoch``'s plan: made now if it is not the latest one, never re-made."""
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = None  # let the old plan go before making the new one
            self._plan = self._make(epoch)
        return self._plan

    def restore(self, plan: Plan) -> None:
        """Adopt a plan read from a checkpoint as the latest (it is not made again)."""
        self._plan = plan

    @property
    def sharded(self) -> bool:
        """Whether plans are made per slice (the score table holds one rank's rows)."""
        return self.sharding.scores_sharded

    def _make(self, epoch: int) -> Plan:
        world, rank = self.sharding.resolve()
        self._check_merged(world)
        generator = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 0))
        if self.sharded:
            plan = self._make_slice(epoch, generator, world, rank)
            padded, dropped = _padding(plan, self.sharding.local_length(plan.order_length, 0, world))
        else:
            plan = self.policy(self.scores.values, epoch, generator)
            total = self.sharding.local_length(plan.num_kept, 0, world) * world
            padded, dropped = max(0, total - plan.num_kept), max(0, plan.num_kept - total)
        if plan.num_kept < 1:
            raise RuntimeError(f"the policy planned an empty epoch {epoch}: a Policy must keep >= 1 sample")
        stats = {
            "epoch": epoch,
            "num_samples": plan.num_samples,
            "kept": plan.num_kept,
            "pruned": plan.num_pruned,
            "threshold": plan.threshold,
            "pruning": plan.pruning,
            "padded": padded,
            "dropped": dropped,
            "nonfinite_so_far": int(self.scores.nonfinite_count),
        }
        self.epoch_stats = [s for s in self.epoch_stats if s["epoch"] != epoch] + [stats]
        return plan

    def _make_slice(self, epoch: int, generator: torch.Generator, world: int, rank: int) -> Plan:
        """This rank's part of the epoch's plan, and every rank's kept count (one all_gather)."""
        table = self.scores.slice
        if (table.world, table.rank) != (world, rank):
            raise ValueError(
                f"the score table holds the rows of rank {table.rank} of {table.world} but this process is "
                f"rank {rank} of {world}: build it (or InfoBatch(shard_scores=True)) with this rank's world and rank"
            )
        if self.comm is None and world > 1 and not is_distributed(self.sharding.process_group):
            raise RuntimeError(
                f"shard_scores=True with {world} ranks plans through collectives: call "
                "torch.distributed.init_process_group() before training"
            )
        comm = self.comm if self.comm is not None else DistComm(self.sharding.process_group)
        sl = Slice(table.num_samples, world, rank, comm)
        plan = self.policy.plan_slice(self.scores.values, epoch, generator, sl)  # type: ignore[attr-defined]
        mine = sl.size if plan.kept is None else plan.local_kept
        counts = tuple(int(c) for c in comm.gather(torch.tensor([mine], dtype=torch.int64))[:, 0])
        length = min(counts) if self.sharding.drop_last else max(counts)
        return replace(plan, shard=ShardInfo(world, rank, counts, length))

    def _check_merged(self, world: int) -> None:
        """Refuse to plan from scores the other ranks never saw (shards would overlap or miss)."""
        group = self.sharding.process_group
        if self.sharding.shard and initialized() and world != world_size(group):
            raise ValueError(
                f"num_replicas={world} but the process group has {world_size(group)} processes: "
                "every rank must plan from the same merged scores; leave num_replicas/rank unset to "
                "read them from the group, or pass process_group= (the data-parallel group)"
            )
        if world > 1 and not is_distributed(group) and self.scores.unmerged and not self.sharded:
            raise RuntimeError(
                f"num_replicas={world} but torch.distributed is not initialised, so the scores "
                "this rank stored cannot be merged with the other ranks' before planning (each rank would "
                "plan a different epoch and the shards would overlap or miss samples): call "
                "torch.distributed.init_process_group() before training, or drop num_replicas/rank"
            )

    def state_dict(self) -> dict[str, Any]:
        """The statistics of every planned epoch (plain values)."""
        return {"epoch_stats": [dict(s) for s in self.epoch_stats]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.epoch_stats = [dict(s) for s in state["epoch_stats"]]


def _padding(plan: Plan, length: int) -> tuple[int, int]:
    """Samples repeated (padding) and left out (``drop_last``) over every rank, at ``length`` per rank."""
    assert plan.shard is not None
    counts = plan.shard.counts
    return sum(max(0, length - c) for c in counts), sum(max(0, c - length) for c in counts)
