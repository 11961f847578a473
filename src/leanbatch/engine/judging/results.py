"""From finished runs to results.json (schema ``leanbatch.bench/4``, every key in
``docs/results-json.md``): the summary, the realisation on this machine, the sections.

The verdicts, the envelope and ``to_target`` are on ``config.clock`` (``work`` by default: the same
training gives the same figures on any machine); the wall clock is the realisation of the saving:
``actual_speedup`` (the full baseline's training time over the arm's, paired by seed) and
``achieved_of_ideal`` (actual over ideal), each with its spread over seeds.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

from leanbatch.engine.judging.controls import controls
from leanbatch.engine.judging.envelope import envelope
from leanbatch.engine.judging.records import RunRecord, work_scale
from leanbatch.engine.judging.verdicts import mean_of, spread_of, std_of

__all__ = [
    "DEFAULT_TOLERANCE",
    "SCHEMA",
    "build_results",
    "parse_tolerance",
    "summarize",
    "timing",
    "versions",
]

SCHEMA = "leanbatch.bench/4"
DEFAULT_TOLERANCE = "1%"  # of the baseline's final metric: the same on any metric's scale


def parse_tolerance(value: Any, name: str = "tolerance") -> float | str:
    """``tolerance`` checked: ``"N%"`` (a share of the full baseline's final metric, scale-free) or a
    number >= 0 (in the metric's units); a ``ValueError`` naming ``name`` and the fix otherwise.

    Example:
        >>> parse_tolerance("1%"), parse_tolerance("0.2"), parse_tolerance(0)
        ('1%', 0.2, 0.0)
    """
    text = str(value).strip()
    try:
        number = float(text.removesuffix("%"))
    except ValueError:
        number = float("nan")
    if isinstance(value, bool) or not (0 <= number < float("inf")):
        raise ValueError(
            f"{name} must be a share of the baseline's final metric like '1%' or a number >= 0 in the metric's units, got {value!r}"
        )
    return f"{number:g}%" if text.endswith("%") else number


def tolerance_of(spec: float | str, base_metric: float) -> float:
    """The tolerance in the metric's units: ``spec`` (see :func:`parse_tolerance`) of ``base_metric``.

    Example:
        >>> tolerance_of("1%", -250.0), tolerance_of(0.2, 95.0)
        (2.5, 0.2)
    """
    spec = parse_tolerance(spec)
    return abs(base_metric) * float(spec[:-1]) / 100 if isinstance(spec, str) else spec


def _to_target(run: RunRecord, target: float, goal: str, clock: str, scale: float) -> float | None:
    for e, cost in zip(run.epochs, run.curve(clock, scale), strict=True):
        if e.metric is not None and (e.metric >= target if goal == "max" else e.metric <= target):
            return cost
    return None


def _realised(rs: Sequence[RunRecord], base: Sequence[RunRecord], scale: float) -> dict[str, Any]:
    """The wall clock's share of the saving, per seed against the full baseline of that seed (its mean
    where that seed has none): ``actual`` = baseline time / arm time, ``achieved`` = actual / ideal."""
    if not base:
        return dict.fromkeys(("actual_speedup", "actual_speedup_std", "achieved_of_ideal", "achieved_std"))
    by_seed = {r.seed: r.train_time_s for r in base}
    mean_time = mean_of(list(by_seed.values()))
    actual = [by_seed.get(r.seed, mean_time) / r.train_time_s if r.train_time_s > 0 else None for r in rs]
    ideal = [None if (w := r.cost("work", scale)) is None or w <= 0 else 1.0 / w for r in rs]
    achieved = [None if a is None or i is None else a / i for a, i in zip(actual, ideal, strict=True)]
    (a, a_std), (b, b_std) = spread_of(actual), spread_of(achieved)
    return {"actual_speedup": a, "actual_speedup_std": a_std, "achieved_of_ideal": b, "achieved_std": b_std}


def summarize(
    runs: Sequence[RunRecord],
    tolerance: float | str,
    goal: str,
    order: Sequence[str] = (),
    clock: str = "work",
) -> list[dict[str, Any]]:
    """One row per arm (``order`` first, then first-seen) with the summary table's figures; ratios are
    against the arm labelled ``baseline`` and None without one; ``cost_*`` and ``to_target`` on ``clock``;
    ``target``: the baseline's final mean less ``tolerance`` (:func:`tolerance_of`) in the goal's direction.

    Example:
        >>> runs = [RunRecord("baseline", "baseline", 0, 90.0, [], train_time_s=2.0), RunRecord("sb", "sb", 0, 91.0, [], train_time_s=1.0)]
        >>> [(r["method"], r["metric_delta_vs_baseline"], r["time_ratio_vs_baseline"], r["actual_speedup"]) for r in summarize(runs, 0.2, "max")]
        [('baseline', 0.0, 1.0, 1.0), ('sb', 1.0, 0.5, 2.0)]
    """
    labels = dict.fromkeys([*order, *(r.method for r in runs)])
    groups = {lab: rs for lab in labels if (rs := [r for r in runs if r.method == lab])}
    base, scale = groups.get("baseline", []), work_scale(runs)
    base_time = mean_of([r.train_time_s for r in base]) if base else None
    base_cpu = mean_of([r.train_cpu_time_s for r in base]) if base else None
    base_cost = spread_of([r.cost(clock, scale) for r in base])[0]
    base_metric = mean_of([r.metric for r in base]) if base else None
    tol = None if base_metric is None else tolerance_of(tolerance, base_metric)
    target = None if base_metric is None or tol is None else base_metric + (-tol if goal == "max" else tol)
    rows = []
    for lab, rs in groups.items():
        metrics, times = [r.metric for r in rs], [r.train_time_s for r in rs]
        tot = [r.totals() for r in rs]
        frac = {k: spread_of([t[k] for t in tot])[0] for k in tot[0]}
        cost = spread_of([r.cost(clock, scale) for r in rs])[0]
        reach = [_to_target(r, target, goal, clock, scale) for r in rs] if target is not None else []
        cpu = mean_of([r.train_cpu_time_s for r in rs])
        work = spread_of([r.cost("work", scale) for r in rs])[0]
        rows.append({
            "method": lab, "kind": rs[0].kind, "budget": rs[0].budget, "batch": rs[0].batch,
            "seeds": [r.seed for r in rs], "metric_mean": mean_of(metrics), "metric_std": std_of(metrics),
            "metric_delta_vs_baseline": None if base_metric is None else mean_of(metrics) - base_metric,
            "cost_mean": cost, "cost_ratio_vs_baseline": None if cost is None or not base_cost else cost / base_cost,
            "time_s_mean": mean_of(times), "time_s_std": std_of(times),
            "time_ratio_vs_baseline": mean_of(times) / base_time if base_time else None,
            "cpu_time_s_mean": cpu, "cpu_speedup": base_cpu / cpu if base_cpu and cpu else None, **frac,
            "ideal_speedup": 1.0 / work if work else None, **_realised(rs, base, scale), "target": target,
            "to_target": spread_of([t for t in reach if t is not None])[0] if reach and None not in reach else None,
            "reached_target": None if target is None else sum(t is not None for t in reach),
        })  # fmt: skip
    return rows


def timing(summary: Sequence[dict[str, Any]], runs: Sequence[RunRecord]) -> dict[str, Any]:
    """results.json's ``timing``: the full baseline's own wall-clock spread over seeds (its standard
    deviation over its mean; None with fewer than two seeds) and the arms whose time saved is smaller
    than that spread (on this machine their saving cannot be told from timing noise).

    Example:
        >>> runs = [RunRecord("baseline", "baseline", s, 1.0, [], train_time_s=t) for s, t in ((0, 9.0), (1, 11.0))]
        >>> rows = [{"method": "sb", "kind": "sb", "time_ratio_vs_baseline": 0.95}]
        >>> t = timing(rows, runs)
        >>> round(t["baseline_spread"], 3), t["within_noise"]
        (0.141, ['sb'])
    """
    times = [r.train_time_s for r in runs if r.method == "baseline"]
    spread = std_of(times) / mean_of(times) if len(times) > 1 and mean_of(times) > 0 else None
    noisy = [
        row["method"]
        for row in summary
        if spread is not None and row["kind"] != "baseline" and row["time_ratio_vs_baseline"] is not None
        and abs(1.0 - row["time_ratio_vs_baseline"]) < spread
    ]  # fmt: skip
    return {"baseline_spread": spread, "within_noise": noisy}


def versions() -> dict[str, str]:
    """Versions of Python, torch, leanbatch and the platform, for results.json."""
    import torch

    import leanbatch

    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "leanbatch": getattr(leanbatch, "__version__", "unknown"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch_threads": str(torch.get_num_threads()),
    }
    if torch.cuda.is_available():
        v["cuda"], v["gpu"] = str(torch.version.cuda), torch.cuda.get_device_name(0)
    return v


def build_results(
    runs: Sequence[RunRecord],
    config: dict[str, Any],
    data: dict[str, Any],
    *,
    tolerance: float | str = DEFAULT_TOLERANCE,
    interrupted: bool = False,
    command: str | list[str] | None = None,
    failed: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The whole results.json payload (``docs/results-json.md`` lists its keys), judged on ``config.clock``."""
    methods = config.get("methods", [])
    order = [m["label"] for m in methods]
    goal, clock = config.get("goal", "max"), config.get("clock", "work")
    summary = summarize(runs, tolerance, goal, order, clock)
    twins = {m["label"]: m.get("control") for m in methods}
    for row in summary:
        row["control"] = twins.get(row["method"])
    return {
        "schema": SCHEMA,
        "command": command,
        "interrupted": interrupted,
        "failed": list(failed),
        "config": config,
        "versions": versions(),
        "data": data,
        "tolerance": parse_tolerance(tolerance),
        "summary": summary,
        "timing": timing(summary, runs),
        "envelope": envelope(runs, order, clock, goal),
        "controls": controls(runs, methods, goal, clock),
        "runs": [r.as_dict() for r in runs],  # in the order they finished
    }
