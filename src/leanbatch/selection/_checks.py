"""Argument validation shared by the selection modules (private).

Every check names the offending argument and says what a valid value looks like,
so a bad hyperparameter fails where it is written, not halfway through training.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_fraction", "check_int", "check_autocast", "check_interval", "rankable_losses"]


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fraction(value: Any, name: str) -> float:
    """Return ``value`` as a float in (0, 1]; TypeError/ValueError naming ``name`` otherwise."""
    if not _is_real(value):
        raise TypeError(f"{name} must be a float in (0, 1], got {type(value).__name__} {value!r}")
    v = float(value)
    if not (0.0 < v <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return v


def check_int(value: Any, name: str, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum`` (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_interval(start: Any, end: Any) -> tuple[float, float]:
    """Validate the active window ``start <= progress < end`` (fractions of training)."""
    for name, v in (("start", start), ("end", end)):
        if not _is_real(v):
            raise TypeError(f"{name} must be a float fraction of training, got {type(v).__name__} {v!r}")
        if math.isnan(float(v)):
            raise ValueError(f"{name} must be a number, got NaN")
    s, e = float(start), float(end)
    if s < 0.0:
        raise ValueError(f"start must be >= 0 (a fraction of training), got {start!r}")
    if s >= e:
        raise ValueError(f"start must be < end, got start={start!r}, end={end!r}")
    return s, e


def check_autocast(value: Any) -> torch.dtype | bool | None:
    """``None`` (inherit the caller's context), ``False`` (full precision), ``True`` or a half dtype."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, torch.dtype) and value in (torch.float16, torch.bfloat16):
        return value
    raise TypeError(
        f"autocast must be None (use the caller's autocast context), False (full precision), True, "
        f"torch.bfloat16 or torch.float16, got {value!r}"
    )


def rankable_losses(losses: Tensor, name: str) -> Tensor:
    """``losses`` as floats to rank: integer losses become float32, float ones pass unchanged.

    Composer ranks whatever the loss returns (its own tests use
    ``torch.ones_like(target)``, an integer tensor), so integer losses are
    accepted. Bool and complex tensors are refused: neither is a loss to rank.
    """
    if losses.dtype == torch.bool or losses.is_complex():
        raise TypeError(
            f"{name} must return real per-example losses (float or integer), got {losses.dtype}: "
            "a bool or complex tensor cannot be ranked"
        )
    return losses if losses.is_floating_point() else losses.float()
