"""What :class:`~leanbatch.InfoBatch` is given, checked and converted: the dataset, the policy, the
rows of a batch, and the sharded score table's world.

Example:
    >>> _unscored(torch.tensor([4, 5, 6]), None, scored=2, n=3, spare=9).tolist()   # padding: spare slot
    [4, 5, 9]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from leanbatch.checks import check_index_tensor
from leanbatch.policies import InfoBatchPolicy, Policy, RandomPolicy
from leanbatch.rng import initialized, process_rank, world_size

__all__ = ["table_slice"]


def table_slice(num_samples: int, num_replicas: int | None, rank: int | None, group: Any) -> tuple[int, int]:
    """``(world, rank)`` of a sharded score table, known when it is built (``shard_scores=True``).

    Example:
        >>> table_slice(10, 2, 1, None)
        (2, 1)
    """
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


def _check_positions(positions: Any, k: int, n: int) -> Tensor:
    """``positions``: one row of the batch per loss (checked on CPU; on a device at the gather)."""
    positions = check_index_tensor(positions, "positions")
    if positions.shape[0] != k:
        raise ValueError(
            f"loss has {k} entries but positions has {positions.shape[0]}: one position per loss"
        )
    if positions.device.type == "cpu" and k and not 0 <= int(positions.min()) <= int(positions.max()) < n:
        raise IndexError(f"positions must be rows of the batch, in [0, {n})")
    return positions


def _unscored(rows: Tensor, positions: Tensor | None, scored: int, n: int, spare: int) -> Tensor:
    """``rows`` with those past the first ``scored`` rows of the batch sent to the spare slot (padding)."""
    if scored >= n:
        return rows
    if positions is None:
        rows = rows.clone()
        rows[scored:] = spare
        return rows
    return torch.where(positions < scored, rows, spare)


def _dataset_length(dataset: Any) -> int:
    """The length of a map-style dataset, or a clear error."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            "dataset must be a map-style dataset with __len__ and __getitem__; InfoBatch prunes by "
            "index, so an IterableDataset cannot be wrapped"
        )
    try:
        n = len(dataset)
    except TypeError as e:
        raise TypeError("dataset must define __len__ (a map-style dataset)") from e
    if n < 1:
        raise ValueError("dataset is empty: InfoBatch needs at least one sample")
    return n


def _make_policy(policy: str | Policy, prune_ratio: float, num_epochs: int, delta: float) -> Policy:
    """The policy object for ``policy=``; a policy object must agree on ``num_epochs`` (one owner)."""
    kinds: dict[str, type[InfoBatchPolicy] | type[RandomPolicy]] = {
        "infobatch": InfoBatchPolicy,
        "random": RandomPolicy,
    }
    if isinstance(policy, str):
        if policy not in kinds:
            raise ValueError(f"policy must be one of {sorted(kinds)} or a Policy object, got {policy!r}")
        return kinds[policy](prune_ratio, num_epochs, delta)
    InfoBatchPolicy(prune_ratio, num_epochs, delta)  # validates the arguments all the same
    if not callable(policy):
        raise TypeError(
            f"policy must be 'infobatch', 'random' or a Policy object, got {type(policy).__name__}"
        )
    theirs = getattr(policy, "num_epochs", num_epochs)
    if theirs != num_epochs:
        raise ValueError(
            f"InfoBatch(num_epochs={num_epochs}) but the policy has num_epochs={theirs}: the policy would "
            "anneal at another epoch than the one progress counts to; build both with the same num_epochs"
        )
    return policy


def _on(idx: Tensor, like: Tensor) -> Tensor:
    """``idx`` on ``like``'s device (asynchronously)."""
    return idx if idx.device == like.device else idx.to(like.device, non_blocking=True)
