"""The :class:`Plan` of one epoch: which samples are served, with which loss weight, in which order.

A plan holds every kept index and one weight per dataset index; the epoch's global order is a
keyed permutation of its kept list (position ``p`` serves ``kept[perm(p mod K)]``), split
between ranks position by position by the sampler. A *continuation* plan (``trained_before > 0``) serves
what an interrupted epoch had not trained yet: its kept list holds those samples only, and
``trained_before`` counts the ones trained before it (see :mod:`leanbatch.distributed.checkpoints`).
A sharded run's plans hold one rank's part (:class:`~leanbatch.distributed.shards.ShardedPlan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_saved_tensor
from leanbatch.permutation import KeyedPermutation, mix_seed

__all__ = ["Plan", "full_plan"]

_KEYS = ("epoch", "num_samples", "kept", "weights", "threshold", "pruning", "trained_before")


@dataclass(frozen=True)
class Plan:
    """One epoch's plan.

    Attributes:
        epoch: the epoch it was made for.
        num_samples: dataset size N.
        kept: sorted int32/int64 dataset indices served this epoch, or ``None`` for all.
        weights: float32 loss weight per dataset index, shape (N,), or ``None`` for all 1.
        threshold: the pruning threshold (mean score) or ``None`` when not pruning.
        pruning: whether this epoch prunes.
        trained_before: samples of the epoch trained before this plan's kept list (a continuation plan).

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
    trained_before: int = 0
    _on_device: dict[torch.device, Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_listed(self) -> int:
        """Samples in this plan's kept list (``num_samples`` when ``kept`` is ``None``)."""
        return self.num_samples if self.kept is None else int(self.kept.numel())

    @property
    def num_kept(self) -> int:
        """Samples kept this epoch, those trained before a continuation plan included."""
        return self.trained_before + self.num_listed

    @property
    def num_pruned(self) -> int:
        """Samples skipped this epoch."""
        return self.num_samples - self.num_kept

    @property
    def order_length(self) -> int:
        """Positions of the epoch's global order this plan serves."""
        return self.num_listed

    def kept_before(self, position: int) -> int:
        """Kept samples trained (``trained_before`` included) once the order stands at ``position``."""
        return self.trained_before + min(self.num_listed, position)

    def inside(self, origin: int, rank: int, world: int) -> int:
        """Positions ``origin + rank + k * world`` that hold a kept sample, not padding."""
        return max(0, -(-(self.num_listed - origin - rank) // world))

    def local_rows(self, indices: Tensor) -> Tensor:
        """Rows of :attr:`weights` for dataset ``indices`` (the indices themselves)."""
        return indices

    def padding(self, length: int, world: int) -> tuple[int, int]:
        """``(padded, dropped)``: the samples repeated, and those left out, when each of ``world`` ranks
        serves ``length`` of the epoch's order."""
        total = length * world
        return max(0, total - self.num_kept), max(0, self.num_kept - total)

    def serve(self, seed: int, positions: Tensor) -> Tensor:
        """The dataset indices (int64) at ``positions`` of the epoch's order (padding wraps around).

        Example:
            >>> import torch
            >>> order = full_plan(0, 5).serve(0, torch.arange(7))
            >>> sorted(order[:5].tolist()), torch.equal(order[5:], order[:2])
            ([0, 1, 2, 3, 4], True)
        """
        n = self.num_listed
        pos = KeyedPermutation(n, mix_seed(seed, self.epoch, 1))(positions % n)
        return pos if self.kept is None else self.kept[pos].to(torch.int64)

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
        dev = device if type(device) is torch.device else torch.device(device)
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
        return {k: getattr(self, k) for k in _KEYS}

    @classmethod
    def from_state(cls, state: Any, num_samples: int, name: str = "plan") -> Plan:
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
        if isinstance(state, dict) and state.get("shard") is not None:
            raise ValueError(
                f"{name} is one rank's part of a sharded plan (shard_scores=True): gather the ranks' states "
                "with leanbatch.distributed.gather_states (and re-shard them with shard_state)"
            )
        return cls(**plan_fields(state, num_samples, name, num_samples, None))


def plan_fields(state: Any, n: int, name: str, rows: int, owner: tuple[int, int] | None) -> dict[str, Any]:
    """The validated fields of a saved plan over ``n`` samples whose weights have ``rows`` rows;
    ``owner``: ``(world, rank)`` when the kept list holds one rank's indices (it may be empty).
    """
    if not isinstance(state, dict):
        raise ValueError(f"{name} must be a dict saved by Plan.state_dict(), got {type(state).__name__}")
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise ValueError(f"{name} lacks the key(s) {missing}: it was not saved by this version of leanbatch")
    epoch, size, kept, weights = state["epoch"], state["num_samples"], state["kept"], state["weights"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"{name}['epoch'] must be an int >= 0, got {epoch!r}")
    if size != n:
        raise ValueError(f"{name}['num_samples'] is {size!r} but the dataset has {n} samples")
    if kept is not None and not _valid_kept(kept, n, owner):
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
    done = state["trained_before"]
    if isinstance(done, bool) or not isinstance(done, int) or not 0 <= done <= n:
        raise ValueError(f"{name}['trained_before'] must be an int in [0, {n}], got {done!r}")
    listed = n if kept is None else int(kept.numel())
    if owner is None and done + listed > n:
        raise ValueError(f"{name} keeps {done + listed} samples of {n}")
    fields = {k: state[k] for k in _KEYS}  # checked above
    return dict(
        fields, threshold=None if threshold is None else float(threshold), pruning=bool(state["pruning"])
    )


def _valid_kept(kept: Any, n: int, owner: tuple[int, int] | None) -> bool:
    if not isinstance(kept, Tensor) or kept.dim() != 1 or kept.is_floating_point():
        return False
    if not kept.numel():
        return owner is not None
    if int(kept.min()) < 0 or int(kept.max()) >= n or bool((kept[1:] <= kept[:-1]).any()):
        return False
    return owner is None or not bool((kept % owner[0] != owner[1]).any())


def full_plan(epoch: int, num_samples: int) -> Plan:
    """Every sample, weight exactly 1.

    Example:
        >>> full_plan(3, 5).kept is None
        True
    """
    return Plan(epoch, num_samples, None, None, None, False)
