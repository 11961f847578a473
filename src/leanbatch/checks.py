"""Argument validation: one place for every check of a hyperparameter or an argument.

Every check names the argument, says what a valid value looks like and, where it helps, why,
so a bad value fails where it is written (at construction), not halfway through training.
Booleans are never accepted as numbers, NaN never passes a range, and infinity passes only
where a range is open-ended on purpose (``allow_inf``). The library's classes and the
benchmark's command line validate through these functions, under the library's own names.

Example:
    >>> check_fraction(0.5, "keep"), check_int(3, "interrupt", 0), check_real(2.0, "c", low=0.0)
    (0.5, 3, 2.0)
    >>> try:
    ...     check_real(float("nan"), "lr", low=0.0, low_open=True)
    ... except ValueError as e:
    ...     print(e)
    lr must be a finite number > 0, got nan
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "INTEGER_DTYPES",
    "check_autocast",
    "check_bool",
    "check_choice",
    "check_epochs",
    "check_index_tensor",
    "check_fraction",
    "check_int",
    "check_per_sample_loss",
    "check_positions",
    "check_interval",
    "check_ratio",
    "check_real",
    "check_saved_tensor",
    "check_seed",
    "is_real",
    "require",
]


def is_real(value: Any) -> bool:
    """Whether ``value`` is a Python int or float (not a bool).

    Example:
        >>> is_real(1), is_real(2.5), is_real(True), is_real("1")
        (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_real(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
    hint: str = "",
    type_error: bool = False,
) -> float:
    """``value`` as a float inside the given bounds; ``ValueError`` naming ``name`` otherwise.

    NaN never passes; infinity only with ``allow_inf``. ``type_error``: raise ``TypeError``
    (not ``ValueError``) for a value that is not a number at all.
    """
    where = ""
    if low is not None and high is not None:
        where = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        where = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        where = f"{'<' if high_open else '<='} {high:g}"
    what = f"{name} must be a {'' if allow_inf else 'finite '}number {where}".rstrip()
    tail = f": {hint}" if hint else ""
    if not is_real(value):
        exc = TypeError if type_error else ValueError
        raise exc(f"{what}, got {type(value).__name__} {value!r}{tail}")
    v = float(value)
    ok = not math.isnan(v) and (allow_inf or math.isfinite(v))
    if ok and low is not None:
        ok = v > low if low_open else v >= low
    if ok and high is not None:
        ok = v < high if high_open else v <= high
    if not ok:
        raise ValueError(f"{what}, got {value!r}{tail}")
    return v


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a float in (0, 1]; ``TypeError`` for a non-number, ``ValueError`` out of range."""
    if not is_real(value):
        raise TypeError(f"{name} must be a float in (0, 1], got {type(value).__name__} {value!r}")
    v = float(value)
    if not (0.0 < v <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return v


def check_ratio(value: object, name: str, meaning: str, low_open: bool = False) -> float:
    """``value`` as a float in [0, 1) (or (0, 1) with ``low_open``); ``ValueError`` naming ``name``."""
    v = float(value) if is_real(value) else math.nan  # type: ignore[arg-type]
    if not (0.0 <= v < 1.0) or (low_open and v == 0.0):  # NaN fails too
        interval = "(0, 1)" if low_open else "[0, 1)"
        raise ValueError(f"{name} must be in {interval}, got {value!r}: {meaning}")
    return v


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` if an int (bools rejected) in ``[minimum, maximum]``; else ``TypeError``/``ValueError``."""
    bound = f" >= {minimum}" if minimum is not None else ""
    if maximum is not None:
        bound = f" in [{minimum}, {maximum}]" if minimum is not None else f" <= {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{bound}, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an int{bound}, got {value!r}")
    return value


def check_seed(value: Any, name: str = "seed") -> int:
    """An int seed (any int, bools rejected); ``TypeError`` naming ``name`` otherwise."""
    return check_int(value, name)


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is a bool; ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_choice(value: Any, name: str, choices: Collection[Any], hint: str = "") -> Any:
    """``value`` if it is one of ``choices``; ``ValueError`` listing them otherwise."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}{': ' + hint if hint else ''}")
    return value


def check_epochs(num_epochs: object, delta: object) -> None:
    """Raise ``ValueError`` naming ``num_epochs`` or ``delta`` unless both are valid.

    Example:
        >>> check_epochs(8, 0.875)
        >>> try:
        ...     check_epochs(8, 0.0)
        ... except ValueError as e:
        ...     print(str(e).split(":")[0])
        delta must be in (0, 1], got 0.0
    """
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be an int >= 1, got {num_epochs!r}")
    if not is_real(delta) or not (0.0 < delta <= 1.0):  # type: ignore[operator]
        raise ValueError(
            f"delta must be in (0, 1], got {delta!r}: epochs at or after delta * num_epochs train on "
            "all data (0.875 is InfoBatch's default)"
        )


def check_interval(start: Any, end: Any) -> tuple[float, float]:
    """Validate a window ``start <= progress < end`` in fractions of training."""
    for name, v in (("start", start), ("end", end)):
        if not is_real(v):
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


def require(state: Any, keys: tuple[str, ...], what: str) -> Mapping[str, Any]:
    """``state`` if it is a mapping holding every key; ``ValueError`` naming the first missing one.

    Example:
        >>> try:
        ...     require({"a": 1}, ("a", "b"), "state_dict")
        ... except ValueError as e:
        ...     print(e)
        state_dict has no key 'b': it was not saved by this object's state_dict()
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"{what} must be a dict saved by state_dict(), got {type(state).__name__}")
    for key in keys:
        if key not in state:
            raise ValueError(f"{what} has no key {key!r}: it was not saved by this object's state_dict()")
    return state


INTEGER_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})  # index-like


def check_index_tensor(value: Any, name: str) -> torch.Tensor:
    """A 1-D integer tensor (lists and numpy arrays converted); ``TypeError`` naming ``name`` otherwise.

    Example:
        >>> check_index_tensor([3, 1], "indices").tolist()
        [3, 1]
    """
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if t.dim() != 1 or t.dtype not in INTEGER_DTYPES:
        raise TypeError(f"{name} must be a 1-D integer tensor, got {t.dtype} {tuple(t.shape)}")
    return t


def check_positions(positions: Any, k: int, n: int) -> Tensor:
    """``positions``: one row of a batch of ``n`` per each of ``k`` losses (the range checked on CPU; on
    a device, where the rows are gathered)."""
    positions = check_index_tensor(positions, "positions")
    if positions.shape[0] != k:
        raise ValueError(
            f"loss has {k} entries but positions has {positions.shape[0]}: one position per loss"
        )
    if positions.device.type == "cpu" and k and not 0 <= int(positions.min()) <= int(positions.max()) < n:
        raise IndexError(f"positions must be rows of the batch, in [0, {n})")
    return positions


def check_saved_tensor(
    state: Mapping[str, Any], key: str, shape: tuple[int, ...], *, nan: bool = True, low: float | None = None
) -> torch.Tensor:
    """``state[key]``: a float tensor of ``shape``, never infinite (NaN only with ``nan``), ``>= low``.

    Example:
        >>> import torch
        >>> try:
        ...     check_saved_tensor({"w": torch.tensor([1.0, -2.0])}, "w", (2,), low=0.0)
        ... except ValueError as e:
        ...     print(e)
        state_dict['w'] must be a float tensor of shape (2,) with finite values >= 0 or NaN
    """
    t = state[key]
    what = f"state_dict[{key!r}] must be a float tensor of shape {shape} with finite values"
    what += f" >= {low:g}" if low is not None else ""
    what += " or NaN" if nan else ""
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or not t.is_floating_point():
        raise ValueError(what)
    bad = torch.isinf(t) | (torch.isnan(t) if not nan else torch.zeros_like(t, dtype=torch.bool))
    if low is not None:
        bad |= t < low
    if bool(bad.any()):
        raise ValueError(what)
    return t


def check_per_sample_loss(loss: Any, name: str = "loss") -> Tensor:
    """Validate that ``loss`` holds one loss per example and return it.

    Raises a ``TypeError``/``ValueError`` naming ``name`` and the fix when it is not
    a tensor, is a scalar (a reduced loss), or has more than one dimension.

    Example:
        >>> import torch
        >>> check_per_sample_loss(torch.ones(3)).shape
        torch.Size([3])
    """
    if not isinstance(loss, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of per-sample losses, got {type(loss).__name__}")
    if loss.dim() == 0:
        raise ValueError(
            f"{name} is a scalar: pass per-sample losses, e.g. F.cross_entropy(logits, y, reduction='none')"
        )
    if loss.dim() != 1:
        raise ValueError(
            f"{name} must have shape (batch,), got {tuple(loss.shape)}: reduce the non-batch dimensions "
            "first, e.g. loss.flatten(1).mean(1) (see leanbatch.per_sequence_loss for token losses)"
        )
    if not (loss.is_floating_point()):
        raise TypeError(f"{name} must be a floating-point tensor, got {loss.dtype}")
    return loss


def check_map_dataset(dataset: Any) -> int:
    """The length of a map-style dataset (``__len__`` and ``__getitem__``, at least one sample), or a
    clear error."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            "dataset must be a map-style dataset with __len__ and __getitem__: InfoBatch prunes by "
            "index, so an IterableDataset cannot be wrapped; on a stream, select within each batch "
            "instead (leanbatch.SelectiveBackprop or leanbatch.OnlineBatchSelection)"
        )
    try:
        n = len(dataset)
    except TypeError as e:
        raise TypeError("dataset must define __len__ (a map-style dataset)") from e
    if n < 1:
        raise ValueError("dataset is empty: InfoBatch needs at least one sample")
    return n
