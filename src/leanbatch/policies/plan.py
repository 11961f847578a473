"""The :class:`Plan` of one epoch: which samples are served, with which loss weight, in which order.

An unsharded plan holds every kept index and one weight per dataset index; the epoch's global
order is a keyed permutation of its kept list, split between ranks position by position.
A *sharded* plan (``shard`` set, see :class:`ShardInfo`) holds one rank's part only: the kept
indices it owns and the weights of its rows (see :mod:`leanbatch.slices`); each rank serves its
own kept list in a keyed order, all ranks padded (or truncated) to one length. Its order is
numbered ``k * world + rank`` for the ``k``-th sample of ``rank``, so the sampler's arithmetic
(:mod:`leanbatch.sharding`) is the same in both modes.

A *continuation* plan (``done > 0``) serves what an interrupted epoch had not trained yet: its
kept list holds those samples only, and ``done`` counts the ones trained before it (see
:mod:`leanbatch.sharded`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_saved_tensor
from leanbatch.permutation import KeyedPermutation, mix_seed
from leanbatch.slices import slice_size

__all__ = ["Plan", "ShardInfo", "full_plan"]


@dataclass(frozen=True)
class ShardInfo:
    """Where a sharded plan sits: this rank of ``world``, every rank's kept count, the shard length.

    Example:
        >>> ShardInfo(world=2, rank=0, counts=(3, 5), length=5).total
        8
    """

    world: int
    rank: int
    counts: tuple[int, ...]
    length: int  # samples each rank serves (the largest count; the smallest with drop_last)

    @property
    def total(self) -> int:
        """Kept samples over every rank."""
        return sum(self.counts)

    def trained_at(self, step: int) -> int:
        """Kept samples trained over every rank once each rank has served ``step`` of its own."""
        if not hasattr(self, "_sorted"):
            ordered = sorted(self.counts)
            prefix = [0]
            for c in ordered:
                prefix.append(prefix[-1] + c)
            object.__setattr__(self, "_sorted", (ordered, prefix))
        ordered, prefix = self._sorted  # type: ignore[attr-defined]
        below = bisect.bisect_left(ordered, step)  # ranks with fewer than `step` kept
        return prefix[below] + step * (len(ordered) - below)

    def state_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {"world": self.world, "rank": self.rank, "counts": list(self.counts), "length": self.length}


@dataclass(frozen=True)
class Plan:
    """One epoch's plan.

    Attributes:
        epoch: the epoch it was made for.
        num_samples: dataset size N.
        kept: sorted int32/int64 dataset indices served this epoch (sharded: those this rank owns),
            or ``None`` for all (sharded: all this rank owns).
        weights: float32 loss weight per dataset index, shape (N,) (sharded: per local row), or
            ``None`` for all 1.
        threshold: the pruning threshold (mean score) or ``None`` when not pruning.
        pruning: whether this epoch prunes.
        done: samples of the epoch trained before this plan's kept list (a continuation plan).
        shard: where a sharded plan sits (``None``: unsharded).

    Example:
        >>> p = full_plan(0, 10)
        >>> p.num_kept, p.num_pruned, p.weights is None
        (10, 0, True)
    """

    epoch: int
    num_samples: int
    kept: Tensor | None
    weights: Tensor | None
    threshold: float | None
    pruning: bool
    done: int = 0
    shard: ShardInfo | None = None
    _on_device: dict[torch.device, Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def local_kept(self) -> int:
        """Kept samples in this plan's list (sharded: this rank's)."""
        if self.kept is not None:
            return int(self.kept.numel())
        if self.shard is None:
            return self.num_samples
        return slice_size(self.num_samples, self.shard.world, self.shard.rank)

    @property
    def num_kept(self) -> int:
        """Samples kept this epoch, every rank's and those trained before a continuation plan."""
        return self.done + (self.local_kept if self.shard is None else self.shard.total)

    @property
    def num_pruned(self) -> int:
        """Samples skipped this epoch."""
        return self.num_samples - self.num_kept

    @property
    def order_length(self) -> int:
        """Positions of the epoch's global order this plan serves (sharded: ``world x length``)."""
        return self.local_kept if self.shard is None else self.shard.world * self.shard.length

    def kept_before(self, position: int) -> int:
        """Kept samples trained (``done`` included) once the order stands at ``position``."""
        if self.shard is None:
            return self.done + min(self.local_kept, position)
        return self.done + self.shard.trained_at(min(position, self.order_length) // self.shard.world)

    def inside(self, origin: int, rank: int, world: int) -> int:
        """Positions ``origin + rank + k * world`` that hold a kept sample, not padding."""
        if self.shard is None:
            return max(0, -(-(self.local_kept - origin - rank) // world))
        return max(0, self.shard.counts[rank] - origin // world)

    def local_rows(self, indices: Tensor) -> Tensor:
        """Rows of :attr:`weights` for dataset ``indices`` (sharded: this rank's, ``i // world``)."""
        if self.shard is None or self.shard.world == 1:
            return indices
        return torch.div(indices, self.shard.world, rounding_mode="floor")

    def serve(self, seed: int, positions: Tensor) -> Tensor:
        """The dataset indices (int64) at ``positions`` of the epoch's order (padding wraps around).

        Example:
            >>> import torch
            >>> order = full_plan(0, 5).serve(0, torch.arange(7))
            >>> sorted(order[:5].tolist()), torch.equal(order[5:], order[:2])
            ([0, 1, 2, 3, 4], True)
        """
        if self.shard is None:
            n = self.local_kept
            pos = KeyedPermutation(n, mix_seed(seed, self.epoch, 1))(positions % n)
            return pos if self.kept is None else self.kept[pos].to(torch.int64)
        w, r = self.shard.world, self.shard.rank
        n = self.local_kept
        k = torch.div(positions, w, rounding_mode="floor")
        if n == 0:  # nothing of this rank's kept: its padding repeats its first own sample
            return torch.full_like(k, r)
        local = KeyedPermutation(n, mix_seed(seed, self.epoch, 1, w, r))(k % n)
        return local * w + r if self.kept is None else self.kept[local].to(torch.int64)

    def weights_on(self, device: torch.device | str) -> Tensor | None:
        """The weights on ``device`` (copied once per device, asynchronously); ``None`` for all 1.

        Example:
            >>> import torch
            >>> p = Plan(0, 2, torch.tensor([0]), torch.tensor([2.0, 1.0]), None, True)
            >>> p.weights_on("cpu") is p.weights_on("cpu"), full_plan(0, 3).weights_on("cpu")
            (True, None)
        """
        if self.weights is None:
            return None
        dev = torch.device(device)
        w = self._on_device.get(dev)
        if w is None:
            w = self.weights if self.weights.device == dev else self.weights.to(dev, non_blocking=True)
            self._on_device[dev] = w
        return w

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values (loads with ``torch.load(weights_only=True)``).

        Example:
            >>> Plan.from_state(full_plan(2, 5).state_dict(), num_samples=5).epoch
            2
        """
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "kept": self.kept,
            "weights": self.weights,
            "threshold": self.threshold,
            "pruning": self.pruning,
        }
        if self.done:
            state["done"] = self.done
        if self.shard is not None:
            state["shard"] = self.shard.state_dict()
        return state

    @staticmethod
    def from_state(state: Any, num_samples: int, name: str = "plan") -> Plan:
        """A plan from :meth:`state_dict`, validated; ``ValueError`` naming the key that is wrong.

        Example:
            >>> import torch
            >>> bad = {**full_plan(0, 3).state_dict(), "weights": torch.tensor([1.0, float("nan"), 1.0])}
            >>> try:
            ...     Plan.from_state(bad, num_samples=3)
            ... except ValueError as e:
            ...     print(str(e).split(":")[0])
            plan['weights'] must hold finite loss weights >= 1, shape (3,)
        """
        return _plan_from_state(state, num_samples, name)


def _shard_from_state(value: Any, n: int, name: str) -> ShardInfo | None:
    if value is None:
        return None
    ok = isinstance(value, dict) and all(k in value for k in ("world", "rank", "counts", "length"))
    if ok:
        world, rank, counts, length = value["world"], value["rank"], value["counts"], value["length"]
        ints = [world, rank, length, *counts] if isinstance(counts, (list, tuple)) else []
        ok = bool(ints) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)
        ok = ok and world >= 1 and rank < world and len(counts) == world
        ok = ok and all(c <= slice_size(n, world, r) for r, c in enumerate(counts))
    if not ok:
        raise ValueError(f"{name}['shard'] must be a dict of world, rank, counts (one per rank) and length")
    return ShardInfo(world, rank, tuple(counts), length)


def _plan_from_state(state: Any, n: int, name: str) -> Plan:
    """Validate a saved plan against a dataset of ``n`` samples (see :meth:`Plan.from_state`)."""
    if not isinstance(state, dict):
        raise ValueError(f"{name} must be a dict saved by Plan.state_dict(), got {type(state).__name__}")
    missing = [
        k for k in ("epoch", "num_samples", "kept", "weights", "threshold", "pruning") if k not in state
    ]
    if missing:
        raise ValueError(f"{name} lacks the key(s) {missing}: it was not saved by this version of leanbatch")
    epoch, size, kept, weights = state["epoch"], state["num_samples"], state["kept"], state["weights"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"{name}['epoch'] must be an int >= 0, got {epoch!r}")
    if size != n:
        raise ValueError(f"{name}['num_samples'] is {size!r} but the dataset has {n} samples")
    shard = _shard_from_state(state.get("shard"), n, name)
    rows = n if shard is None else slice_size(n, shard.world, shard.rank)
    if kept is not None:
        ok = isinstance(kept, Tensor) and kept.dim() == 1 and not kept.is_floating_point()
        ok = ok and (kept.numel() > 0 or shard is not None)
        if not ok or (kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= n)):
            ok = False
        if ok and (
            bool((kept[1:] <= kept[:-1]).any()) or (shard and bool((kept % shard.world != shard.rank).any()))
        ):
            ok = False
        if not ok:
            raise ValueError(
                f"{name}['kept'] must be a non-empty sorted 1-D integer tensor of distinct indices in [0, {n})"
            )
    if weights is not None:
        try:
            check_saved_tensor(state, "weights", (rows,), nan=False, low=1.0)
        except ValueError:
            raise ValueError(
                f"{name}['weights'] must hold finite loss weights >= 1, shape ({rows},)"
            ) from None
    threshold = state["threshold"]
    if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"{name}['threshold'] must be None or a finite number, got {threshold!r}")
    done = state.get("done", 0)
    if isinstance(done, bool) or not isinstance(done, int) or not 0 <= done <= n:
        raise ValueError(f"{name}['done'] must be an int in [0, {n}], got {done!r}")
    plan = Plan(
        epoch,
        n,
        kept,
        weights,
        None if threshold is None else float(threshold),
        bool(state["pruning"]),
        done,
        shard,
    )
    if shard is not None and plan.local_kept != shard.counts[shard.rank]:
        raise ValueError(
            f"{name}['shard'] counts {shard.counts[shard.rank]} kept on this rank, its list holds {plan.local_kept}"
        )
    if plan.num_kept > n:
        raise ValueError(f"{name} keeps {plan.num_kept} samples of {n}")
    return plan


def full_plan(epoch: int, num_samples: int) -> Plan:
    """Every sample, weight exactly 1.

    Example:
        >>> full_plan(3, 5).kept is None
        True
    """
    return Plan(epoch, num_samples, None, None, None, False)
