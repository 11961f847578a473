"""Private random generators: what every part of leanbatch that draws owns.

- :class:`Generators` is what an object that draws owns: one private ``torch.Generator`` per
  device, reseeded for every draw from ``mix_seed(seed, rank, *keys)``, so draws are
  reproducible, independent across ranks, resumable from a counter, and never touch the global
  torch, numpy or Python random state. The rank is read from the process group at the first
  draw, not at construction: frameworks build objects before they initialise the group.
  :meth:`Generators.shared` is the draw every rank makes alike (global selection): keyed by
  ``mix_seed(seed, SHARED, *keys)``, :data:`SHARED` in the rank's place.

Example:
    >>> import torch
    >>> g = Generators(seed=7)
    >>> a = torch.rand(2, generator=g.get("cpu", 0))
    >>> b = torch.rand(2, generator=g.get("cpu", 0))
    >>> bool((a == b).all()), g.rank
    (True, 0)
"""

from __future__ import annotations

from typing import Any

import torch

from leanbatch.checks import check_int, check_seed
from leanbatch.permutation import mix_seed
from leanbatch.ranks import process_rank

__all__ = ["DEFAULT_SEED", "SHARED", "Generators", "canonical_device"]

DEFAULT_SEED = 1910_00762  # Selective Backprop's arXiv id: unlikely to collide with a user's data seed
SHARED = -1  # the key of draws every rank makes alike, in the rank's place: no rank is negative


def canonical_device(device: torch.device | str) -> torch.device:
    """``cuda`` -> ``cuda:<current index>``, so one device has one generator."""
    dev = torch.device(device)
    if dev.type != "cpu" and dev.index is None:
        backend = getattr(torch, dev.type, None)
        current = getattr(backend, "current_device", None)
        if callable(current):
            dev = torch.device(dev.type, int(current()))
    return dev


class Generators:
    """Private generators of one object: per device, reseeded from ``(seed, rank, *keys)`` per draw.

    Args:
        seed: the object's seed (default :data:`DEFAULT_SEED`).
        rank: the rank whose draws these are; ``None`` reads the rank of ``group`` at the first
            draw (0 without a process group). Pass the data-parallel rank when several
            processes share a batch and must draw alike (tensor or pipeline parallelism).
        group: the process group whose rank is read (default: the world).

    Example:
        >>> import torch
        >>> g0, g1 = Generators(seed=3, rank=0), Generators(seed=3, rank=1)
        >>> torch.equal(torch.rand(3, generator=g0.get("cpu", 5)), torch.rand(3, generator=g1.get("cpu", 5)))
        False
    """

    _rank: int | None

    def __init__(self, seed: int | None = None, rank: int | None = None, group: Any = None):
        self.group = group
        self._by_device: dict[torch.device, torch.Generator] = {}
        self._streams: dict[torch.device, tuple[int, torch.Generator]] = {}  # device -> (rank, generator)
        self.reset(seed, rank)

    @property
    def rank(self) -> int:
        """The rank the draws are keyed by (read from the process group once, at first use)."""
        if self._rank is None:
            self._rank = process_rank(self.group)
        return self._rank

    def reset(self, seed: int | None = None, rank: int | None = None) -> None:
        """Use ``seed`` (and ``rank``; ``None``: the process group's, read again) from now on."""
        self.seed = DEFAULT_SEED if seed is None else check_seed(seed)
        self._given_rank = None if rank is None else check_int(rank, "rank", 0)
        self._rank = self._given_rank
        self._streams.clear()

    def get(self, device: torch.device | str, *keys: int) -> torch.Generator:
        """The generator of ``device``, reseeded for ``keys`` (host work only: no device read)."""
        return self._seeded(device, mix_seed(self.seed, self.rank, *keys))

    def shared(self, device: torch.device | str, *keys: int) -> torch.Generator:
        """The generator of ``device``, reseeded for ``keys`` alike on every rank: ``mix_seed(seed,
        SHARED, *keys)`` (host work only). The same generator object as :meth:`get`'s.

        Example:
            >>> import torch
            >>> g0, g1 = Generators(seed=3, rank=0), Generators(seed=3, rank=1)
            >>> torch.equal(torch.rand(3, generator=g0.shared("cpu", 5)), torch.rand(3, generator=g1.shared("cpu", 5)))
            True
        """
        return self._seeded(device, mix_seed(self.seed, SHARED, *keys))

    def _seeded(self, device: torch.device | str, seed: int) -> torch.Generator:
        dev = canonical_device(device)
        gen = self._by_device.get(dev)
        if gen is None:
            gen = self._by_device[dev] = torch.Generator(device=dev)
        return gen.manual_seed(seed)

    def stream(self, device: torch.device | str) -> torch.Generator:
        """The device's continuing stream, seeded once from ``(seed, rank)`` (for callers without a counter).

        The rank is read again on every call (host-side), so a stream first used before the
        process group existed is reseeded for its rank once the group is there.

        Example:
            >>> import torch
            >>> g = Generators(seed=1)
            >>> a, b = torch.rand(1, generator=g.stream("cpu")), torch.rand(1, generator=g.stream("cpu"))
            >>> bool(a != b)
            True
        """
        dev = canonical_device(device)
        rank = process_rank(self.group) if self._given_rank is None else self._given_rank
        seeded = self._streams.get(dev)
        if seeded is None or seeded[0] != rank:
            gen = seeded[1] if seeded is not None else torch.Generator(device=dev)
            gen.manual_seed(mix_seed(self.seed, rank))
            self._streams[dev] = seeded = (rank, gen)
        return seeded[1]
