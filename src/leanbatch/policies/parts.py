"""Parts of the index space, and exact statistics over them: what a policy plans one part with.

A policy plans the scores of one :class:`Slice` of the dataset's indices: in one process the
slice holding everything (``Slice(num_samples)``); with sharded scores (``shard_scores=True``,
``W`` ranks) rank ``r`` holds the indices ``i`` with ``i % W == r`` (strided: balanced, and
class-mixed for a dataset sorted by class), its local row ``j`` being the global index
``r + j * W``. Global statistics combine the parts through the slice's :class:`Comm`: nothing in
one process (:data:`LOCAL`), ``torch.distributed`` collectives
(:class:`~leanbatch.distributed.collectives.DistComm`), or ranks simulated in one process
(:class:`~leanbatch.distributed.simulate.SimulatedWorld`). The statistics are exact integer
arithmetic, so their result does not depend on how the rows are split: :func:`global_mean` sums
fixed-point integers (43 bits below the largest magnitude) and divides exactly; counts are int64
sums.

Example:
    >>> s = Slice(num_samples=10, world=3, rank=1)
    >>> s.size, s.indices().tolist(), s.local_rows(torch.tensor([4, 7])).tolist()
    (3, [1, 4, 7], [1, 2])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import Tensor

from leanbatch.checks import check_int

__all__ = [
    "LOCAL",
    "Comm",
    "Part",
    "Slice",
    "global_count",
    "global_mean",
    "split_part",
]

_ROWS = 1 << 18  # local rows per step of the statistics (cache-sized)
_FIXED = 62 - 18 - 1  # fixed-point bits below the largest magnitude: a step's sum fits int64
_LIMB = 1 << 32


class Comm:
    """The collectives a sharded plan needs; each call is made by every rank, in the same order.

    This base is one process holding everything (:data:`LOCAL`): every collective returns its
    input. :class:`~leanbatch.distributed.collectives.DistComm` runs them over ``torch.distributed``.
    """

    def sum(self, t: Tensor) -> Tensor:
        """Element-wise sum over the ranks (``all_reduce`` SUM)."""
        return t

    def gather(self, t: Tensor) -> Tensor:
        """Every rank's ``t`` (same shape everywhere), stacked in rank order: shape ``(W, *t.shape)``."""
        return t.unsqueeze(0)


LOCAL = Comm()


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
        """Rows this rank holds: ``ceil((num_samples - rank) / world)``."""
        return max(0, (self.num_samples - self.rank + self.world - 1) // self.world)

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


class Part(NamedTuple):
    """One rank's part of the scores, as a sharded table hands it to a shardable policy: the rows'
    scores and their :class:`Slice` (with the collectives the policy's global statistics use).

    Example:
        >>> Part(torch.zeros(2), Slice(4, 2, 1)).slice.indices().tolist()
        [1, 3]
    """

    values: Tensor
    slice: Slice


def split_part(scores: Tensor | Part) -> tuple[Tensor, Slice]:
    """``(scores, slice)``: a :class:`Part`'s own, or every row's (one process) for a tensor."""
    if isinstance(scores, Part):
        return scores.values, scores.slice
    return scores, Slice(scores.numel())


def global_count(local: int | Tensor, sl: Slice) -> int:
    """The sum over the ranks of an integer count (one collective unless the slice is whole)."""
    if sl.whole:
        return int(local)
    return int(sl.comm.sum(torch.tensor([int(local)], dtype=torch.int64))[0])


def global_mean(scores: Tensor, sl: Slice) -> tuple[float | None, int]:
    """Mean of the scored (non-NaN) entries over every rank's slice, and their count; exact order-free.

    Each finite score ``x`` counts as ``floor(x * 2**(43 - e))`` (an integer; ``2**e`` bounds every
    magnitude), summed in integers and divided exactly, so the result is the same however the
    rows are split between ranks: the error is below ``2**(e - 43)`` per score. Two collectives
    on several ranks (the count and the largest magnitude; the sum).

    Example:
        >>> import torch
        >>> global_mean(torch.tensor([1.0, float("nan"), 3.0]), Slice(3))
        (2.0, 2)
    """
    scores = scores.detach().reshape(-1)
    buf = torch.empty(min(_ROWS, max(1, scores.numel())), dtype=torch.float32)
    nan, top, negative = _extent(scores, buf)
    count = scores.numel() - nan
    if not sl.whole:  # counts, the largest magnitude as its float32 bits (order-preserving), a sign
        bits = torch.tensor([top], dtype=torch.float32).view(torch.int32).long()
        both = sl.comm.gather(torch.cat([torch.tensor([count]), bits, torch.tensor([int(negative)])]))
        count = int(both[:, 0].sum())
        top = float(both[:, 1].max().to(torch.int32).view(torch.float32))
        negative = bool(both[:, 2].max())
    if count == 0:
        return None, 0
    if top == 0.0:
        return 0.0, count
    shift = _FIXED - int(torch.frexp(torch.tensor(top, dtype=torch.float32)).exponent)  # |x| < 2**exp
    total = _fixed_sum(scores, buf, shift, negative)
    if not sl.whole:  # in 32-bit limbs, so the sum over the ranks cannot overflow int64
        high, low = divmod(total, _LIMB)
        limbs = sl.comm.sum(torch.tensor([high, low], dtype=torch.int64))
        total = int(limbs[0]) * _LIMB + int(limbs[1])
    q = Fraction(total, count << shift) if shift >= 0 else Fraction(total << -shift, count)
    return float(q), count


def _extent(scores: Tensor, buf: Tensor) -> tuple[int, float, bool]:
    """``(NaN count, largest magnitude, any negative)``: one read of the scores."""
    nan, top, negative = 0, 0.0, False
    for start in range(0, scores.numel(), _ROWS):
        part = scores[start : start + _ROWS]
        lo, hi = (float(v) for v in torch.aminmax(part))
        if math.isnan(lo) or math.isnan(hi):  # NaN (never scored) in this step: count, then skip them
            nan += int(torch.count_nonzero(torch.isnan(part)))
            lo, hi = (
                float(v) for v in torch.aminmax(torch.nan_to_num(part, nan=0.0, out=buf[: part.numel()]))
            )
        top, negative = max(top, -lo, hi), negative or lo < 0.0
    return nan, top, negative


def _fixed_sum(scores: Tensor, buf: Tensor, shift: int, floor: bool) -> int:
    """``sum(floor(x * 2**shift))`` over the finite scores, exact (Python integer).

    Truncation is the floor when no score (of any rank) is negative, and it costs less.
    """
    ints = torch.empty(buf.numel(), dtype=torch.int64)
    steps = []
    left = shift
    while left:  # powers of two within float32's range; each product is exact
        step = max(-100, min(100, left))
        steps.append(2.0**step)
        left -= step
    total = 0
    for start in range(0, scores.numel(), _ROWS):
        part = scores[start : start + _ROWS]
        b = torch.nan_to_num(part, nan=0.0, out=buf[: part.numel()])  # NaN (never scored) counts 0
        for f in steps:
            b.mul_(f)
        if floor:
            b.floor_()
        i = ints[: part.numel()]
        i.copy_(b)
        total += int(i.sum())
    return total
