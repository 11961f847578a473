"""The yardstick: each arm against the envelope of the best plain uses of the same compute, at equal cost.

A method that saves 30% of the work has to beat the simplest uses of that 30%: the baseline
trained for fewer steps, with its schedule ending at its own end (the *step budgets*,
``--budgets``), and the baseline trained for all its steps on smaller batches (the *batch
budgets*, ``--batch-budgets``). Per seed each family is the piecewise-linear curve through its
runs' ``(cost, final metric)``, each run at its own cost on the study's clock (``work``: its
FLOP-weighted passes, a share of the full baseline's, so the verdict is a function of the training
alone; ``wall`` or ``cpu``: its training time); the full baseline belongs to both. The envelope at
a cost is the best of the families defined there (the higher for a ``max`` metric, the lower for a
``min`` one), never extrapolated. Every arm that is not a baseline is paired with it by seed at
its own cost and judged by the one rule of :mod:`~leanbatch.engine.judging.verdicts`.

Example:
    >>> curves = {"steps": [(10.0, 90.0), (30.0, 95.0)], "batch": [(20.0, 95.5), (30.0, 95.0)]}
    >>> envelope_at(curves, 25.0), envelope_at(curves, 25.0, goal="min")
    ((95.25, 'batch', 'inside'), (93.75, 'steps', 'inside'))
    >>> envelope_at(curves, 35.0)
    (None, None, 'slower')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from leanbatch.engine.judging.records import RunRecord, work_scale
from leanbatch.engine.judging.verdicts import (
    CONFIDENCE,
    SeedComparison,
    interpolate,
    judge,
    mean_of,
    std_of,
)

__all__ = ["FAMILIES", "RULE", "envelope", "envelope_at", "family_of"]

FAMILIES = ("steps", "batch")
RULE = (
    "diff = arm's final metric - the envelope at the arm's own cost (the study's clock), per seed: the best "
    "of the baseline's families where they are defined (step budgets, batch budgets; each piecewise linear in "
    "cost; the full baseline in both), never extrapolated; better/worse when the 95% t interval of "
    "the mean gain excludes 0 and |mean diff| > std of the diffs; otherwise on (within noise)"
)
Points = Sequence[tuple[float, float]]


def family_of(kind: str, budget: float, batch: float) -> list[str]:
    """The families a run draws: a step-budget baseline ``steps``, a batch-budget one ``batch``, the
    full baseline both; any other run none.

    Example:
        >>> family_of("baseline", 1.0, 1.0), family_of("baseline", 0.5, 1.0), family_of("sb", 1.0, 1.0)
        (['steps', 'batch'], ['steps'], [])
    """
    if kind != "baseline":
        return []
    if batch != 1.0:
        return ["batch"]
    return ["steps", "batch"] if budget == 1.0 else ["steps"]


def envelope_at(
    curves: Mapping[str, Points], t: float, goal: str = "max"
) -> tuple[float | None, str | None, str]:
    """The envelope of ``curves`` (family -> ``(cost, metric)`` points) at ``t``: its value, the family
    that reaches it, and where ``t`` lies (``inside``; ``faster`` or ``slower``: below or above every
    run's cost; ``gap`` between families; ``none``: no family has two distinct costs)."""
    drawn = {f: pts for f, pts in curves.items() if len({p[0] for p in pts}) >= 2}
    if not drawn:
        return None, None, "none"
    values = {f: v for f, pts in drawn.items() if (v := interpolate(pts, t)) is not None}
    if values:
        best = (max if goal == "max" else min)(values, key=values.__getitem__)
        return values[best], best, "inside"
    if t < min(p[0] for pts in drawn.values() for p in pts):
        return None, None, "faster"
    if t > max(p[0] for pts in drawn.values() for p in pts):
        return None, None, "slower"
    return None, None, "gap"


def _point(label: str, drawn: Sequence[tuple[RunRecord, float]], family: str) -> dict[str, Any]:
    """One point of a family: the runs of ``label`` (one per seed) at their costs, mean and spread."""
    runs, costs = [r for r, _ in drawn], [c for _, c in drawn]
    return {
        "method": label,
        "share": runs[0].budget if family == "steps" else runs[0].batch,
        "seeds": [r.seed for r in runs],
        "metric_mean": mean_of([r.metric for r in runs]),
        "metric_std": std_of([r.metric for r in runs]),
        "cost_mean": mean_of(costs),
        "cost_std": std_of(costs),
    }


def envelope(
    runs: Sequence[RunRecord], order: Sequence[str] = (), clock: str = "work", goal: str = "max"
) -> dict[str, Any]:
    """The ``envelope`` section of results.json on ``clock``: ``families`` (each family's points, by
    share) and ``rows``: one comparison per arm that is not a baseline.

    Example:
        >>> from leanbatch.engine.judging.records import RunRecord
        >>> def run(label, kind, t, m, budget=1.0, batch=1.0):
        ...     return RunRecord(label, kind, 0, m, [], budget, batch, train_time_s=t)
        >>> runs = [run("baseline", "baseline", 4.0, 95.0), run("baseline[budget=0.5]", "baseline", 2.0, 90.0, 0.5),
        ...         run("baseline[batch=0.5]", "baseline", 2.0, 93.0, batch=0.5), run("sb", "sb", 3.0, 94.5)]
        >>> row = envelope(runs, clock="wall")["rows"][0]
        >>> row["method"], row["reference_mean"], row["per_seed"][0]["family"]
        ('sb', 94.0, 'batch')
    """
    scale = work_scale(runs)
    cost = {id(r): r.cost(clock, scale) for r in runs}
    has_batch = {r.seed for r in runs if r.kind == "baseline" and r.batch != 1.0}
    curves: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for r in runs:
        for family in family_of(r.kind, r.budget, r.batch):
            if (c := cost[id(r)]) is not None and (family == "steps" or r.seed in has_batch):
                curves.setdefault(r.seed, {}).setdefault(family, []).append((c, r.metric))
    labels = list(dict.fromkeys([*order, *(r.method for r in runs)]))
    groups = {lab: rs for lab in labels if (rs := [r for r in runs if r.method == lab])}
    families: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for lab, rs in groups.items():
        first = rs[0]
        for family in family_of(first.kind, first.budget, first.batch):
            drawn = [
                (r, c) for r in rs if family in curves.get(r.seed, {}) and (c := cost[id(r)]) is not None
            ]
            if drawn:
                families.setdefault(family, []).append(_point(lab, drawn, family))
        if first.kind != "baseline":
            per_seed = [
                _pair(r, cost[id(r)], curves[r.seed], goal)
                for r in sorted(rs, key=lambda r: r.seed)
                if r.seed in curves
            ]
            rows.append({"method": lab, "kind": first.kind, **asdict(judge(per_seed, goal))})
    for points in families.values():
        points.sort(key=lambda p: p["share"])
    return {
        "clock": clock,
        "goal": goal,
        "rule": RULE,
        "confidence": CONFIDENCE,
        "families": {f: families[f] for f in FAMILIES if f in families},
        "rows": rows,
    }


def _pair(run: RunRecord, cost: float | None, curves: Mapping[str, Points], goal: str) -> SeedComparison:
    """One seed of an arm against its seed's envelope, at the arm's cost (None: no work counted)."""
    value, reached, where = (None, None, "none") if cost is None else envelope_at(curves, cost, goal)
    diff = None if value is None else run.metric - value
    return SeedComparison(run.seed, cost, run.metric, value, diff, where, reached)
