"""Private random generators for selection: seeded, per device, per rank, never the global RNG.

Sampling happens on the device of the losses, so each device gets its own
``torch.Generator``. Calls without an explicit generator draw from these
module-level generators, so a run is reproducible and the user's
``torch.manual_seed`` stream is untouched.

In a distributed run every rank holds a different batch but, with a shared
seed, the same generator stream would keep the same loss-rank *positions* on
every rank at every step. So a generator is seeded from ``(seed, rank)`` through
:func:`leanbatch.permutation.mix_seed`, with the rank read from an initialised
``torch.distributed`` default process group when the generator is first used,
not when the seed is set: frameworks such as Lightning build their objects
before they initialise the process group. Without a process group the rank is 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from leanbatch.permutation import mix_seed
from leanbatch.selection._checks import check_int

__all__ = [
    "DEFAULT_SEED",
    "default_generator",
    "process_rank",
    "rank_seed",
    "resolve_generator",
    "seed_selection",
]

DEFAULT_SEED = 1910_00762  # the paper's arXiv id: unlikely to collide with a user's data seed
_GENERATORS: dict[torch.device, torch.Generator] = {}
_SEEDED_FOR: dict[torch.device, int] = {}  # device -> the rank its generator was seeded for
_seed = DEFAULT_SEED
_rank: int | None = None  # seed_selection(rank=): overrides the process group's rank


def process_rank() -> int:
    """This process's rank in the initialised default process group, else 0.

    Reads host-side state only (no collective, no device access).

    Example:
        >>> process_rank()  # no process group here
        0
    """
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def rank_seed(seed: int, rank: int, *more: int) -> int:
    """The seed of ``rank``'s generator: ``mix_seed(seed, rank, *more)`` (a stable splitmix64 hash).

    Example:
        >>> rank_seed(7, 0) != rank_seed(7, 1), rank_seed(7, 1) == rank_seed(7, 1)
        (True, True)
    """
    return mix_seed(seed, rank, *more)


def canonical_device(device: torch.device | str) -> torch.device:
    """``cuda`` -> ``cuda:<current index>``, so one device has one generator."""
    dev = torch.device(device)
    if dev.type != "cpu" and dev.index is None:
        backend = getattr(torch, dev.type, None)
        current = getattr(backend, "current_device", None)
        if callable(current):
            dev = torch.device(dev.type, int(current()))
    return dev


def default_generator(device: torch.device | str) -> torch.Generator:
    """The module's private generator for ``device`` on this rank (created and seeded on first use).

    Seeded with ``rank_seed(seed, rank)``. The rank is checked on every call (a
    host-side read), so a generator first used before the process group was
    initialised is reseeded for its rank once the group exists.

    Example:
        >>> g = default_generator("cpu")
        >>> g is default_generator("cpu"), g.device.type
        (True, 'cpu')
    """
    dev = canonical_device(device)
    rank = process_rank() if _rank is None else _rank
    gen = _GENERATORS.get(dev)
    if gen is None:
        gen = _GENERATORS[dev] = torch.Generator(device=dev)
    if _SEEDED_FOR.get(dev) != rank:
        gen.manual_seed(rank_seed(_seed, rank))
        _SEEDED_FOR[dev] = rank
    return gen


def seed_selection(seed: int, *, rank: int | None = None) -> None:
    """Reseed the private generators used when no ``generator=`` is passed (all devices).

    Args:
        seed: the run's seed; rank ``r`` draws from ``rank_seed(seed, r)``.
        rank: use this rank instead of the process group's (e.g. the
            data-parallel rank when tensor-parallel ranks share a batch and must
            select the same rows); ``None`` reads it from ``torch.distributed``.

    Example:
        >>> import torch
        >>> seed_selection(7); a = torch.rand(2, generator=default_generator("cpu"))
        >>> seed_selection(7); b = torch.rand(2, generator=default_generator("cpu"))
        >>> seed_selection(7, rank=1); c = torch.rand(2, generator=default_generator("cpu"))
        >>> bool((a == b).all()), bool((a == c).all())
        (True, False)
        >>> seed_selection(7)  # back to the process group's rank
    """
    global _seed, _rank
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    _seed, _rank = seed, None if rank is None else check_int(rank, "rank", 0)
    _SEEDED_FOR.clear()  # every generator is reseeded, in place, on its next use


def resolve_generator(generator: Any, device: torch.device) -> torch.Generator:
    """Return ``generator`` (checked to live on ``device``) or the private default for ``device``."""
    if generator is None:
        return default_generator(device)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    gdev, ddev = canonical_device(generator.device), canonical_device(device)
    if gdev != ddev:
        raise ValueError(
            f"generator is on {gdev} but the losses are on {ddev}: sampling runs where the losses are, "
            f"so pass torch.Generator(device='{ddev}')"
        )
    return generator
