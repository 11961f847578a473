"""An epoch's plan, made and saved: what the sampler does once per epoch, not per step.

- :func:`plan_epoch` makes epoch ``e``'s plan from the score table, with a ``torch.Generator``
  seeded from ``(seed, e)``: through the policy, by the score table (a sharded table plans its
  rank's slice, :meth:`~leanbatch.ScoreTable.plan`); and the epoch's
  statistics (kept, pruned, threshold, padding). It runs no collective of its own: the sampler
  merges the ranks' scores where every rank is at the same point, so planning is a local,
  deterministic function of the merged table.
- :func:`check_agreement` refuses to plan from scores the other ranks never saw.
- :func:`read_state` reads a saved run back (epoch, global position, the epoch's plan, the
  statistics, the seed), checking every key before anything changes: a checkpoint is data
  from outside, and a wrong one must fail with the key that is wrong.

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
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from leanbatch.checks import check_bool, check_int, require
from leanbatch.permutation import mix_seed
from leanbatch.policies.base import Policy
from leanbatch.policies.parts import Comm
from leanbatch.policies.plan import Plan
from leanbatch.ranks import initialized, is_distributed, world_size
from leanbatch.scores import ScoreTable

__all__ = [
    "check_agreement",
    "check_layout",
    "local_length",
    "plan_epoch",
    "read_state",
    "warn_past_end",
    "warn_skipped",
    "warn_stale_len",
    "write_state",
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


def _first(warned: set[str], what: str) -> bool:
    """Whether the warning ``what`` is given for the first time (noted in ``warned``)."""
    first = what not in warned
    warned.add(what)
    return first


def warn_past_end(warned: set[str], num_epochs: int, epoch: int) -> None:
    """Warn (once per run: ``warned`` holds those given) that ``epoch`` is past ``num_epochs``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always"); warn_past_end(set(), 2, 2)
        >>> "all 2 epochs" in str(w[0].message)
        True
    """
    if not _first(warned, "past_end"):
        return
    warnings.warn(
        f"all {num_epochs} epochs (num_epochs={num_epochs}) are trained: epoch {epoch} serves nothing "
        "(training on would run at progress 1.0, where a ProgressLR schedule is at its end); build the "
        "wrapper with num_epochs= the number of epochs you train",
        RuntimeWarning,
        stacklevel=4,
    )


def warn_skipped(warned: set[str], epoch: int, next_epoch: int, num_epochs: int) -> None:
    """Warn (once per run) that ``set_epoch(epoch)`` skips untrained epochs from ``next_epoch`` on."""
    if not _first(warned, "skip"):
        return
    skipped = f"epoch {next_epoch}" if epoch == next_epoch + 1 else f"epochs {next_epoch} .. {epoch - 1}"
    warnings.warn(
        f"set_epoch({epoch}) skips {skipped}, which trained nothing: epochs are 0-based (for epoch in "
        f"range({num_epochs}): ds.set_epoch(epoch)); a 1-based loop skips epoch 0 and its warm-up and "
        "trains nothing in its last epoch",
        stacklevel=3,
    )


def warn_stale_len(warned: set[str], finished: int, read: int, epoch: int, length: int) -> None:
    """Warn (once per run) that a length read between epochs was the finished epoch's, not the next's.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always"); warn_stale_len(set(), 0, 96, 1, 60)
        >>> "ds.set_epoch(epoch)" in str(w[0].message)
        True
    """
    if not _first(warned, "stale_len"):
        return
    warnings.warn(
        f"len() read after epoch {finished}'s last step gave {read} samples, epoch {finished}'s, but "
        f"epoch {epoch}, which begins now, serves {length}: with DataLoader worker processes (or any "
        "loader that reads ahead) the sampler cannot see that the loop's pass is over, so a length read "
        "between epochs is the finished epoch's, and a schedule built from it (OneCycleLR("
        "steps_per_epoch=len(loader))) has the wrong number of steps. Call ds.set_epoch(epoch) at the "
        "top of each epoch, before reading len(loader)",
        stacklevel=4,
    )


def check_layout(
    num_replicas: Any, rank: Any, shard: Any, drop_last: Any, shard_scores: Any, scores: Any, policy: Any
) -> None:
    """The sampler's data-parallel arguments, checked (``ValueError``/``TypeError`` naming the wrong one).

    Example:
        >>> from leanbatch import RandomPolicy, ScoreTable
        >>> try:
        ...     check_layout(2, 2, True, False, False, ScoreTable(4), RandomPolicy())
        ... except ValueError as e:
        ...     print(e)
        rank must be in [0, num_replicas=2), got 2
    """
    if num_replicas is not None:
        try:
            check_int(num_replicas, "num_replicas", 1)
        except TypeError as e:
            raise ValueError(str(e)) from None
    if rank is not None:
        bad = isinstance(rank, bool) or not isinstance(rank, int) or rank < 0
        if bad or (num_replicas is not None and rank >= num_replicas):
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
    check_bool(shard, "shard")
    check_bool(drop_last, "drop_last")
    check_bool(shard_scores, "shard_scores")
    if shard_scores and not shard:
        raise ValueError(
            "shard_scores=True has each rank serve the samples it owns, so it needs shard=True: "
            "a framework that shards the batches of one global order (shard=False) cannot use it"
        )
    if not shard and (num_replicas not in (None, 1) or rank not in (None, 0)):
        raise ValueError(
            "shard=False serves the whole plan on every process (the framework shards the batches), "
            f"so num_replicas/rank do not apply: got num_replicas={num_replicas!r}, rank={rank!r}"
        )
    if shard_scores:
        if not getattr(policy, "shardable", False):
            raise ValueError(
                f"shard_scores=True plans each rank's slice of the index space, which {type(policy).__name__} "
                "cannot do (it is not shardable; LossRankPolicy needs every score in one place to rank them): "
                "use InfoBatchPolicy, RandomPolicy, RS2Policy, EpsilonGreedyPolicy, UCBPolicy or SeTaPolicy, "
                "or leave shard_scores off"
            )
        if scores.owner is None:
            raise ValueError("shard_scores=True plans one rank's slice: the scores must be a ShardedScores")
    elif scores.owner is not None:
        raise ValueError(
            "this score table holds one rank's slice (ShardedScores): pass shard_scores=True to the sampler"
        )


def write_state(
    seed: int,
    num_samples: int,
    where: tuple[int, int, bool, int],
    plan: Plan | None,
    stats: list[dict[str, Any]],
) -> dict[str, Any]:
    """A sampler's state in the format :func:`read_state` reads: plain values and the plan's tensors.

    ``where``: ``(epoch, position, finished, world)``, the position counted in the epoch's global
    order (all ranks); a fully trained epoch ``e`` is ``(e, its length, True, world)``.

    Example:
        >>> state = write_state(0, 8, (1, 0, False, 1), None, [])
        >>> read_state(state, ScoreTable(8))[:2]
        (1, 0)
    """
    epoch, position, finished, world = where
    return {
        "version": 2,
        "seed": seed,
        "num_samples": num_samples,
        "epoch": epoch,
        "position": position,
        "finished": finished,
        "world": world,
        "plan": None if plan is None else plan.state_dict(),
        "epoch_stats": [dict(s) for s in stats],
    }


def read_state(state: Any, scores: ScoreTable) -> tuple[int, int, Plan | None, list[dict[str, Any]], int]:
    """``(epoch, global position, plan, epoch statistics, seed)`` of a sampler's saved state, validated
    for ``scores``, which reads the saved plan (a sharded table: its own rank's part only).

    Example:
        >>> state = {"version": 2, "seed": 0, "num_samples": 8, "epoch": 1, "position": 0, "finished": False,
        ...          "world": 1, "plan": None, "epoch_stats": []}
        >>> read_state(state, ScoreTable(8))[:2]
        (1, 0)
        >>> try:
        ...     read_state({**state, "epoch": -1}, ScoreTable(8))
        ... except ValueError as e:
        ...     print(e)
        state_dict['epoch'] must be an int >= 0, got -1
    """
    keys = ("version", "seed", "num_samples", "epoch", "position", "finished", "plan", "epoch_stats")
    state = require(state, keys, "state_dict")
    if state["version"] != 2:
        raise ValueError(f"state_dict has version {state['version']!r}; this leanbatch reads version 2")
    num_samples = scores.num_samples
    if state["num_samples"] != num_samples:
        raise ValueError(
            f"state_dict is for a dataset of {state['num_samples']} samples, this sampler serves "
            f"{num_samples}: load a checkpoint made with the same dataset"
        )
    seed = state["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"state_dict['seed'] must be an int, got {seed!r}")
    epoch = _count(state, "epoch")
    if not isinstance(state["finished"], bool):
        raise ValueError(f"state_dict['finished'] must be a bool, got {state['finished']!r}")
    if state["finished"]:
        epoch, trained, plan = epoch + 1, 0, None
    else:
        trained, saved = _count(state, "position"), state["plan"]
        plan = None if saved is None else scores.load_plan(Plan, saved, "state_dict['plan']")
    if plan is not None and plan.epoch != epoch:
        raise ValueError(f"state_dict['plan'] is epoch {plan.epoch}'s but the position is in epoch {epoch}")
    if trained and plan is None:
        raise ValueError(
            f"state_dict['plan'] is missing for a position inside epoch {epoch} ({trained} trained)"
        )
    if plan is not None and trained > plan.order_length:
        raise ValueError(
            f"state_dict position {trained} is past the end of epoch {epoch}, whose plan keeps {plan.order_length}"
        )
    stats = state["epoch_stats"]
    if not isinstance(stats, list) or not all(isinstance(s, Mapping) and "epoch" in s for s in stats):
        raise ValueError("state_dict['epoch_stats'] must be a list of per-epoch dicts")
    return epoch, trained, plan, [dict(s) for s in stats], seed


def _count(state: Mapping[str, Any], key: str) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"state_dict[{key!r}] must be an int >= 0, got {v!r}")
    return v
