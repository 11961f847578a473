"""Presets of ``leanbatch bench`` and the budget runs that draw the equal-time frontier.

A preset fills in the options a user did not give (explicit options always win):

- ``quick`` (also ``--quick``): the README's main command, a first look in a few minutes on
  2 CPU cores: 4,000 train / 1,000 test bundled MNIST digits, 8 epochs, seeds 0, 1, 2, every
  method, the baseline at step budgets 0.5, 0.7, 0.85 and 1 and at batch budgets 0.5 and 0.7.
- ``cifar10``: the CIFAR-10 comparison on a folder you give with ``--data`` (an ImageFolder with
  ``train/`` and ``test/``, or the python batches): the small CNN (16/32/64 channels), 15 epochs,
  seeds 0, 1, 2, random crop + flip, every method, the same budgets.

Without a preset the defaults are ``mnist-5k``, 8 epochs, seed 0 and the same budgets. The step
budgets draw the frontier of :mod:`~leanbatch.bench.frontier`, the batch budgets
(``--batch-budgets``: the baseline's steps on batches of ``b`` of the batch size) the second
family of the envelope (:mod:`~leanbatch.bench.envelope`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from leanbatch.bench.methods import MAX_BUDGET, MethodRow, budget_label, make_row

__all__ = [
    "PRESETS",
    "DEFAULTS",
    "DEFAULT_BUDGETS",
    "PresetError",
    "resolve",
    "parse_budgets",
    "with_budgets",
    "DEFAULT_BATCH_BUDGETS",
]

DEFAULT_BUDGETS = "0.5,0.7,0.85,1"
DEFAULT_BATCH_BUDGETS = "0.5,0.7"
DEFAULTS: dict[str, Any] = {
    "data": "mnist-5k",
    "epochs": 8,
    "seeds": "0",
    "budgets": DEFAULT_BUDGETS,
    "batch_budgets": DEFAULT_BATCH_BUDGETS,
    "model": None,
    "widths": None,
}
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"data": "mnist-5k", "epochs": 8, "seeds": "0,1,2"},
    "cifar10": {"data": None, "epochs": 15, "seeds": "0,1,2", "model": "cnn", "widths": "16,32,64"},
}


class PresetError(ValueError):
    """Bad ``--preset`` / ``--budgets`` input; the message is one line naming the option and the fix."""


def resolve(preset: str | None, given: dict[str, Any]) -> dict[str, Any]:
    """The options a run uses: ``given`` (None = not given) over ``preset`` over :data:`DEFAULTS`.

    Example:
        >>> resolve("quick", {"epochs": 3})["seeds"], resolve("quick", {"epochs": 3})["epochs"]
        ('0,1,2', 3)
        >>> resolve(None, {})["budgets"], resolve("quick", {})["batch_budgets"]
        ('0.5,0.7,0.85,1', '0.5,0.7')
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


def parse_budgets(text: str, option: str = "--budgets") -> list[float]:
    """``--budgets`` (fractions of the baseline's steps) or ``--batch-budgets`` (of its batch size):
    comma-separated, or ``none``; sorted.

    Example:
        >>> parse_budgets("1,0.5,0.7"), parse_budgets("none"), parse_budgets("0.7,0.5", "--batch-budgets")
        ([0.5, 0.7, 1.0], [], [0.5, 0.7])
    """
    if text.strip().lower() in ("none", ""):
        return []
    of, example = (
        ("steps", DEFAULT_BUDGETS) if option == "--budgets" else ("batch size", DEFAULT_BATCH_BUDGETS)
    )
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PresetError(
            f"{option} must be comma-separated fractions of the baseline's {of}, e.g. {example}, "
            f"or none; got {text!r}"
        ) from None
    bad = [v for v in values if not (0.0 < v <= MAX_BUDGET) or not math.isfinite(v)]
    if bad or not values:
        raise PresetError(f"{option} must be fractions in (0, {MAX_BUDGET:g}], e.g. {example}; got {text!r}")
    if len(set(values)) != len(values):
        raise PresetError(f"{option} lists a budget twice: {text}")
    return sorted(values)


def with_budgets(
    methods: list[MethodRow], budgets: Sequence[float], batch_budgets: Sequence[float] = ()
) -> list[MethodRow]:
    """``methods`` with a baseline row for every step budget and batch budget not already among them.

    The rows go first in the order of the comparison: the full baseline, the step budgets
    (ascending), the batch budgets (ascending), then the other methods as given.

    Example:
        >>> from leanbatch.bench.methods import parse_methods
        >>> [m.label for m in with_budgets(parse_methods("infobatch,baseline"), [0.5, 1.0], [0.7])]
        ['baseline', 'baseline[budget=0.5]', 'baseline[batch=0.7]', 'infobatch']
    """
    have = {(m.budget, m.batch) for m in methods if m.kind == "baseline"}
    extra = [make_row("baseline", budget_label(b), budget=b) for b in budgets]
    extra += [make_row("baseline", budget_label(1.0, b), batch=b) for b in batch_budgets]
    frontier = [m for m in methods if m.kind == "baseline"]
    frontier += [m for m in extra if (m.budget, m.batch) not in have]
    frontier.sort(key=lambda m: (m.budget != 1.0 or m.batch != 1.0, m.batch != 1.0, m.budget, m.batch))
    return frontier + [m for m in methods if m.kind != "baseline"]
