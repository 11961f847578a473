"""Which process this is: host-side reads of an initialised ``torch.distributed`` process group.

No collective, no device: every function reads what the process group already knows (the
default one, or the ``group`` given). Without a process group the rank is 0 and the world 1,
so the same code runs in one process and under torchrun. Frameworks build objects before they
initialise the group, so callers read these when they need them, not at construction.

Example:
    >>> initialized(), process_rank(), world_size(), is_distributed()
    (False, 0, 1, False)
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["initialized", "is_distributed", "process_rank", "same_group", "world_and_rank", "world_size"]


def initialized() -> bool:
    """Whether a ``torch.distributed`` process group is initialised in this process."""
    return dist.is_available() and dist.is_initialized()


def process_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the world) if a process group is initialised, else 0."""
    return int(dist.get_rank(group)) if initialized() else 0


def world_size(group: Any = None) -> int:
    """The number of processes in ``group`` (default: the world); 1 without a process group."""
    return int(dist.get_world_size(group)) if initialized() else 1


def is_distributed(group: Any = None) -> bool:
    """Whether ``group`` (default: the world) is an initialised group of more than one process."""
    return initialized() and dist.get_world_size(group) > 1


def same_group(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` name the same process group (``None``: the default one)."""
    if a is b:
        return True
    world = dist.group.WORLD if initialized() else None
    return (world if a is None else a) is (world if b is None else b)


def world_and_rank(num_replicas: int | None, rank: int | None, group: Any = None) -> tuple[int, int]:
    """``(world, rank)``: the given values, else ``group``'s (host-side reads), the rank checked.

    Example:
        >>> world_and_rank(None, None), world_and_rank(4, 3)
        ((1, 0), (4, 3))
    """
    world = world_size(group) if num_replicas is None else num_replicas
    rank = process_rank(group) if rank is None else rank
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, num_replicas={world}), got {rank!r}")
    return world, rank
