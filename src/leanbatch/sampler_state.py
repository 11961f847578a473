"""The sampler's arguments and its saved state, checked: what :class:`~leanbatch.PrunedSampler` reads
from outside.

- :func:`check_layout`: its data-parallel arguments (``ValueError``/``TypeError`` naming the wrong one).
- :func:`check_limit`, :func:`served_length`: the cut of an epoch (``set_limit``).
- :func:`write_state` / :func:`read_state`: its state (epoch, global position, the epoch's plan, the
  statistics, the seed), read back checking every key before anything changes: a checkpoint is data
  from outside, and a wrong one must fail with the key that is wrong.

Example:
    >>> from leanbatch import ScoreTable
    >>> read_state(write_state(0, 8, (1, 0, False, 1), None, []), ScoreTable(8))[:2]
    (1, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from leanbatch.checks import check_bool, check_int, require
from leanbatch.epochs import local_length
from leanbatch.policies.plan import Plan
from leanbatch.scores import ScoreTable

Limit = Callable[[int], int] | None  # the samples each rank serves in an epoch (None: all of them)

__all__ = ["check_layout", "check_limit", "served_length", "read_state", "write_state"]


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
    limit: Limit = None,
) -> dict[str, Any]:
    """A sampler's state in the format :func:`read_state` reads: plain values and the plan's tensors;
    ``limited``: whether its epochs were cut (``limit``, :func:`served_length`; the cut itself is code,
    set again before loading).

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
        "limited": limit is not None,
    }


def read_state(
    state: Any, scores: ScoreTable, limit: Limit = None
) -> tuple[int, int, Plan | None, list[dict[str, Any]], int]:
    """``(epoch, global position, plan, epoch statistics, seed)`` of a sampler's saved state, validated
    for ``scores``, which reads the saved plan (a sharded table: its own rank's part only), and for the
    sampler's ``limit``: a state saved with a cut is refused without one, and the reverse (a state with
    no ``limited`` key was saved without).

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
    _check_limited(state.get("limited", False), limit)
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


def _check_limited(limited: Any, limit: Limit) -> None:
    """A state saved with a cut (``limited``) is refused by a sampler without ``limit``, and the reverse."""
    if not isinstance(limited, bool):
        raise ValueError(f"state_dict['limited'] must be a bool, got {limited!r}")
    if limited != (limit is not None):
        raise ValueError(
            "state_dict was saved by a sampler whose epochs were cut (set_limit) and this one serves whole "
            "epochs: call set_limit with the same limit before load_state_dict"
            if limited
            else "state_dict was saved by a sampler that served whole epochs and this one's epochs are cut "
            "(set_limit): load it into a sampler without a limit, or save it from one with the limit"
        )


def _count(state: Mapping[str, Any], key: str) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"state_dict[{key!r}] must be an int >= 0, got {v!r}")
    return v


def check_limit(limit: Any) -> Limit:
    """``set_limit``'s argument: ``None`` or a function of the epoch (its value is checked when an epoch
    is cut, by :func:`served_length`).

    Example:
        >>> try:
        ...     check_limit(5)
        ... except TypeError as e:
        ...     print(str(e).split(":")[0])
        limit must be None or a function of the epoch (the samples each rank serves in it)
    """
    if limit is not None and not callable(limit):
        raise TypeError(
            "limit must be None or a function of the epoch (the samples each rank serves in it): "
            f"got {type(limit).__name__}, e.g. set_limit(lambda epoch: 640)"
        )
    return limit


def served_length(
    order_length: int, epoch: int, start: int, world: int, round_size: int, drop_last: bool, limit: Limit
) -> int:
    """Samples one rank serves of epoch ``epoch``'s order from the global position ``start`` on
    (:func:`~leanbatch.epochs.local_length`: whole rounds, equal on every rank), up to the epoch's cut:
    the first ``limit(epoch)`` positions of each of the ``world`` ranks (``limit=None``: no cut).

    Example:
        >>> served_length(10, 0, 0, 2, 1, False, None), served_length(10, 0, 0, 2, 1, False, lambda e: 3)
        (5, 3)
        >>> cut = lambda epoch: 3
        >>> served_length(10, 0, 4, 2, 1, False, cut), served_length(10, 0, 0, 2, 1, False, lambda e: 9)
        (1, 5)
    """
    if limit is not None:
        cut = limit(epoch)
        if isinstance(cut, bool) or not isinstance(cut, int) or cut < 0:
            raise ValueError(
                f"limit({epoch}) must be an int >= 0 (the samples each rank serves), got {cut!r}"
            )
        order_length = min(order_length, cut * world)
    return local_length(order_length, start, world, round_size, drop_last)
