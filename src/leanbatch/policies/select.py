"""Exact global top-k over the slices: the fixed-budget policies' "keep the k best" on any split.

A sample's *key* is one int64 that orders it: its rank value in the high 32 bits (a float32
score mapped to an order-preserving int32, or a keyed uniform int32), and ``2**32 - 1 - index``
in the low 32 bits, so keys are distinct and ties go to the lower index, deterministically
(indices must be below ``2**32``). :func:`kth_largest` finds the ``k``-th largest key over every
rank by radix selection: four rounds of a 65,536-bin histogram, each summed over the ranks with
one collective; the first round reads every local key, later ones only the keys still tied.

Example:
    >>> import torch
    >>> from leanbatch.policies.parts import Slice
    >>> keys = score_keys(torch.tensor([0.5, 2.0, 2.0, -1.0]), Slice(4))
    >>> top_mask(keys, 2, Slice(4)).tolist()     # 2.0 twice: both; a tie with 0.5 would go to index 0
    [False, True, True, False]
"""

from __future__ import annotations

import torch
from torch import Tensor

from leanbatch.policies.keyed import keyed_values
from leanbatch.policies.parts import Slice

__all__ = ["kth_largest", "score_keys", "top_mask", "uniform_keys"]

_LOW = (1 << 32) - 1
_BINS = 1 << 16


def _with_index(high: Tensor, sl: Slice) -> Tensor:
    """``(high << 32) + 2**32 - 1 - index`` for the local rows (``high``: int32 order values)."""
    if sl.num_samples > _LOW:
        raise ValueError(f"top-k by key needs fewer than 2**32 samples, got {sl.num_samples}")
    return (high.to(torch.int64) << 32).add_(_LOW).sub_(sl.indices())


def score_keys(scores: Tensor, sl: Slice) -> Tensor:
    """Keys ordering the local rows by score (higher first; NaN ranks as +inf), ties by index.

    Example:
        >>> import torch
        >>> k = score_keys(torch.tensor([1.0, float("nan"), -2.0]), Slice(3))
        >>> torch.argsort(k, descending=True).tolist()
        [1, 0, 2]
    """
    bits = torch.nan_to_num(scores.to(torch.float32), nan=float("inf")).view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # order-preserving float32 -> int32
    return _with_index(ordered, sl)


def uniform_keys(key: int, sl: Slice, tag: int = 0) -> Tensor:
    """Keys in a keyed uniform random order (ties, of probability 2**-32, by index)."""
    return _with_index(keyed_values(key, sl, tag), sl)


def kth_largest(keys: Tensor, k: int, sl: Slice, among: Tensor | None = None) -> int:
    """The ``k``-th largest of the keys of every rank (``among``: a bool mask of the keys that count).

    ``1 <= k <=`` the number of keys that count. Four collectives on several ranks.

    Example:
        >>> kth_largest(torch.tensor([5, -9, 7, 1]), 3, Slice(4))
        1
    """
    active = keys if among is None else keys[among]
    need, prefix = k, 0
    for shift in (48, 32, 16, 0):
        digit = (active >> shift) & 0xFFFF if shift < 48 else (active >> 48) + 32768
        hist = torch.bincount(digit, minlength=_BINS)
        if not sl.whole:
            hist = sl.comm.sum(hist)
        above = torch.flip(torch.cumsum(torch.flip(hist, (0,)), 0), (0,))  # keys with digit >= b
        b = int(torch.nonzero(above >= need).max())  # the largest digit with enough keys at or above it
        need -= int(above[b]) - int(hist[b])
        prefix += (b - 32768 if shift == 48 else b) << shift  # the top digit is signed
        active = active[digit == b]
    return prefix


def top_mask(keys: Tensor, k: int, sl: Slice, among: Tensor | None = None) -> Tensor:
    """Bool mask of the local keys among the ``k`` largest of every rank (``among``: those that count)."""
    if k <= 0:
        return torch.zeros(keys.shape, dtype=torch.bool)
    mask = keys >= kth_largest(keys, k, sl, among)
    return mask if among is None else mask & among
