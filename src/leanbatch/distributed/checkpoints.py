"""Checkpoints of sharded runs (``shard_scores=True``): gather the ranks' states, re-shard for another world.

Each rank of a sharded run saves its own state: the scores of the rows it owns, its part of the
epoch's plan and its position (:meth:`leanbatch.InfoBatch.state_dict`). :func:`gather_states`
puts every rank's state together into one unsharded state, which a plain ``InfoBatch`` loads;
:func:`shard_state` cuts an unsharded state (gathered, or saved by an unsharded run) into the
state of one rank of any world, which ``InfoBatch(shard_scores=True)`` loads (it also accepts the
unsharded state itself and cuts its own part out).

Mid-epoch, what was trained is reconstructed from the plan, the seed, the epoch and each old
rank's position (each rank served its kept list in a keyed order). The resumed epoch is a
*continuation plan*: it keeps the samples not trained yet, with the same weights, and counts
the trained ones in ``trained_before``, so every kept sample is trained once in the epoch whatever the
new world, and the position and progress carry on. Later epochs are planned as usual, so
they equal the uninterrupted run's.

Example:
    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from leanbatch import InfoBatch
    >>> data = TensorDataset(torch.arange(10.0))
    >>> ranks = [InfoBatch(data, 2, shard_scores=True, num_replicas=2, rank=r) for r in range(2)]
    >>> whole = gather_states([ds.state_dict() for ds in ranks])
    >>> whole["scores"]["values"].shape, shard_state(whole, world=5, rank=4)["scores"]["values"].shape
    (torch.Size([10]), torch.Size([2]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import require
from leanbatch.distributed.shards import ShardedPlan, ShardedScores, as_shard
from leanbatch.policies.parts import Slice
from leanbatch.policies.plan import Plan

__all__ = ["gather_states", "own_part", "shard_state"]


def _parts(state: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    checked = require(state, ("scores", "sampler"), "InfoBatch state_dict")
    return dict(checked["scores"]), dict(checked["sampler"])


def gather_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One unsharded InfoBatch state from the states of every rank of a sharded run (any order).

    ``ValueError`` when the states are not one world's, or disagree on the dataset size, seed or epoch.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from leanbatch import InfoBatch
        >>> ranks = [InfoBatch(TensorDataset(torch.arange(6.0)), 2, shard_scores=True, num_replicas=3, rank=r)
        ...          for r in range(3)]
        >>> ranks[2].scores.update(torch.tensor([5]), torch.tensor([0.5]))
        >>> gather_states([ds.state_dict() for ds in ranks])["scores"]["values"].tolist()[4:]
        [nan, 0.5]
    """
    parts = [_parts(s) for s in states]
    world = len(parts)
    by_rank = sorted(parts, key=lambda p: p[0].get("rank", 0))
    if world < 1 or [p[0].get("rank", 0) for p in by_rank] != list(range(world)):
        raise ValueError(f"gather_states needs the state of every rank 0 .. {world - 1} of one sharded run")
    first_scores, first = by_rank[0]
    for scores, sampler in by_rank:
        if scores.get("world", 1) != world:
            raise ValueError(
                f"a state of rank {scores.get('rank', 0)} of {scores.get('world', 1)} among {world} states"
            )
        for key in ("num_samples", "seed", "epoch"):
            if sampler.get(key) != first.get(key):
                raise ValueError(
                    f"the ranks' states disagree on {key}: {sampler.get(key)!r} != {first.get(key)!r}"
                )
    n = first["num_samples"]
    scores = {k: v for k, v in first_scores.items() if k not in ("world", "rank")}
    scores["values"] = _interleave([s["values"] for s, _ in by_rank], n)
    if first_scores.get("variance") is not None:
        scores["variance"] = _interleave([s["variance"] for s, _ in by_rank], n)
    scores["nonfinite"] = max(int(s.get("nonfinite", 0)) for s, _ in by_rank)
    sampler = dict(first, world=1, position=0, plan=None)
    if all(s["finished"] for _, s in by_rank) or all(s["plan"] is None for _, s in by_rank):
        sampler.update(finished=any(s["finished"] for _, s in by_rank), position=first["position"])
        return {"version": 2, "scores": scores, "sampler": sampler}
    if any(s.get("plan") is None for _, s in by_rank):
        raise ValueError("a rank's state mid-epoch has no plan while another rank's has one")
    plans = [ShardedPlan.from_state(s["plan"], n, "state_dict['sampler']['plan']") for _, s in by_rank]
    left, trained = [], plans[0].trained_before
    for (_, s), plan in zip(by_rank, plans, strict=True):
        rest, done = _untrained(plan, s["seed"], plan.order_length if s["finished"] else s["position"])
        left.append(rest)
        trained += done
    kept = torch.sort(torch.cat(left)).values
    weights = None if plans[0].weights is None else _interleave([p.weights for p in plans], n)  # type: ignore[misc]
    whole = Plan(plans[0].epoch, n, kept, weights, plans[0].threshold, plans[0].pruning, trained)
    return {"version": 2, "scores": scores, "sampler": _resumed(sampler, whole)}


def shard_state(state: dict[str, Any], world: int, rank: int, drop_last: bool = False) -> dict[str, Any]:
    """The state of rank ``rank`` of ``world`` cut from an unsharded InfoBatch state.

    Mid-epoch, the new rank's plan keeps the samples it owns that were not trained yet, padded
    (or with ``drop_last``, truncated) to the longest (shortest) new shard, as a planned epoch is.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from leanbatch import InfoBatch
        >>> whole = InfoBatch(TensorDataset(torch.arange(5.0)), 2)
        >>> whole.scores.update(torch.arange(5), torch.arange(5.0))
        >>> shard_state(whole.state_dict(), world=2, rank=1)["scores"]["values"].tolist()
        [1.0, 3.0]
    """
    scores, sampler = _parts(state)
    if "world" in scores or (sampler.get("plan") or {}).get("shard") is not None:
        raise ValueError(
            "shard_state cuts an unsharded state: gather the ranks' states first (gather_states)"
        )
    n = scores["num_samples"]
    if not (isinstance(world, int) and 1 <= world <= n and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(
            f"world must be in [1, {n}] and rank in [0, world), got world={world!r}, rank={rank!r}"
        )
    out = dict(scores, values=scores["values"][rank::world].clone(), world=world, rank=rank)
    if scores.get("variance") is not None:
        out["variance"] = scores["variance"][rank::world].clone()
    if world == 1:
        out = {k: v for k, v in out.items() if k not in ("world", "rank")}
    mine = dict(sampler, world=world)
    if sampler.get("plan") is not None and not sampler["finished"]:
        plan = Plan.from_state(sampler["plan"], n, "state_dict['sampler']['plan']")
        rest, done = _untrained(plan, sampler["seed"], sampler["position"])
        owner = rest % world  # this rank's part of what is left, and every rank's count
        counts = tuple(int(c) for c in torch.bincount(owner, minlength=world))
        kept = rest[owner == rank].to(torch.int32 if n < 2**31 else torch.int64)
        weights = None if plan.weights is None else plan.weights[rank::world].clone()
        part = Plan(plan.epoch, n, kept, weights, plan.threshold, plan.pruning, plan.trained_before + done)
        mine = _resumed(mine, as_shard(part, rank, counts, drop_last))
    return {"version": 2, "scores": out, "sampler": mine}


def own_part(state: Mapping[str, Any], table: ShardedScores, drop_last: bool = False) -> dict[str, Any]:
    """``state`` for ``table``'s rank: cut out of an unsharded (or gathered) InfoBatch state
    (:func:`shard_state`), or ``state`` itself when it is one rank's already.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from leanbatch import InfoBatch
        >>> whole = InfoBatch(TensorDataset(torch.arange(4.0)), 2).state_dict()
        >>> own_part(whole, ShardedScores(4, world=2, rank=1))["scores"]["rank"]
        1
    """
    plan = state["sampler"].get("plan") if isinstance(state["sampler"], dict) else None
    if "world" in state["scores"] or (isinstance(plan, dict) and plan.get("shard") is not None):
        return dict(state)  # one rank's state: it loads (or is refused) as it is
    require(state["scores"], ("num_samples",), "state_dict['scores']")
    if state["scores"]["num_samples"] != table.num_samples:
        raise ValueError(
            f"state_dict is for a dataset of {state['scores']['num_samples']} samples, this wrapper "
            f"holds {table.num_samples}: load a checkpoint made with the same dataset"
        )
    return shard_state(dict(state), table.slice.world, table.slice.rank, drop_last)


def _interleave(parts: list[Tensor], n: int) -> Tensor:
    """The (n,) tensor whose rows ``r::world`` are ``parts[r]``."""
    out = torch.empty(n, dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        out[r :: len(parts)] = part
    return out


def _untrained(plan: Plan, seed: int, position: int) -> tuple[Tensor, int]:
    """``(the kept indices not trained yet, how many were trained)`` once the order stood at ``position``.

    Unsharded: positions ``0 .. position - 1`` of the order. Sharded: the rank's first
    ``position // world`` samples (each rank serves its own list).
    """
    world, rank = (plan.world, plan.rank) if isinstance(plan, ShardedPlan) else (1, 0)
    listed = Slice(plan.num_samples, world, rank).indices() if plan.kept is None else plan.kept.long()
    count = listed.numel()
    served = min(count, position // world)
    if served == 0:
        return listed, 0
    positions = torch.arange(served, dtype=torch.int64) * world + rank  # rank r's k-th sample
    trained = plan.serve(seed, positions)
    left = torch.ones(count, dtype=torch.bool)
    left[torch.searchsorted(listed, trained)] = False
    return listed[left], served


def _resumed(sampler: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """The sampler state that resumes ``plan`` at its start (finished if nothing is left)."""
    if plan.num_kept == plan.trained_before:  # everything trained: the epoch is over
        return dict(sampler, finished=True, position=0, plan=None)
    return dict(sampler, finished=False, position=0, plan=plan.state_dict())
