"""Keyed draws: what makes a plan the same whichever process computes which part of it.

Every random decision about a sample is keyed by ``(key, index)``, the key drawn once from the
epoch's generator (:func:`draw_key`): the uniform 32-bit value of index ``i`` is element
``i mod 2**20`` of a stream seeded with ``mix_seed(key, i // 2**20)`` (:func:`keyed_below`),
so any rank computes the fate of any index, and the plan does not depend on who computes it.
A rank that owns every ``W``-th index draws every chunk and keeps its rows: O(N) time (the
streams are cheap), O(chunk) memory (see :mod:`~leanbatch.policies.parts` for the parts).

Example:
    >>> import torch
    >>> from leanbatch.policies.parts import Slice
    >>> mask = torch.empty(6, dtype=torch.bool)
    >>> keyed_below(7, Slice(12, 2, 1), 0, mask)   # cut 0: each value below it with probability 1/2
    >>> whole = torch.empty(12, dtype=torch.bool); keyed_below(7, Slice(12), 0, whole)
    >>> torch.equal(mask, whole[1::2])
    True
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from leanbatch.permutation import mix_seed
from leanbatch.policies.parts import Slice

__all__ = ["KEY_CHUNK", "draw_key", "keyed_below", "keyed_values"]

KEY_CHUNK = 1 << 20  # global indices per keyed stream


def draw_key(generator: torch.Generator) -> int:
    """The epoch's key: one 63-bit integer drawn from ``generator``."""
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
        >>> from leanbatch.policies.parts import Slice
        >>> out = torch.empty(4, dtype=torch.bool)
        >>> keyed_below(1, Slice(4), -(1 << 31), out); out.tolist()   # cut at the minimum: never below
        [False, False, False, False]
    """
    for first, end, values in _chunks(key, sl, tag):
        torch.lt(values, cut, out=out[first:end])


def keyed_values(key: int, sl: Slice, tag: int = 0) -> Tensor:
    """The uniform int32 ``v(i)`` keyed by ``(key, tag, i)`` of every local row (see :func:`keyed_below`).

    Example:
        >>> from leanbatch.policies.parts import Slice
        >>> torch.equal(keyed_values(5, Slice(9, 3, 2)), keyed_values(5, Slice(9))[2::3])
        True
    """
    out = torch.empty(sl.size, dtype=torch.int32)
    for first, end, values in _chunks(key, sl, tag):
        out[first:end] = values
    return out
