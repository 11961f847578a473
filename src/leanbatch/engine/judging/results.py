"""From finished runs to results.json: the summary, the sections, reading a file back, merging parts.

results.json (schema ``leanbatch.bench/3``, every key in ``docs/results-json.md``) is one object:
``schema``, ``command``, ``interrupted``, ``failed`` (arms whose task raised or broke the contract),
``config`` (the task, the metric and its goal, the seeds, one entry per arm, the budgets, the
task's own settings), ``versions``, ``data`` (what the task trained on, as the task says),
``tolerance``, ``summary`` (one row per arm), ``envelope`` / ``envelope_cpu`` (every arm against the
envelope: :mod:`~leanbatch.engine.judging.envelope`), ``controls`` (against the uniform twins:
:mod:`~leanbatch.engine.judging.controls`) and ``runs`` (every run, per epoch).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from typing import Any

from leanbatch.engine.judging.controls import controls
from leanbatch.engine.judging.envelope import envelope
from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.judging.verdicts import GOALS, better, mean_of, std_of

__all__ = ["SCHEMA", "build_results", "check_payload", "merge_results", "rebuild", "summarize", "versions"]

SCHEMA = "leanbatch.bench/3"


def _time_to(run: RunRecord, target: float, goal: str) -> float | None:
    for e in run.epochs:
        if e.metric is not None and (e.metric == target or better(e.metric, target, goal)):
            return e.train_time_s
    return None


def summarize(
    runs: Sequence[RunRecord], tolerance: float, goal: str, order: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per arm (``order`` first, then first-seen) with the summary table's figures; ratios are
    against the arm labelled ``baseline`` and None without one.

    Example:
        >>> runs = [RunRecord("baseline", "baseline", 0, 90.0, [], train_time_s=2.0), RunRecord("sb", "sb", 0, 91.0, [], train_time_s=1.0)]
        >>> [(r["method"], r["metric_delta_vs_baseline"], r["time_ratio_vs_baseline"]) for r in summarize(runs, 0.2, "max")]
        [('baseline', 0.0, 1.0), ('sb', 1.0, 0.5)]
    """
    labels = [
        lab
        for lab in dict.fromkeys([*order, *(r.method for r in runs)])
        if any(r.method == lab for r in runs)
    ]
    groups = {lab: [r for r in runs if r.method == lab] for lab in labels}
    base = groups.get("baseline", [])
    base_time = mean_of([r.train_time_s for r in base]) if base else None
    base_cpu = mean_of([r.train_cpu_time_s for r in base]) if base else None
    base_metric = mean_of([r.metric for r in base]) if base else None
    target = (
        None if base_metric is None else base_metric - tolerance if goal == "max" else base_metric + tolerance
    )
    rows = []
    for lab, rs in groups.items():
        metrics, times = [r.metric for r in rs], [r.train_time_s for r in rs]
        tot = [r.totals() for r in rs]
        frac = {k: None if any(t[k] is None for t in tot) else mean_of([t[k] for t in tot]) for k in tot[0]}  # type: ignore[misc]
        ratio = mean_of(times) / base_time if base_time else None
        actual = 1.0 / ratio if ratio else None
        ideal = 1.0 / frac["work_fraction"] if frac["work_fraction"] else None
        reach = [_time_to(r, target, goal) for r in rs] if target is not None else []
        cpu = mean_of([r.train_cpu_time_s for r in rs])
        rows.append({
            "method": lab, "kind": rs[0].kind, "budget": rs[0].budget, "batch": rs[0].batch,
            "seeds": [r.seed for r in rs], "metric_mean": mean_of(metrics), "metric_std": std_of(metrics),
            "metric_delta_vs_baseline": None if base_metric is None else mean_of(metrics) - base_metric,
            "time_s_mean": mean_of(times), "time_s_std": std_of(times), "time_ratio_vs_baseline": ratio,
            "cpu_time_s_mean": cpu, "cpu_speedup": base_cpu / cpu if base_cpu and cpu else None, **frac,
            "ideal_speedup": ideal, "actual_speedup": actual,
            "achieved_of_ideal": None if actual is None or ideal is None else actual / ideal,
            "target": target,
            "time_to_target_s": mean_of([t for t in reach if t is not None]) if reach and None not in reach else None,
            "reached_target": None if target is None else sum(t is not None for t in reach),
        })  # fmt: skip
    return rows


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
    tolerance: float = 0.2,
    interrupted: bool = False,
    command: str | list[str] | None = None,
    failed: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The whole results.json payload (the module docstring lists its keys)."""
    methods = config.get("methods", [])
    order = [m["label"] for m in methods]
    goal = config.get("goal", "max")
    summary = summarize(runs, tolerance, goal, order)
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
        "tolerance": tolerance,
        "summary": summary,
        "envelope": envelope(runs, order, "wall", goal),
        "envelope_cpu": envelope(runs, order, "cpu", goal),
        "controls": controls(runs, methods, goal),
        "runs": [r.as_dict() for r in runs],  # in the order they finished
    }


# ---------------------------------------------------------------------------- reading back
def _fail(where: str, what: str) -> ValueError:
    return ValueError(f"{where}: {what}")


def _expect(value: Any, where: str, kind: type, none: bool = False) -> Any:
    """``value`` if it is a ``kind`` (``float``: any finite number; ``int``: not a bool), else ValueError."""
    if value is None and none:
        return value
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise _fail(where, f"expected a finite number, got {value}")
    else:
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is int)
    if not ok:
        name = "a number" if kind is float else f"{'an' if kind is int else 'a'} {kind.__name__}"
        raise _fail(where, f"expected {name}{' or null' if none else ''}, got {type(value).__name__}")
    return value


def check_payload(payload: Any, name: str) -> list[RunRecord]:
    """The runs of a results.json payload, after checking every key the report reads (``name``: the
    file, for the message); ``ValueError`` of one line naming the key otherwise."""
    _expect(payload, name, dict)
    if payload.get("schema") != SCHEMA:
        raise _fail(
            name, f"schema {payload.get('schema')!r}, not {SCHEMA!r}: rerun the bench with this leanbatch"
        )
    cfg = _expect(payload.get("config"), f"{name}: config", dict)
    seeds = _expect(cfg.get("seeds"), f"{name}: config.seeds", list)
    for i, s in enumerate(seeds):
        _expect(s, f"{name}: config.seeds[{i}]", int)
    for i, m in enumerate(_expect(cfg.get("methods"), f"{name}: config.methods", list)):
        where = f"{name}: config.methods[{i}]"
        _expect(m, where, dict)
        _expect(m.get("label"), f"{where}.label", str)
        _expect(m.get("control"), f"{where}.control", str, none=True)
    if cfg.get("goal") not in GOALS:
        raise _fail(f"{name}: config.goal", f"expected one of {', '.join(GOALS)}, got {cfg.get('goal')!r}")
    tol = _expect(payload.get("tolerance"), f"{name}: tolerance", float)
    if tol < 0:
        raise _fail(f"{name}: tolerance", f"expected a number >= 0, got {tol}")
    _expect(payload.get("data"), f"{name}: data", dict)
    runs = _expect(payload.get("runs"), f"{name}: runs", list)
    return [_run(r, f"{name}: runs[{i}]") for i, r in enumerate(runs)]


def _run(r: Any, where: str) -> RunRecord:
    _expect(r, where, dict)
    for key, kind in (("method", str), ("kind", str), ("seed", int), ("metric", float),
                      ("train_time_s", float), ("train_cpu_time_s", float)):  # fmt: skip
        _expect(r.get(key), f"{where}.{key}", kind)
    for key in ("budget", "batch", "scale"):
        if _expect(r.get(key, 1.0), f"{where}.{key}", float) <= 0:
            raise _fail(f"{where}.{key}", f"expected a number > 0, got {r[key]}")
    for key in ("num_samples", "num_epochs"):
        if (v := _expect(r.get(key), f"{where}.{key}", int, none=True)) is not None and v < 1:
            raise _fail(f"{where}.{key}", f"expected an int >= 1 or null, got {v}")
    for key in ("charged", "notes"):
        _expect(r.get(key, {}), f"{where}.{key}", dict)
    _expect(r.get("histograms", []), f"{where}.histograms", list)
    for i, e in enumerate(_expect(r.get("epochs"), f"{where}.epochs", list)):
        at = f"{where}.epochs[{i}]"
        _expect(e, at, dict)
        _expect(e.get("epoch"), f"{at}.epoch", int)
        _expect(e.get("metric"), f"{at}.metric", float, none=True)
        for key in ("train_time_s", "train_cpu_time_s"):
            _expect(e.get(key), f"{at}.{key}", float)
        for key in ("steps", "loaded", "forwarded", "select_forwarded", "backpropagated", "dropped"):
            _expect(e.get(key, 0), f"{at}.{key}", int)
        _expect(e.get("values", {}), f"{at}.values", dict)
    try:
        return RunRecord.from_dict(r)
    except TypeError as e:
        raise _fail(where, f"not a run ({e})") from None


def rebuild(payload: dict[str, Any], name: str = "results.json") -> dict[str, Any]:
    """``payload`` with its summary and sections recomputed from its runs (checked first); everything
    measured (runs, configuration, data, versions, command) is kept."""
    runs = check_payload(payload, name)
    new = build_results(
        runs, payload["config"], payload["data"], tolerance=payload["tolerance"],
        interrupted=bool(payload.get("interrupted", False)), command=payload.get("command"),
        failed=payload.get("failed") or [],
    )  # fmt: skip
    new["versions"] = payload.get("versions", new["versions"])
    if "merged_from" in payload:
        new["merged_from"] = payload["merged_from"]
    return new


_PART_KEYS = ("seeds", "methods", "budgets", "batch_budgets", "controls", "clock")  # what parts may differ in


def _check_parts(payloads: Sequence[dict[str, Any]], sources: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Refuse parts that are not of one study (``ValueError`` naming the files); their arms, by label."""
    for p, s in zip(payloads, sources, strict=True):
        check_payload(p, s)
    first, name = payloads[0], sources[0]
    seen: dict[tuple[str, int], str] = {}
    methods: dict[str, dict[str, Any]] = {}
    for payload, source in zip(payloads, sources, strict=True):
        if payload["data"] != first["data"]:
            raise ValueError(f"{source} and {name} trained on different data: only parts of one study merge")
        a, b = (({k: v for k, v in p["config"].items() if k not in _PART_KEYS}) for p in (first, payload))
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if differ:
            raise ValueError(
                f"{source} and {name} ran different studies ({', '.join(differ)} differ in their config): "
                "only parts of one command on other --seeds or --methods merge"
            )
        for m in payload["config"]["methods"]:
            if methods.setdefault(m["label"], m).get("settings") != m.get("settings"):
                raise ValueError(f"{source} and {name} both list {m['label']} with other settings")
        for run in payload["runs"]:
            key = (run["method"], run["seed"])
            if key in seen:
                raise ValueError(
                    f"{source} and {seen[key]} both hold {key[0]} with seed {key[1]}: merge other parts"
                )
            seen[key] = source
    return methods


def merge_results(payloads: Sequence[dict[str, Any]], sources: Sequence[str]) -> dict[str, Any]:
    """One payload from parts of one study (other ``--seeds``, other ``--methods``: one per core, machine
    or torchrun job). Their task, metric, data and task settings must agree, an arm listed in two parts
    must have the same settings, and no two parts may hold a run of the same arm and seed:
    ``ValueError`` naming the files and what differs otherwise. :func:`rebuild` then computes its tables.

    Example:
        >>> runs = [RunRecord("baseline", "baseline", s, 90.0 + s, []) for s in (0, 1)]
        >>> cfg = {"methods": [{"label": "baseline", "control": None}], "goal": "max"}
        >>> a, b = (build_results([r], {**cfg, "seeds": [r.seed]}, {}) for r in runs)
        >>> merged = rebuild(merge_results([a, b], ["a.json", "b.json"]))
        >>> merged["config"]["seeds"], merged["summary"][0]["metric_mean"], [m["seeds"] for m in merged["merged_from"]]
        ([0, 1], 90.5, [[0], [1]])
    """
    methods = _check_parts(payloads, sources)
    first = payloads[0]
    config = {**first["config"], "methods": list(methods.values())}
    config["seeds"] = sorted({s for p in payloads for s in p["config"]["seeds"]})
    for part in ("budgets", "batch_budgets"):
        config[part] = sorted({b for p in payloads for b in p["config"].get(part, [])})
    return {
        **first,
        "command": [p.get("command") for p in payloads],
        "interrupted": any(p.get("interrupted", False) for p in payloads),
        "failed": [f for p in payloads for f in p.get("failed") or []],
        "config": config,
        "runs": sorted((run for p in payloads for run in p["runs"]), key=lambda run: run["seed"]),
        "merged_from": [
            {
                "source": str(s),
                "command": p.get("command"),
                "seeds": p["config"]["seeds"],
                "methods": [m["label"] for m in p["config"]["methods"]],
                "versions": p.get("versions"),
            }
            for p, s in zip(payloads, sources, strict=True)
        ],  # fmt: skip
    }
