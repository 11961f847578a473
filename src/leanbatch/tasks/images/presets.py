"""The image task's presets: what ``--quick`` and ``--preset cifar10`` fill in (explicit options win).

- ``quick`` (also ``--quick``): the README's main command, a first look in about 2.2 minutes
  on 2 idle CPU cores (measured 132 s): 4,000 train / 1,000 test bundled MNIST digits, 8 epochs, seeds 0, 1, 2, every
  default method, the baseline at step budgets 0.5, 0.7, 0.85 and 1 and at batch budgets 0.5 and 0.7.
- ``cifar10``: the CIFAR-10 comparison on a folder you give with ``--data`` (an ImageFolder with
  ``train/`` and ``test/``, or the python batches): the small CNN (16/32/64 channels), 15 epochs,
  seeds 0, 1, 2, random crop + flip, the same methods and budgets.

Without a preset the defaults are ``mnist-5k``, 8 epochs, seed 0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUILTIN_DATASETS", "DEFAULTS", "PRESETS", "PresetError", "resolve"]

BUILTIN_DATASETS = ("mnist-5k", "digits")  # bundled with installable packages: nothing is downloaded

DEFAULTS: dict[str, Any] = {"data": "mnist-5k", "epochs": 8, "seeds": "0", "model": None, "widths": None}
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"data": "mnist-5k", "epochs": 8, "seeds": "0,1,2"},
    "cifar10": {"data": None, "epochs": 15, "seeds": "0,1,2", "model": "cnn", "widths": "16,32,64"},
}


class PresetError(ValueError):
    """Bad ``--preset`` input; the message is one line naming the option and the fix."""


def resolve(preset: str | None, given: dict[str, Any]) -> dict[str, Any]:
    """The options a run uses: ``given`` (None = not given) over ``preset`` over :data:`DEFAULTS`.

    Example:
        >>> resolve("quick", {"epochs": 3})["seeds"], resolve("quick", {"epochs": 3})["epochs"]
        ('0,1,2', 3)
    """
    if preset is not None and preset not in PRESETS:
        raise PresetError(f"unknown --preset {preset!r}: choose from {', '.join(PRESETS)}")
    chosen = {**DEFAULTS, **(PRESETS[preset] if preset else {})}
    out = {k: given[k] if given.get(k) is not None else v for k, v in chosen.items()}
    if out["data"] is None:
        raise PresetError(
            f"--preset {preset} needs --data PATH: a CIFAR-10 ImageFolder (train/<class>/*, test/<class>/*) "
            "or python-batches folder"
        )
    return out
