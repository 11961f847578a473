"""The whole compute frontier: the envelope of the baseline's same-compute variants, and every method against it.

There are two plain ways to spend less compute than the full baseline, and a method is only worth
using if it beats the better of them at its own time:

- **step budgets** (``--budgets``): the baseline trained for a share of its steps at the same batch
  size, its schedule ending at its own end (:mod:`~leanbatch.bench.frontier`'s frontier);
- **batch budgets** (``--batch-budgets``): the baseline trained for all of its steps on batches of a
  share ``b`` of the batch size (``round(b * B)`` rows), its schedule over those steps; it
  forwards and backpropagates ``b`` of the baseline's samples. Every in-batch selection method
  (Selective Backprop, online batch selection, a proxy, RHO-LOSS) takes this path whether it
  means to or not: keeping 70% of each batch trains the same steps on batches of 0.7 B.

Per seed, each *family* is the piecewise-linear curve through its runs' ``(time, final accuracy)``
points in order of time; the full baseline (budget 1, batch 1) belongs to both. The *envelope*
at time ``t`` is the largest of the families' values where they are defined at ``t``; never
extrapolated: a run faster or slower than every family of its seed is ``out of range`` (as
against the step frontier). The paired differences, their 95% t interval and the verdict are
:func:`~leanbatch.bench.frontier.judge`'s: one rule for both yardsticks. With no batch budgets
(an older results.json) the envelope is the step frontier.

Example (two families crossing: the steps family is better early, the batch family late):

    >>> curves = {"steps": [(10.0, 90.0), (30.0, 96.0)], "batch": [(10.0, 88.0), (30.0, 98.0)]}
    >>> envelope_at(curves, 15.0), envelope_at(curves, 25.0)
    ((91.5, 'steps', 'inside'), (95.5, 'batch', 'inside'))
    >>> envelope_at(curves, 35.0)
    (None, None, 'slower')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from leanbatch.bench.frontier import (
    CONFIDENCE,
    SeedComparison,
    clock_time,
    frontier_point,
    interpolate,
    judge,
)

if TYPE_CHECKING:
    from leanbatch.bench.records import RunResult

__all__ = ["FAMILIES", "RULE", "envelope", "envelope_at", "family_of", "seed_curves"]

FAMILIES = ("steps", "batch")
RULE = (
    "diff = method accuracy - the envelope at the method's own time, per seed: the max of the baseline's "
    "families where they are defined (step budgets, batch budgets; each piecewise linear in training "
    "time; the full baseline in both), never extrapolated; verdict as in equal_time"
)
Points = Sequence[tuple[float, float]]


def family_of(kind: str, budget: float, batch: float) -> list[str]:
    """The families a run draws: a baseline at a step budget ``steps``, at a batch budget ``batch``,
    the full baseline both; any other run none.

    Example:
        >>> family_of("baseline", 1.0, 1.0), family_of("baseline", 0.5, 1.0), family_of("baseline", 1.0, 0.5)
        (['steps', 'batch'], ['steps'], ['batch'])
        >>> family_of("sb", 1.0, 1.0)
        []
    """
    if kind != "baseline":
        return []
    if batch != 1.0:
        return ["batch"]
    return ["steps", "batch"] if budget == 1.0 else ["steps"]


def envelope_at(curves: Mapping[str, Points], t: float) -> tuple[float | None, str | None, str]:
    """The envelope of ``curves`` (family -> ``(time, acc)`` points) at ``t``: its accuracy, the family
    that reaches it, and where ``t`` lies (``inside``, ``faster``, ``slower``, ``gap`` between families,
    ``none``: no family has two distinct times).

    Example:
        >>> envelope_at({"steps": [(10.0, 90.0), (20.0, 94.0)]}, 12.5)
        (91.0, 'steps', 'inside')
        >>> envelope_at({"steps": [(10.0, 90.0)]}, 10.0)
        (None, None, 'none')
    """
    drawn = {f: pts for f, pts in curves.items() if len({p[0] for p in pts}) >= 2}
    if not drawn:
        return None, None, "none"
    values = {f: v for f, pts in drawn.items() if (v := interpolate(pts, t)) is not None}
    if values:
        best = max(values, key=lambda f: values[f])
        return values[best], best, "inside"
    if t < min(p[0] for pts in drawn.values() for p in pts):
        return None, None, "faster"
    if t > max(p[0] for pts in drawn.values() for p in pts):
        return None, None, "slower"
    return None, None, "gap"


def seed_curves(
    runs: Sequence[RunResult], clock: str = "wall"
) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """Per seed, each family's ``(time, final accuracy)`` points on ``clock``; the batch family only
    where some run trained on smaller batches (else the envelope is the step frontier).

    Example:
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> def run(label, t, acc, batch=1.0):
        ...     e = EpochRecord(0, t, t, acc, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)
        ...     return RunResult(label, "baseline", 0, 10, [e], batch=batch)
        >>> seed_curves([run("baseline", 2.0, 95.0), run("baseline[batch=0.5]", 1.0, 93.0, 0.5)])
        {0: {'steps': [(2.0, 95.0)], 'batch': [(2.0, 95.0), (1.0, 93.0)]}}
    """
    time_of = clock_time(clock)
    curves: dict[int, dict[str, list[tuple[float, float]]]] = {}
    has_batch = {r.seed for r in runs if r.kind == "baseline" and r.batch != 1.0}
    for r in runs:
        for family in family_of(r.kind, r.budget, r.batch):
            if family == "batch" and r.seed not in has_batch:
                continue
            curves.setdefault(r.seed, {}).setdefault(family, []).append((time_of(r), r.final_acc))
    return curves


def _row(
    label: str, runs: Sequence[RunResult], curves: Mapping[int, Mapping[str, Points]], time_of: Any
) -> dict[str, Any]:
    """A method's row: each seed's run against that seed's envelope, judged by the one rule."""
    per_seed: list[SeedComparison] = []
    reached: list[str | None] = []
    for r in sorted((r for r in runs if r.seed in curves), key=lambda r: r.seed):
        t, acc = time_of(r), r.final_acc
        value, family, where = envelope_at(curves[r.seed], t)
        per_seed.append(SeedComparison(r.seed, t, acc, value, None if value is None else acc - value, where))
        reached.append(family)
    row = {"method": label, "kind": runs[0].kind, **judge(per_seed).as_dict()}
    for entry, family in zip(row["per_seed"], reached, strict=True):
        entry["family"] = family
    return row


def envelope(
    runs: Sequence[RunResult], order: Sequence[str] | None = None, clock: str = "wall"
) -> dict[str, Any]:
    """The ``envelope`` section of results.json (``envelope_cpu`` with ``clock="cpu"``): the shape of
    ``equal_time`` (``frontier_acc*`` keys hold the envelope's accuracy; each ``per_seed`` entry also
    names the ``family`` that reached it) plus ``families``: the points of each family.

    Example:
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> def run(label, kind, t, acc, budget=1.0, batch=1.0):
        ...     e = EpochRecord(0, t, t, acc, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)
        ...     return RunResult(label, kind, 0, 10, [e], budget=budget, batch=batch)
        >>> runs = [run("baseline", "baseline", 4.0, 95.0), run("baseline[budget=0.5]", "baseline", 2.0, 90.0, 0.5),
        ...         run("baseline[batch=0.5]", "baseline", 2.0, 93.0, batch=0.5), run("sb", "sb", 3.0, 94.5)]
        >>> row = envelope(runs)["rows"][0]
        >>> row["method"], row["frontier_acc_mean"], row["per_seed"][0]["family"]
        ('sb', 94.0, 'batch')
    """
    time_of = clock_time(clock)
    curves = seed_curves(runs, clock)
    labels = list(dict.fromkeys([*(order or []), *(r.label for r in runs)]))
    groups = {lab: rs for lab in labels if (rs := [r for r in runs if r.label == lab])}
    families: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for lab, rs in groups.items():
        first = rs[0]
        for family in family_of(first.kind, first.budget, first.batch):
            if any(family in curves.get(r.seed, {}) for r in rs):
                families.setdefault(family, []).append(
                    {**frontier_point(lab, rs, time_of), "batch": first.batch}
                )
        if first.kind != "baseline":
            rows.append(_row(lab, rs, curves, time_of))
    for points in families.values():
        points.sort(key=lambda p: (p["budget"] * p["batch"], p["budget"]))
    return {
        "clock": clock,
        "rule": RULE,
        "confidence": CONFIDENCE,
        "budgets": [p["budget"] for p in families.get("steps", [])],
        "batch_budgets": [p["batch"] for p in families.get("batch", [])],
        "families": {f: families[f] for f in FAMILIES if f in families},
        "rows": rows,
    }
