"""Keyed draws and exact global statistics: what makes a sharded plan equal to the unsharded one.

- Every random decision about a sample is keyed by ``(key, index)``, the key drawn once from the
  epoch's generator (:func:`draw_key`): the uniform 32-bit value of index ``i`` is element
  ``i mod 2**20`` of a stream seeded with ``mix_seed(key, i // 2**20)`` (:func:`keyed_below`),
  so any rank computes the fate of any index, and the plan does not depend on who computes it.
  A rank that owns every ``W``-th index draws every chunk and keeps its rows: O(N) time (the
  streams are cheap), O(chunk) memory.
- Global statistics are combined by collectives over the slices (:class:`~leanbatch.slices.Slice`)
  in exact integer arithmetic, so their result does not depend on how the rows are split:
  :func:`global_mean` sums fixed-point integers (43 bits below the largest magnitude) and
  divides exactly; counts are int64 sums.

Example:
    >>> import torch
    >>> from leanbatch.slices import Slice
    >>> mask = torch.empty(6, dtype=torch.bool)
    >>> keyed_below(7, Slice(12, 2, 1), 0, mask)   # cut 0: each value below it with probability 1/2
    >>> whole = torch.empty(12, dtype=torch.bool); keyed_below(7, Slice(12), 0, whole)
    >>> torch.equal(mask, whole[1::2])
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import torch
from torch import Tensor

from leanbatch.permutation import mix_seed
from leanbatch.slices import Slice

__all__ = [
    "KEY_CHUNK",
    "draw_key",
    "global_count",
    "global_mean",
    "keyed_below",
    "keyed_uniform",
    "keyed_values",
]

KEY_CHUNK = 1 << 20  # global indices per keyed stream
_ROWS = 1 << 18  # local rows per step of the statistics (cache-sized)
_FIXED = 62 - 18 - 1  # fixed-point bits below the largest magnitude: a step's sum fits int64
_LIMB = 1 << 32


def draw_key(generator: torch.Generator) -> int:
    """The epoch's key: one 63-bit integer drawn from ``generator``.

    Example:
        >>> import torch
        >>> draw_key(torch.Generator().manual_seed(0)) == draw_key(torch.Generator().manual_seed(0))
        True
    """
    return int(torch.empty((), dtype=torch.int64).random_(0, None, generator=generator))


def _chunks(key: int, sl: Slice, tag: int) -> Iterator[tuple[int, int, Tensor]]:
    """``(first, end, values)``: the keyed int32 values of local rows ``first .. end - 1``, chunk by chunk.

    One stream per chunk of ``KEY_CHUNK`` global indices, seeded with ``mix_seed(key, tag, chunk)``,
    drawn into one reused buffer (a fresh array per chunk would cost a page fault per 4 KiB).
    """
    draws = torch.empty(KEY_CHUNK // 2, dtype=torch.int64)
    values = draws.view(torch.int32)
    w = sl.world
    for c in range(-(-sl.num_samples // KEY_CHUNK)):
        first, end = sl.rows_in(c * KEY_CHUNK, (c + 1) * KEY_CHUNK)
        if end <= first:
            continue
        draws.random_(-(1 << 63), None, generator=torch.Generator().manual_seed(mix_seed(key, tag, c)))
        offset = first * w + sl.rank - c * KEY_CHUNK
        yield first, end, values[offset : offset + (end - first - 1) * w + 1 : w]


def keyed_below(key: int, sl: Slice, cut: int, out: Tensor, tag: int = 0) -> None:
    """``out[j] = v(i) < cut`` for the local rows ``j`` of ``sl`` (global index ``i``).

    ``v(i)`` is a uniform int32 keyed by ``(key, tag, i)``: ``P(v < cut) = (cut + 2**31) / 2**32``.

    Example:
        >>> from leanbatch.slices import Slice
        >>> out = torch.empty(4, dtype=torch.bool)
        >>> keyed_below(1, Slice(4), -(1 << 31), out); out.tolist()   # cut at the minimum: never below
        [False, False, False, False]
    """
    for first, end, values in _chunks(key, sl, tag):
        torch.lt(values, cut, out=out[first:end])


def keyed_values(key: int, sl: Slice, tag: int = 0) -> Tensor:
    """The uniform int32 ``v(i)`` keyed by ``(key, tag, i)`` of every local row (see :func:`keyed_below`).

    Example:
        >>> from leanbatch.slices import Slice
        >>> torch.equal(keyed_values(5, Slice(9, 3, 2)), keyed_values(5, Slice(9))[2::3])
        True
    """
    out = torch.empty(sl.size, dtype=torch.int32)
    for first, end, values in _chunks(key, sl, tag):
        out[first:end] = values
    return out


def keyed_uniform(key: int, *tags: int) -> float:
    """One float64 in [0, 1) keyed by ``(key, *tags)``, the same on every rank.

    Example:
        >>> 0.0 <= keyed_uniform(3, 1) < 1.0
        True
    """
    g = torch.Generator().manual_seed(mix_seed(key, *tags))
    return float(torch.rand((), dtype=torch.float64, generator=g))


def global_count(local: int | Tensor, sl: Slice) -> int:
    """The sum over the ranks of an integer count (one collective unless the slice is whole).

    Example:
        >>> global_count(3, Slice(5))
        3
    """
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
    nan, top, negative, nan_steps = _extent(scores, buf)
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
    total = _fixed_sum(scores, buf, shift, negative, nan_steps)
    if not sl.whole:  # in 32-bit limbs, so the sum over the ranks cannot overflow int64
        high, low = divmod(total, _LIMB)
        limbs = sl.comm.sum(torch.tensor([high, low], dtype=torch.int64))
        total = int(limbs[0]) * _LIMB + int(limbs[1])
    q = Fraction(total, count << shift) if shift >= 0 else Fraction(total << -shift, count)
    return float(q), count


def _extent(scores: Tensor, buf: Tensor) -> tuple[int, float, bool, set[int]]:
    """``(NaN count, largest magnitude, any negative, the steps holding a NaN)``: one read of the scores."""
    nan, top, negative, nan_steps = 0, 0.0, False, set()
    for start in range(0, scores.numel(), _ROWS):
        part = scores[start : start + _ROWS]
        lo, hi = (float(v) for v in torch.aminmax(part))
        if math.isnan(lo) or math.isnan(hi):  # NaN (never scored) in this step: count, then skip them
            nan_steps.add(start)
            nan += int(torch.count_nonzero(torch.isnan(part)))
            lo, hi = (
                float(v) for v in torch.aminmax(torch.nan_to_num(part, nan=0.0, out=buf[: part.numel()]))
            )
        top, negative = max(top, -lo, hi), negative or lo < 0.0
    return nan, top, negative, nan_steps


def _fixed_sum(scores: Tensor, buf: Tensor, shift: int, floor: bool, nan_steps: set[int]) -> int:
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
        b = buf[: part.numel()]
        first = 0
        if start in nan_steps:
            torch.nan_to_num(part, nan=0.0, out=b)
        elif steps:  # the first product reads the scores: one pass
            torch.mul(part, steps[0], out=b)
            first = 1
        else:
            b.copy_(part)
        for f in steps[first:]:
            b.mul_(f)
        if floor:
            b.floor_()
        i = ints[: part.numel()]
        i.copy_(b)
        total += int(i.sum())
    return total
