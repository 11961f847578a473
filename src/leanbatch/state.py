"""Checking a loaded state before it is trusted: shapes, ranges, finiteness, the dataset's size.

A checkpoint is data from outside: a wrong or corrupted one must fail on load with the key
that is wrong, never train from a NaN weight or an index past the dataset's end.
:func:`record_state` reads the training record's state (this release's version 2, and version
1 of the release before, whose position was counted per rank); :func:`~leanbatch.checks.require`
names a missing key.

Example:
    >>> from leanbatch.sharding import Sharding
    >>> state = {"version": 2, "seed": 0, "num_samples": 8, "epoch": 1, "position": 0, "finished": False,
    ...          "world": 1, "plan": None, "epoch_stats": []}
    >>> record_state(state, 8, Sharding())[:2]
    (1, 0)
    >>> try:
    ...     record_state({**state, "epoch": -1}, 8, Sharding())
    ... except ValueError as e:
    ...     print(e)
    state_dict['epoch'] must be an int >= 0, got -1
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from leanbatch.checks import check_saved_tensor, require
from leanbatch.policies import Plan
from leanbatch.sharding import Sharding

if TYPE_CHECKING:
    from torch import Tensor

    from leanbatch.scores import ScoreTable

__all__ = ["record_state", "require", "score_state"]


def score_state(state: Any, table: ScoreTable) -> tuple[Tensor, Tensor | None, int]:
    """``(values, variances, nonfinite)`` of a saved score table, validated against ``table``.

    A sharded table's state (``world``, ``rank``) loads only into the same rank of the same world:
    :func:`leanbatch.sharded.shard_state` re-shards a state for another.

    Example:
        >>> from leanbatch.scores import ScoreTable
        >>> table = ScoreTable(5, world=2, rank=1)
        >>> score_state(table.state_dict(), table)[0].shape
        torch.Size([2])
    """
    state = require(state, ("num_samples", "values"), "state_dict")
    n = state["num_samples"]
    if n != table.num_samples:
        raise ValueError(
            f"state_dict is for {n} samples but this table has {table.num_samples}: "
            "load a checkpoint made with the same dataset"
        )
    where = (state.get("world", 1), state.get("rank", 0))
    if where != (table.slice.world, table.slice.rank):
        raise ValueError(
            f"state_dict holds the scores of rank {where[1]} of {where[0]}, this table is rank "
            f"{table.slice.rank} of {table.slice.world}: gather the shards with leanbatch.sharded.gather_states "
            "and re-shard them with leanbatch.sharded.shard_state"
        )
    size = table.slice.size
    values = check_saved_tensor(state, "values", (size,))
    var = state.get("variance")
    if (var is None) != (not table.tracks_variance):
        raise ValueError(
            "state_dict and this table disagree on variance tracking: build the table with the same "
            "ScoreTable(..., variance=) as the one that saved it"
        )
    if var is not None:
        var = check_saved_tensor(state, "variance", (size,), low=0.0)
    nonfinite = state.get("nonfinite", 0)
    if isinstance(nonfinite, bool) or not isinstance(nonfinite, int) or nonfinite < 0:
        raise ValueError(f"state_dict['nonfinite'] must be an int >= 0, got {nonfinite!r}")
    return values, var, nonfinite


def _count(state: Mapping[str, Any], key: str) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"state_dict[{key!r}] must be an int >= 0, got {v!r}")
    return v


def record_state(
    state: Any, num_samples: int, sharding: Sharding
) -> tuple[int, int, Plan | None, list[dict[str, Any]], int]:
    """``(epoch, global position, plan, epoch statistics, seed)`` of a training record's state, validated.

    Version 2 counts ``position`` in the epoch's global order (all ranks); version 1 (the
    release before; no ``version`` key) counted it per rank, and it is read as that many samples
    on each of the current ranks (resume it on as many ranks as saved it).
    """
    state = require(state, ("seed", "num_samples", "epoch", "plan", "epoch_stats"), "state_dict")
    if state["num_samples"] != num_samples:
        raise ValueError(
            f"state_dict is for a dataset of {state['num_samples']} samples, this sampler serves "
            f"{num_samples}: load a checkpoint made with the same dataset"
        )
    version = state.get("version", 1)
    if version not in (1, 2):
        raise ValueError(f"state_dict has version {version!r}; this leanbatch reads versions 1 and 2")
    seed = state["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"state_dict['seed'] must be an int, got {seed!r}")
    epoch = _count(state, "epoch")
    require(state, ("position", "finished"), "state_dict")
    finished = state["finished"]
    if not isinstance(finished, bool):
        raise ValueError(f"state_dict['finished'] must be a bool, got {finished!r}")
    if finished:
        epoch, trained, saved_plan = epoch + 1, 0, None
    elif version == 1:  # counted per rank: that many samples on each of the current ranks
        trained, saved_plan = _count(state, "position") * sharding.resolve()[0], state["plan"]
    else:
        trained, saved_plan = _count(state, "position"), state["plan"]
    plan = None if saved_plan is None else Plan.from_state(saved_plan, num_samples, "state_dict['plan']")
    if plan is not None and plan.epoch != epoch:
        raise ValueError(f"state_dict['plan'] is epoch {plan.epoch}'s but the position is in epoch {epoch}")
    _check_layout(plan, sharding)
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


def _check_layout(plan: Plan | None, sharding: Sharding) -> None:
    """A sharded plan loads only into the same rank of the same world, an unsharded one only unsharded."""
    if plan is None:
        return
    if plan.shard is None and sharding.scores_sharded:
        raise ValueError(
            "state_dict['plan'] is unsharded but this sampler shards its scores: cut this rank's state out "
            "with leanbatch.sharded.shard_state (InfoBatch(shard_scores=True).load_state_dict does it)"
        )
    if plan.shard is not None:
        where = (plan.shard.world, plan.shard.rank)
        if not sharding.scores_sharded or where != sharding.resolve():
            world, rank = sharding.resolve()
            this = f"rank {rank} of {world}" if sharding.scores_sharded else "unsharded"
            raise ValueError(
                f"state_dict['plan'] is the plan of rank {where[1]} of {where[0]} (shard_scores=True), this "
                f"sampler is {this}: gather the ranks' states with leanbatch.sharded.gather_states (and "
                "re-shard them with shard_state)"
            )
