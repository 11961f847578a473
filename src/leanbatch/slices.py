"""Slices of the index space and the collectives that combine them (sharded scores and plans).

With ``shard_scores=True`` and ``W`` ranks, rank ``r`` owns the dataset indices ``i`` with
``i % W == r`` (strided: balanced, and class-mixed for a dataset sorted by class). Its local
row ``j`` is the global index ``r + j * W``; it holds ``ceil((N - r) / W)`` rows. A
:class:`Slice` says which rows a rank holds and how its global statistics are combined: a
:class:`Comm` whose ``sum``/``max``/``gather`` are ``all_reduce``/``all_gather`` over the
data-parallel group (:class:`DistComm`), nothing in one process (:data:`LOCAL`), or a
single-process simulation of several ranks (:mod:`leanbatch.bench.micro`). Every policy plans
through a slice; the unsharded plan is the plan of the one slice holding everything.

Example:
    >>> s = Slice(num_samples=10, world=3, rank=1)
    >>> s.size, s.indices().tolist(), s.local_rows(torch.tensor([4, 7])).tolist()
    (3, [1, 4, 7], [1, 2])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from leanbatch.checks import check_int

__all__ = ["Comm", "DistComm", "LOCAL", "LocalComm", "Slice", "slice_size"]


class Comm(Protocol):
    """The collectives a sharded plan needs; each call is made by every rank, in the same order.

    Example:
        >>> comm: Comm = LOCAL   # one process; DistComm(group) over torch.distributed
        >>> comm.max(torch.tensor([4])).tolist()
        [4]
    """

    def sum(self, t: Tensor) -> Tensor:
        """Element-wise sum over the ranks (``all_reduce`` SUM)."""
        ...

    def max(self, t: Tensor) -> Tensor:
        """Element-wise maximum over the ranks (``all_reduce`` MAX)."""
        ...

    def gather(self, t: Tensor) -> Tensor:
        """Every rank's ``t`` (same shape everywhere), stacked in rank order: shape ``(W, *t.shape)``."""
        ...


class LocalComm:
    """One process holding everything: every collective returns its input.

    Example:
        >>> LOCAL.gather(torch.tensor([3])).tolist()
        [[3]]
    """

    def sum(self, t: Tensor) -> Tensor:
        """``t``."""
        return t

    def max(self, t: Tensor) -> Tensor:
        """``t``."""
        return t

    def gather(self, t: Tensor) -> Tensor:
        """``t[None]``."""
        return t.unsqueeze(0)


LOCAL = LocalComm()


class DistComm:
    """``torch.distributed`` collectives over ``group``, on its communication device (CUDA for NCCL).

    Results come back on the CPU (planning runs on the host).

    Example:
        >>> DistComm().sum(torch.tensor([2])).tolist()   # no process group: one rank
        [2]
    """

    def __init__(self, group: Any = None):
        self.group = group

    def _reduce(self, t: Tensor, op: Any) -> Tensor:
        from leanbatch.rng import comm_device, is_distributed

        if not is_distributed(self.group):
            return t
        import torch.distributed as dist

        buf = t.to(comm_device(self.group)).contiguous().clone()
        dist.all_reduce(buf, op=op, group=self.group)
        return buf.cpu()

    def sum(self, t: Tensor) -> Tensor:
        """``all_reduce`` SUM."""
        import torch.distributed as dist

        return self._reduce(t, dist.ReduceOp.SUM)

    def max(self, t: Tensor) -> Tensor:
        """``all_reduce`` MAX."""
        import torch.distributed as dist

        return self._reduce(t, dist.ReduceOp.MAX)

    def gather(self, t: Tensor) -> Tensor:
        """``all_gather``, stacked in rank order."""
        from leanbatch.rng import all_gather_rows

        return all_gather_rows(t.reshape(1, -1), self.group).cpu().reshape(-1, *t.shape)


def slice_size(num_samples: int, world: int, rank: int) -> int:
    """Rows rank ``rank`` of ``world`` holds: ``ceil((num_samples - rank) / world)``.

    Example:
        >>> [slice_size(10, 4, r) for r in range(4)]
        [3, 3, 2, 2]
    """
    return max(0, (num_samples - rank + world - 1) // world)


@dataclass(frozen=True)
class Slice:
    """The rows ``rank, rank + world, ...`` of ``num_samples``, and the collectives over the ranks.

    Args:
        num_samples: the dataset size ``N`` (global).
        world, rank: the data-parallel world and this rank (``1, 0``: everything, unsharded).
        comm: the collectives (default :data:`LOCAL`, which needs ``world == 1`` or a simulation).

    Example:
        >>> Slice(5).size, Slice(5).whole
        (5, True)
    """

    num_samples: int
    world: int = 1
    rank: int = 0
    comm: Comm = field(default=LOCAL, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_int(self.num_samples, "num_samples", 1)
        check_int(self.world, "world", 1)
        check_int(self.rank, "rank", 0, self.world - 1)

    @property
    def size(self) -> int:
        """Rows this rank holds."""
        return slice_size(self.num_samples, self.world, self.rank)

    @property
    def whole(self) -> bool:
        """Whether this slice holds every row (one rank)."""
        return self.world == 1

    def indices(self, start: int = 0, stop: int | None = None, dtype: torch.dtype = torch.int64) -> Tensor:
        """Global indices of local rows ``start .. stop - 1`` (default: all).

        Example:
            >>> Slice(10, 3, 2).indices(1).tolist()
            [5, 8]
        """
        stop = self.size if stop is None else min(stop, self.size)
        return torch.arange(start, max(start, stop), dtype=dtype).mul_(self.world).add_(self.rank)

    def local_rows(self, indices: Tensor) -> Tensor:
        """Local rows of global ``indices`` this rank owns (``i // world``; ownership not checked)."""
        return indices if self.world == 1 else torch.div(indices, self.world, rounding_mode="floor")

    def owns(self, indices: Tensor) -> Tensor:
        """Bool mask: which of ``indices`` this rank owns (in range and ``i % world == rank``).

        Example:
            >>> Slice(10, 2, 1).owns(torch.tensor([1, 2, 9, 10])).tolist()
            [True, False, True, False]
        """
        inside = (indices >= 0) & (indices < self.num_samples)
        return inside if self.world == 1 else inside & (indices % self.world == self.rank)

    def rows_in(self, start: int, stop: int) -> tuple[int, int]:
        """Local rows whose global indices lie in ``[start, stop)``: ``(first, end)``.

        Example:
            >>> Slice(20, 4, 1).rows_in(4, 12)   # global 5 and 9
            (1, 3)
        """
        first = max(0, -(-(start - self.rank) // self.world))
        end = max(first, -(-(stop - self.rank) // self.world))
        return min(first, self.size), min(end, self.size)
