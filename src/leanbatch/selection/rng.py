"""Private random generators for selection: seeded, per device, never the global RNG.

Sampling happens on the device of the losses, so each device gets its own
``torch.Generator``. Calls without an explicit generator draw from these
module-level generators, seeded with :data:`DEFAULT_SEED` when first used, so a
run is reproducible and the user's ``torch.manual_seed`` stream is untouched.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DEFAULT_SEED", "default_generator", "resolve_generator", "seed_selection"]

DEFAULT_SEED = 1910_00762  # the paper's arXiv id: unlikely to collide with a user's data seed
_GENERATORS: dict[torch.device, torch.Generator] = {}
_seed = DEFAULT_SEED


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
    """The module's private generator for ``device`` (created and seeded on first use).

    Example:
        >>> g = default_generator("cpu")
        >>> g is default_generator("cpu"), g.device.type
        (True, 'cpu')
    """
    dev = canonical_device(device)
    gen = _GENERATORS.get(dev)
    if gen is None:
        gen = torch.Generator(device=dev)
        gen.manual_seed(_seed)
        _GENERATORS[dev] = gen
    return gen


def seed_selection(seed: int) -> None:
    """Reseed the private generators used when no ``generator=`` is passed (all devices).

    Example:
        >>> import torch
        >>> seed_selection(7); a = torch.rand(2, generator=default_generator("cpu"))
        >>> seed_selection(7); b = torch.rand(2, generator=default_generator("cpu"))
        >>> bool((a == b).all())
        True
    """
    global _seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    _seed = seed
    for gen in _GENERATORS.values():
        gen.manual_seed(seed)


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
