"""From finished runs to the comparison: summary rows, the printed table and results.json.

Column meanings (every ratio is measured against ``baseline`` in the same invocation, same
machine, same seeds):

- ``acc %``: final test accuracy, mean ± sample standard deviation over seeds.
- ``time s``: training wall-clock per run (evaluation excluded), mean over seeds.
- ``vs base``: mean time / baseline's mean time (``-35%`` = 35% less wall-clock).
- ``fwd`` / ``bwd``: samples forwarded / backpropagated, as a fraction of ``epochs x N``
  (``fwd`` counts Selective Backprop's selection passes too, at any resolution).
- ``ideal x``: ``1 / work``, where ``work = (fwd_full + scale^2 * fwd_select + 2 * bwd) / 3``
  is the FLOP-weighted fraction of the baseline's compute (a backward pass costs about two
  forward passes; a selection pass on a copy downsampled by ``scale`` costs ``scale^2`` of one).
- ``actual x``: baseline time / method time. ``achieved``: actual / ideal.
- ``cpu x``: the same ratio in CPU time of the process (all threads); on a machine shared with other
  work it is steadier than wall-clock, which is what the other columns use.
- ``t->target``: mean training time until the test accuracy first reached the baseline's mean final
  accuracy minus the tolerance (``-`` when some seed never did).

The second table compares every method with the baseline trained shorter, at equal time
(:mod:`~leanbatch.bench.frontier` has the rule): ``frontier %`` is the accuracy the budget runs
reach at the method's own training time (per seed, interpolated, never extrapolated), ``vs
frontier`` the paired difference (mean ± std over seeds, in points), ``95% CI`` its confidence
interval, and ``verdict`` above / on (within noise) / below / out of range.

results.json (schema ``leanbatch.bench/2``; ``docs/results-json.md`` describes every key):
``schema``, ``command``, ``interrupted``, ``config`` (every option, ``budgets`` included),
``versions``, ``data``, ``tolerance_points``, ``summary`` (the first table's rows, with ``budget``),
``equal_time`` (``clock``, ``rule``, ``confidence``, ``budgets``, ``frontier``: one point per
budget, and ``rows``: one comparison per method, with ``per_seed`` details), ``equal_time_cpu``
(the same in CPU time) and ``runs`` (every run, per epoch).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Collection, Sequence
from typing import Any

from leanbatch.bench.frontier import equal_time, mean_of, std_of
from leanbatch.bench.outputs import (
    read_results,
    write_results,
)  # re-exported: where results.json is read and written
from leanbatch.bench.records import EpochRecord, RunResult

__all__ = [
    "SCHEMA",
    "summarize",
    "format_table",
    "format_equal_time",
    "build_results",
    "write_results",
    "read_results",
    "rebuild",
    "versions",
]

SCHEMA = "leanbatch.bench/2"


def _time_to(run: RunResult, target: float) -> float | None:
    for e in run.epochs:
        if e.test_acc >= target:
            return e.train_time
    return None


def summarize(
    runs: Sequence[RunResult], tolerance: float = 0.2, order: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One row per method label (``order`` first, then first-seen) with the table's figures as plain values.

    Ratios need a ``baseline`` among the runs; without one they are None.
    """
    labels: list[str] = list(order or [])
    for r in runs:
        if r.label not in labels:
            labels.append(r.label)
    labels = [lab for lab in labels if any(r.label == lab for r in runs)]
    by_label = {lab: [r for r in runs if r.label == lab] for lab in labels}
    base = by_label.get("baseline", [])
    return [_summary_row(lab, by_label[lab], base, tolerance) for lab in labels]


def _summary_row(label: str, rs: list[RunResult], base: list[RunResult], tolerance: float) -> dict[str, Any]:
    """The summary row of the runs ``rs`` of ``label``, against the ``base`` runs (ratios None without)."""
    base_time = mean_of([r.train_time for r in base]) if base else None
    base_cpu = mean_of([r.train_cpu_time for r in base]) if base else None
    base_acc = mean_of([r.final_acc for r in base]) if base else None
    target = None if base_acc is None else base_acc - tolerance
    accs = [r.final_acc for r in rs]
    times = [r.train_time for r in rs]
    tot = [r.totals() for r in rs]
    work = mean_of([t["work_fraction"] for t in tot])
    t_mean = mean_of(times)
    ratio = None if not base_time else t_mean / base_time
    actual = None if not ratio else 1.0 / ratio
    ideal = 1.0 / work if work > 0 else None
    reach = [_time_to(r, target) for r in rs] if target is not None else []
    return {
        "method": label,
        "kind": rs[0].kind,
        "budget": rs[0].budget,
        "seeds": [r.seed for r in rs],
        "acc_mean": mean_of(accs),
        "acc_std": std_of(accs),
        "acc_delta_vs_baseline": None if base_acc is None else mean_of(accs) - base_acc,
        "train_time_s_mean": t_mean,
        "train_time_s_std": std_of(times),
        "time_ratio_vs_baseline": ratio,
        "train_cpu_time_s_mean": mean_of([r.train_cpu_time for r in rs]),
        "cpu_speedup": None if not base_cpu else base_cpu / mean_of([r.train_cpu_time for r in rs]),
        "loaded_fraction": mean_of([t["loaded_fraction"] for t in tot]),
        "forward_fraction": mean_of([t["forward_fraction"] for t in tot]),
        "backward_fraction": mean_of([t["backward_fraction"] for t in tot]),
        "work_fraction": work,
        "ideal_speedup": ideal,
        "actual_speedup": actual,
        "achieved_of_ideal": None if (actual is None or ideal is None) else actual / ideal,
        "target_acc": target,
        "time_to_target_s": (
            mean_of([t for t in reach if t is not None])
            if reach and all(t is not None for t in reach)
            else None
        ),
        "reached_target": sum(t is not None for t in reach) if target is not None else None,
    }


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) + suffix


def format_table(rows: Sequence[dict[str, Any]], tolerance: float = 0.2) -> str:
    """A Markdown table (readable in a terminal, pastable into a README)."""
    head = [
        "method", "acc %", "time s", "vs base", "fwd", "bwd", "ideal x", "actual x", "achieved", "cpu x", "t->target s"
    ]  # fmt: skip
    lines = [head]
    for r in rows:
        ratio = r["time_ratio_vs_baseline"]
        reach = r["time_to_target_s"]
        if reach is None and r["reached_target"] is not None:
            reach_s = f"- ({r['reached_target']}/{len(r['seeds'])})"
        else:
            reach_s = _fmt(reach, ".1f")
        lines.append(
            [
                r["method"],
                f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f}",
                _fmt(r["train_time_s_mean"], ".1f"),
                "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%",
                _fmt(r["forward_fraction"], ".2f"),
                _fmt(r["backward_fraction"], ".2f"),
                _fmt(r["ideal_speedup"], ".2f"),
                _fmt(r["actual_speedup"], ".2f"),
                _fmt(r["achieved_of_ideal"], ".2f"),
                _fmt(r["cpu_speedup"], ".2f"),
                reach_s,
            ]
        )
    out = _markdown(lines)
    seeds = rows[0]["seeds"] if rows else []
    out.append(
        f"\nmean over seeds {seeds}; t->target: training time to reach baseline accuracy - {tolerance:g} points"
    )
    return "\n".join(out)


def _markdown(lines: list[list[str]], left: Collection[int] = (0,)) -> list[str]:
    """Rows of cells as an aligned Markdown table: the ``left`` columns flush left, the others right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        cells = [
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if n == 0:
            rule = [("-" * (w + 2)) if i in left else ("-" * (w + 1) + ":") for i, w in enumerate(widths)]
            out.append("|" + "|".join(rule) + "|")
    return out


def _verdict_text(row: dict[str, Any]) -> str:
    verdict = str(row["verdict"])
    n = len(row["seeds"])
    if verdict == "out of range":
        parts = []
        if row["faster"]:
            parts.append(f"faster than the shortest budget in {row['faster']}/{n} seeds")
        if row["slower"]:
            parts.append(f"slower than the longest budget in {row['slower']}/{n} seeds")
        return f"out of range ({', '.join(parts)})"
    if verdict == "on":
        return "on (within noise)"
    if verdict == "undecided":
        return "undecided (1 seed: no spread)"
    return verdict


def format_equal_time(section: dict[str, Any]) -> str:
    """The equal-time table: the frontier's points, then every method against the frontier.

    Example:
        >>> section = {"frontier": [], "rows": [], "budgets": []}
        >>> format_equal_time(section)
        'equal time: no baseline budget runs, no frontier (add --budgets)'
    """
    if len(section["frontier"]) < 2:
        return "equal time: no baseline budget runs, no frontier (add --budgets)"
    time_head = "time s" if section.get("clock", "wall") == "wall" else "cpu s"
    head = ["method", "budget", "acc %", time_head, "frontier %", "vs frontier", "95% CI", "verdict"]
    lines = [head]
    for p in section["frontier"]:
        lines.append(
            [
                p["method"],
                f"{p['budget']:g}",
                f"{p['acc_mean']:.2f} ± {p['acc_std']:.2f}",
                _fmt(p["train_time_s_mean"], ".1f"),
                "",
                "",
                "",
                "frontier",
            ]
        )
    for r in section["rows"]:
        diff = "-"
        if r["diff_mean"] is not None:
            diff = f"{r['diff_mean']:+.2f}" + ("" if r["diff_std"] is None else f" ± {r['diff_std']:.2f}")
        ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
        acc = [s["acc"] for s in r["per_seed"]]
        lines.append(
            [
                r["method"],
                "",
                f"{r['acc_mean']:.2f} ± {std_of(acc):.2f}",
                _fmt(r["train_time_s_mean"], ".1f"),
                _fmt(r["frontier_acc_mean"], ".2f"),
                diff,
                ci,
                _verdict_text(r),
            ]
        )
    out = _markdown(lines, left=(0, len(head) - 1))
    out.append(
        f"\nequal time ({section.get('clock', 'wall')} clock): each method against the baseline trained for "
        "a fraction (budget) of its steps, at the method's own training time, paired by seed; vs frontier = mean ± std of the per-seed "
        "differences (points), never extrapolated; above/below only when the 95% CI excludes 0 and "
        "|mean| > std, else on (within noise)"
    )
    return "\n".join(out)


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
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def build_results(
    runs: Sequence[RunResult],
    config: dict[str, Any],
    data: dict[str, Any],
    tolerance: float,
    interrupted: bool = False,
    command: str | None = None,
) -> dict[str, Any]:
    """The whole results.json payload: schema, config, versions, data, summary rows, every run."""
    return {
        "schema": SCHEMA,
        "command": command,
        "interrupted": interrupted,
        "config": config,
        "versions": versions(),
        "data": data,
        "tolerance_points": tolerance,
        "summary": summarize(runs, tolerance, [m["label"] for m in config.get("methods", [])]),
        "equal_time": equal_time(runs, [m["label"] for m in config.get("methods", [])], "wall"),
        "equal_time_cpu": equal_time(runs, [m["label"] for m in config.get("methods", [])], "cpu"),
        "runs": [r.as_dict() for r in runs],  # in the order they ran
    }


def rebuild(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with ``summary`` and the equal-time sections recomputed from its runs.

    Everything measured (runs, configuration, data, versions, command) is kept as it was; an
    older schema is brought up to the current one (runs without a budget ran the full length).

    Example:
        >>> runs = [RunResult("baseline", "baseline", 0, 10, [EpochRecord(0, 1.0, 1.0, 90.0, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)])]
        >>> old = build_results(runs, {"epochs": 1, "methods": []}, {"num_train": 10}, 0.2)
        >>> new = rebuild({**old, "schema": "leanbatch.bench/1", "summary": []})
        >>> new["schema"], new["summary"][0]["acc_mean"], new["versions"] == old["versions"]
        ('leanbatch.bench/2', 90.0, True)
    """
    config = payload["config"]
    scales = {m["label"]: m.get("sb_scale", 1.0) for m in config.get("methods", [])}
    fields = set(EpochRecord.__dataclass_fields__)
    runs = [
        RunResult(
            label=r["method"],
            kind=r["kind"],
            seed=r["seed"],
            num_train=int(payload["data"]["num_train"]),
            epochs=[EpochRecord(**{k: v for k, v in e.items() if k in fields}) for e in r["epochs"]],
            histograms=r.get("loss_histograms", []),
            eval_time=r.get("eval_time_s", 0.0),
            sb_scale=scales.get(r["method"], 1.0),
            load_avg=r.get("load_avg_start_end", []),
            budget=r.get("budget", 1.0),
            full_epochs=config.get("epochs"),
        )
        for r in payload["runs"]
    ]
    config = {**config, "budgets": sorted({r.budget for r in runs if r.kind == "baseline"})}
    new = build_results(
        runs,
        config,
        payload["data"],
        payload.get("tolerance_points", 0.2),
        payload.get("interrupted", False),
        payload.get("command"),
    )
    new["versions"] = payload.get("versions", new["versions"])
    return new
