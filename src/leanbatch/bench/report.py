"""From finished runs to the comparison: summary rows and results.json (the tables: :mod:`~leanbatch.bench.tables`).

Column meanings of the first table (every ratio is measured against ``baseline`` in the same invocation, same
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
(the same in CPU time), ``envelope`` and ``envelope_cpu`` (every method against the envelope of
the step and batch budgets: :mod:`~leanbatch.bench.envelope`), ``controls`` (each method against
its uniform twin: :mod:`~leanbatch.bench.controls`), ``sync`` (the per-step cost of the pruning
rows' score updates, gathers included under torchrun: :mod:`~leanbatch.bench.sync`) and ``runs``
(every run, per epoch).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

from leanbatch.bench.controls import controls
from leanbatch.bench.envelope import envelope
from leanbatch.bench.frontier import equal_time, mean_of, std_of
from leanbatch.bench.outputs import (
    read_results,
    write_results,
)  # re-exported: where results.json is read and written
from leanbatch.bench.records import EpochRecord, RunResult
from leanbatch.bench.sync import sync_costs
from leanbatch.bench.tables import format_equal_time, format_table  # re-exported: the printed tables

__all__ = [
    "SCHEMA",
    "summarize",
    "format_table",
    "format_equal_time",
    "build_results",
    "write_results",
    "read_results",
    "rebuild",
    "merge_results",
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
        "batch": rs[0].batch,
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
    command: str | list[str] | None = None,
) -> dict[str, Any]:
    """The whole results.json payload: schema, config, versions, data, summary rows (each naming its
    uniform twin's row in ``control``, or null), the equal-time, envelope, controls and sync sections,
    every run."""
    methods = config.get("methods", [])
    order = [m["label"] for m in methods]
    summary = summarize(runs, tolerance, order)
    twins = {m["label"]: m.get("control") for m in methods}
    for row in summary:
        row["control"] = twins.get(row["method"])
    return {
        "schema": SCHEMA,
        "command": command,
        "interrupted": interrupted,
        "config": config,
        "versions": versions(),
        "data": data,
        "tolerance_points": tolerance,
        "summary": summary,
        "equal_time": equal_time(runs, order, "wall"),
        "equal_time_cpu": equal_time(runs, order, "cpu"),
        "envelope": envelope(runs, order, "wall"),
        "envelope_cpu": envelope(runs, order, "cpu"),
        "controls": controls(runs, methods),
        "sync": sync_costs(runs, order, int(config.get("world_size", 1))),
        "runs": [r.as_dict() for r in runs],  # in the order they ran
    }


def rebuild(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with ``summary``, the equal-time, envelope and controls sections recomputed from its runs.

    Everything measured (runs, configuration, data, versions, command) is kept as it was; an
    older schema is brought up to the current one (runs without a budget ran the full length,
    without a batch budget on full batches, and with the same LR for every step: ``lr_rule``
    ``same``); with no batch budgets the envelope is the step frontier.

    Example:
        >>> runs = [RunResult("baseline", "baseline", 0, 10, [EpochRecord(0, 1.0, 1.0, 90.0, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)])]
        >>> old = build_results(runs, {"epochs": 1, "methods": []}, {"num_train": 10}, 0.2)
        >>> new = rebuild({**old, "schema": "leanbatch.bench/1", "summary": []})
        >>> new["schema"], new["summary"][0]["acc_mean"], new["versions"] == old["versions"], new["config"]["lr_rule"]
        ('leanbatch.bench/2', 90.0, True, 'same')
    """
    config = payload["config"]
    scales = {
        m["label"]: m.get("settings", {}).get("scale_factor", m.get("sb_scale", 1.0))
        for m in config.get("methods", [])
    }
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
            batch=r.get("batch", 1.0),
            setup=r.get("setup"),
            gather_time=r.get("gather_time_s", 0.0),
            overlap_time=r.get("overlap_time_s", 0.0),
            gather_overlap_time=r.get("gather_overlap_time_s", 0.0),
            carried_share=r.get("carried_share", 0.0),
        )
        for r in payload["runs"]
    ]
    baselines = [r for r in runs if r.kind == "baseline"]
    config = {
        "lr_rule": "same",  # what every run before --lr-rule trained with
        "controls": False,
        **config,
        "budgets": sorted({r.budget for r in baselines if r.batch == 1.0}),
        "batch_budgets": sorted({r.batch for r in baselines if r.batch != 1.0}),
    }
    new = build_results(
        runs,
        config,
        payload["data"],
        payload.get("tolerance_points", 0.2),
        payload.get("interrupted", False),
        payload.get("command"),
    )
    new["versions"] = payload.get("versions", new["versions"])
    if "merged_from" in payload:
        new["merged_from"] = payload["merged_from"]
    return new


def merge_results(payloads: Sequence[dict[str, Any]], sources: Sequence[str]) -> dict[str, Any]:
    """One payload from several benches of one command on other seeds (e.g. one per core or machine).

    Their configurations (but the seeds) and data must agree, and no two may hold a run of the same
    method and seed: otherwise ``ValueError`` naming the files and what differs. The result holds
    every run, the union of the seeds, the list of the commands, and ``merged_from`` (each source,
    its command, seeds and versions), the runs ordered by seed as one bench of every seed orders them;
    :func:`rebuild` then computes its tables. Each seed's runs
    come from one invocation, so its time ratios are from one machine's run.

    Example:
        >>> runs = [RunResult("baseline", "baseline", s, 10, [EpochRecord(0, 1.0, 1.0, 90.0 + s, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)]) for s in (0, 1)]
        >>> a, b = (build_results([r], {"epochs": 1, "seeds": [r.seed], "methods": []}, {"num_train": 10}, 0.2) for r in runs)
        >>> merged = rebuild(merge_results([a, b], ["a.json", "b.json"]))
        >>> merged["config"]["seeds"], merged["summary"][0]["acc_mean"], [m["seeds"] for m in merged["merged_from"]]
        ([0, 1], 90.5, [[0], [1]])
    """
    first, name = payloads[0], sources[0]
    seen: dict[tuple[str, int], str] = {}
    for payload, source in zip(payloads, sources, strict=True):
        if payload["data"] != first["data"]:
            raise ValueError(f"{source} and {name} trained on different data: only one bench's seeds merge")
        a, b = _bench_of(first), _bench_of(payload)
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if differ:
            raise ValueError(
                f"{source} and {name} ran different benches ({', '.join(differ)} differ in their config): "
                "only runs of one command on other --seeds merge"
            )
        for run in payload["runs"]:
            key = (run["method"], run["seed"])
            if key in seen:
                raise ValueError(
                    f"{source} and {seen[key]} both hold {key[0]} with seed {key[1]}: merge other seeds"
                )
            seen[key] = source
    return {
        **first,
        "command": [p.get("command") for p in payloads],
        "interrupted": any(p.get("interrupted", False) for p in payloads),
        "config": {**first["config"], "seeds": sorted({s for p in payloads for s in p["config"]["seeds"]})},
        # ordered by seed, as one bench of every seed orders its runs (stable within a seed)
        "runs": sorted((run for p in payloads for run in p["runs"]), key=lambda run: run["seed"]),
        "merged_from": [
            {
                "source": str(s),
                "command": p.get("command"),
                "seeds": p["config"]["seeds"],
                "versions": p.get("versions"),
            }
            for p, s in zip(payloads, sources, strict=True)
        ],
    }


def _bench_of(payload: dict[str, Any]) -> dict[str, Any]:
    """The configuration that makes a bench the same bench: all but the seeds and the report's clock."""
    return {k: v for k, v in payload["config"].items() if k not in ("seeds", "clock")}
