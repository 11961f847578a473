"""Keyed pseudo-random permutations and seed hashing, independent of any global RNG.

The sampler serves each epoch in the order of a keyed bijection evaluated lazily on the
positions it needs, so no O(N log N) shuffle and no permutation array are ever made.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import torch
from torch import Tensor

__all__ = ["KeyedPermutation", "mix_keys", "mix_seed"]

_M64 = (1 << 64) - 1
_GOLDEN, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _absorb(x: int, p: int) -> int:
    """One splitmix64 step of the chain: the state ``x`` after taking in ``p``."""
    x = (x ^ (int(p) & _M64)) & _M64
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * _MUL1) & _M64
    x = ((x ^ (x >> 27)) * _MUL2) & _M64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """Hash integers into one 63-bit seed (splitmix64 chain), independent of Python's hash.

    Example:
        >>> mix_seed(0, 1) == mix_seed(0, 1) != mix_seed(1, 0)
        True
    """
    return reduce(_absorb, parts, _GOLDEN) >> 1


def _signed(x: int) -> int:
    """The int64 with the bits of the unsigned 64-bit ``x``."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` keeps the sign)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix_keys(keys: Tensor, *parts: int) -> Tensor:
    """``mix_seed(*parts, key)`` for every key of an integer tensor, vectorised (int64, in ``[0, 2**63)``).

    The chain's state after ``parts`` is computed once; each key is then one splitmix64 step in
    int64 arithmetic (two's-complement wrap-around, logical shifts), bit for bit the scalar's.

    Example:
        >>> import torch
        >>> mix_keys(torch.tensor([0, 7, -3]), 5, 1).tolist() == [mix_seed(5, 1, k) for k in (0, 7, -3)]
        True
    """
    x = keys.to(torch.int64) ^ _signed(reduce(_absorb, parts, _GOLDEN))
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_MUL1)
    x = (x ^ _shr(x, 27)) * _signed(_MUL2)
    return _shr(x ^ _shr(x, 31), 1)


class KeyedPermutation:
    """A keyed pseudo-random bijection of ``range(n)``, evaluated on any positions.

    A six-round Feistel network on the smallest even-bit domain holding ``n``,
    with cycle walking back into ``range(n)``. Vectorised; costs O(len(positions)).

    Example:
        >>> import torch
        >>> p = KeyedPermutation(10, key=7)
        >>> sorted(p(torch.arange(10)).tolist()) == list(range(10))
        True
    """

    _C1 = 0x2545F491
    _C2 = 0x5851F42D

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._mask = (1 << self._half) - 1
        self._keys = [mix_seed(key, r) & 0xFFFFFFFF for r in range(6)]

    def _round(self, r: Tensor, k: int) -> Tensor:
        h = (r ^ k) * self._C1
        h ^= h >> 29
        h = (h & 0xFFFFFFFF) * self._C2
        h ^= h >> 32
        return h & self._mask

    def _encrypt(self, x: Tensor) -> Tensor:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ self._round(right, k)
        return (left << self._half) | right

    def _decrypt(self, x: Tensor) -> Tensor:
        left, right = x >> self._half, x & self._mask
        for k in reversed(self._keys):
            left, right = right ^ self._round(left, k), left
        return (left << self._half) | right

    def __call__(self, positions: Tensor) -> Tensor:
        return self._walk(positions, self._encrypt)

    def inverse(self, values: Tensor) -> Tensor:
        """The positions that map to ``values``: ``p(p.inverse(v)) == v``.

        Example:
            >>> import torch
            >>> p = KeyedPermutation(10, key=7)
            >>> torch.equal(p(p.inverse(torch.arange(10))), torch.arange(10))
            True
        """
        return self._walk(values, self._decrypt)

    def _walk(self, x: Tensor, step: Callable[[Tensor], Tensor]) -> Tensor:
        """Cycle walking: apply ``step`` until every value is back in ``range(n)``."""
        x = step(x.to(torch.int64))
        out = x >= self.n
        while bool(out.any()):  # CPU only: the sampler runs on the host
            x[out] = step(x[out])
            out = x >= self.n
        return x
