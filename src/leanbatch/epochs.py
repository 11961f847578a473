"""An epoch's plan, made and saved: what the sampler does once per epoch, not per step.

- :func:`plan_epoch` makes epoch ``e``'s plan from the score table, with a ``torch.Generator``
  seeded from ``(seed, e)``: through the policy, by the score table (a sharded table plans its
  rank's slice, :meth:`~leanbatch.ScoreTable.plan`); and the epoch's
  statistics (kept, pruned, threshold, padding). It runs no collective of its own: the sampler
  merges the ranks' scores where every rank is at the same point, so planning is a local,
  deterministic function of the merged table.
- :func:`check_agreement` refuses to plan from scores the other ranks never saw.

The sampler's argument checks and its saved state live beside it, in :mod:`leanbatch.sampler_state`;
the warnings a loop gets once, with the misuse messages, in :mod:`leanbatch.misuse`.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy, ScoreTable
    >>> table = ScoreTable(4)
    >>> table.update(torch.arange(4), torch.tensor([0.1, 0.2, 3.0, 4.0]))
    >>> plan, stats = plan_epoch(InfoBatchPolicy(0.5, num_epochs=2, delta=1.0), table, 0, seed=0, world=1, rank=0)
    >>> plan.weights.tolist(), stats["kept"] == plan.num_kept, stats["padded"]
    ([2.0, 2.0, 1.0, 1.0], True, 0)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from leanbatch.permutation import mix_seed
from leanbatch.policies.base import Policy
from leanbatch.policies.parts import Comm
from leanbatch.policies.plan import Plan
from leanbatch.ranks import initialized, is_distributed, world_size
from leanbatch.scores import ScoreTable

__all__ = [
    "check_agreement",
    "local_length",
    "plan_epoch",
]


def local_length(kept: int, start: int, world: int, round_size: int = 1, drop_last: bool = False) -> int:
    """Samples one rank serves of the positions ``start .. kept - 1`` of an epoch's order, in whole
    rounds of ``world * round_size`` (padded, or with ``drop_last`` truncated): equal on every rank.

    Example:
        >>> local_length(7, 0, world=3), local_length(7, 0, world=3, drop_last=True)
        (3, 2)
    """
    unit = world * round_size
    left = max(0, kept - start)
    return (left // unit if drop_last else math.ceil(left / unit)) * round_size


def plan_epoch(
    policy: Policy,
    scores: ScoreTable,
    epoch: int,
    seed: int,
    world: int,
    rank: int,
    *,
    round_size: int = 1,
    drop_last: bool = False,
    comm: Comm | None = None,
    group: Any = None,
) -> tuple[Plan, dict[str, Any]]:
    """Epoch ``epoch``'s plan and its statistics (see the module docstring).

    The table makes the plan (:meth:`~leanbatch.ScoreTable.plan`): a sharded one, this rank's part
    (``comm``: the collectives, default ``torch.distributed`` over ``group``).
    """
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch, 0))
    plan: Plan = scores.plan(policy, epoch, generator, world=world, rank=rank, comm=comm, group=group,
                             drop_last=drop_last)  # fmt: skip
    padded, dropped = plan.padding(local_length(plan.order_length, 0, world, round_size, drop_last), world)
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
        "nonfinite_so_far": int(scores.nonfinite_count),
    }
    return plan, stats


def check_agreement(world: int, shard: bool, group: Any, stored: bool, unmerged: bool = False) -> None:
    """Refuse to plan from scores the other ranks never saw (shards would overlap or miss samples):
    a world that is not the process group's; scores ``stored`` by this rank since the ranks last
    agreed, with several replicas and no process group to merge them; or trained steps whose
    scores are ``unmerged`` yet in a distributed run.

    Example:
        >>> check_agreement(world=1, shard=True, group=None, stored=True)   # one process: fine
    """
    if unmerged and is_distributed(group):
        raise RuntimeError(
            "the scores trained since the last merge are not merged with the other ranks' yet, so "
            "this rank would plan a different epoch: call set_epoch(epoch) on every rank at the start "
            "of each epoch (as with DistributedSampler), which merges them"
        )
    if shard and initialized() and world != world_size(group):
        raise ValueError(
            f"num_replicas={world} but the process group has {world_size(group)} processes: "
            "every rank must plan from the same merged scores; leave num_replicas/rank unset to "
            "read them from the group, or pass process_group= (the data-parallel group)"
        )
    if world > 1 and not is_distributed(group) and stored:
        raise RuntimeError(
            f"num_replicas={world} but torch.distributed is not initialised, so the scores "
            "this rank stored cannot be merged with the other ranks' before planning (each rank would "
            "plan a different epoch and the shards would overlap or miss samples): call "
            "torch.distributed.init_process_group() before training, or drop num_replicas/rank"
        )
