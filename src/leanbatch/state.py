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
from typing import Any

from leanbatch.checks import require
from leanbatch.policies import Plan
from leanbatch.sharding import Sharding

__all__ = ["record_state", "require"]


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
    if trained and plan is None:
        raise ValueError(
            f"state_dict['plan'] is missing for a position inside epoch {epoch} ({trained} trained)"
        )
    if plan is not None and trained > plan.num_kept:
        raise ValueError(
            f"state_dict position {trained} is past the end of epoch {epoch}, whose plan keeps {plan.num_kept}"
        )
    stats = state["epoch_stats"]
    if not isinstance(stats, list) or not all(isinstance(s, Mapping) and "epoch" in s for s in stats):
        raise ValueError("state_dict['epoch_stats'] must be a list of per-epoch dicts")
    return epoch, trained, plan, [dict(s) for s in stats], seed
