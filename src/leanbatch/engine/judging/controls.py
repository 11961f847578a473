"""Controls: each choosing arm against its uniform twin (:mod:`leanbatch.arms.twins`), and what the choosing buys.

A selection rule is worth its name only if it beats the same budget spent at random. The
``controls`` section of results.json pairs each method with its twin by seed: the difference in
final metric (method minus twin, each at its own cost), its 95% t interval and the verdict of
:func:`~leanbatch.engine.judging.verdicts.interval`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from leanbatch.engine.judging.records import RunRecord, work_scale
from leanbatch.engine.judging.verdicts import CONFIDENCE, interval, mean_of, spread_of

__all__ = ["RULE", "controls"]

RULE = (
    "diff = arm's final metric - its uniform twin's, same seed, each at its own cost; "
    "better/worse when the 95% t interval of the mean gain excludes 0 and |mean diff| > std of the diffs; "
    "otherwise on (within noise)"
)


def controls(
    runs: Sequence[RunRecord], methods: Sequence[dict[str, Any]], goal: str = "max", clock: str = "work"
) -> dict[str, Any]:
    """The ``controls`` section of results.json: one row per arm of ``methods`` (``config.methods``)
    that names a ``control``, paired with it by seed; each one's cost on ``clock``.

    Example:
        >>> def run(label, seed, m, t):
        ...     return RunRecord(label, "obs", seed, m, [], train_time_s=t)
        >>> runs = [run("obs", 0, 95.0, 2.0), run("obs~uniform", 0, 94.0, 1.9), run("obs", 1, 95.5, 2.1), run("obs~uniform", 1, 94.7, 2.0)]
        >>> row = controls(runs, [{"label": "obs", "control": "obs~uniform"}], clock="wall")["rows"][0]
        >>> row["control"], round(row["diff_mean"], 2), row["verdict"], [round(s["diff"], 2) for s in row["per_seed"]]
        ('obs~uniform', 0.9, 'on', [1.0, 0.8])
    """
    scale, rows = work_scale(runs), []
    for m in methods:
        if not m.get("control"):
            continue
        mine = {r.seed: r for r in runs if r.method == m["label"]}
        theirs = {r.seed: r for r in runs if r.method == m["control"]}
        pairs = [(mine[s], theirs[s]) for s in sorted(set(mine) & set(theirs))]
        stats = interval([a.metric - b.metric for a, b in pairs], goal)
        cost = {id(r): r.cost(clock, scale) for pair in pairs for r in pair}
        rows.append(
            {
                "method": m["label"],
                "control": m["control"],
                "seeds": [a.seed for a, _ in pairs],
                "metric_mean": mean_of([a.metric for a, _ in pairs]),
                "control_metric_mean": mean_of([b.metric for _, b in pairs]),
                "cost_mean": spread_of([cost[id(a)] for a, _ in pairs])[0],
                "control_cost_mean": spread_of([cost[id(b)] for _, b in pairs])[0],
                **asdict(stats),
                "per_seed": [
                    {
                        "seed": a.seed,
                        "metric": a.metric,
                        "control_metric": b.metric,
                        "diff": a.metric - b.metric,
                        "cost": cost[id(a)],
                        "control_cost": cost[id(b)],
                    }
                    for a, b in pairs
                ],  # fmt: skip
            }
        )
    return {"clock": clock, "goal": goal, "rule": RULE, "confidence": CONFIDENCE, "rows": rows}
