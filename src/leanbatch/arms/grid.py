"""The arms of one study, built in one place: ``--methods``, their uniform twins, the baseline's budgets.

Example:
    >>> [a.label for a in study_arms("baseline,infobatch", budgets="0.5,1", batch_budgets="0.5", controls=True)]
    ['baseline', 'baseline[budget=0.5]', 'baseline[batch=0.5]', 'infobatch', 'infobatch~random']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from leanbatch.arms.methods import (
    DEFAULT_BATCH_BUDGETS,
    DEFAULT_BUDGETS,
    Arm,
    parse_budgets,
    parse_methods,
    with_budgets,
)
from leanbatch.arms.twins import pair_twins, with_controls

__all__ = ["study_arms"]


def _shares(given: str | Sequence[float] | None, default: str, option: str) -> list[float]:
    if given is None:
        given = default
    return parse_budgets(given, option) if isinstance(given, str) else sorted(float(b) for b in given)


def study_arms(
    methods: str | Sequence[str],
    *,
    budgets: str | Sequence[float] | None = None,
    batch_budgets: str | Sequence[float] | None = None,
    controls: bool = False,
    options: Mapping[str, Any] | None = None,
) -> list[Arm]:
    """The arms of a study: ``methods`` (a ``--methods`` text or a list of items; ``options``: the global
        options, ``--prune-ratio``...), each choosing arm's twin with ``controls`` (without it, an arm is
    still paired with its twin when the twin is among ``methods``), then the baseline at
        the step ``budgets`` and ``batch_budgets`` (a text like ``"0.5,0.7"``, a list of shares, or None:
        the defaults). Bad input: :class:`~leanbatch.arms.methods.ArmError`, one line."""
    arms = parse_methods(methods if isinstance(methods, str) else ",".join(methods), options)
    arms = with_controls(arms) if controls else pair_twins(arms)
    steps = _shares(budgets, DEFAULT_BUDGETS, "--budgets")
    return with_budgets(arms, steps, _shares(batch_budgets, DEFAULT_BATCH_BUDGETS, "--batch-budgets"))
