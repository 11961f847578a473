"""A results.json read back (:func:`check_payload`), judged again (:func:`rebuild`), parts of one study
merged (:func:`merge_results`): what ``leanbatch report`` does, with no training.

A stored study is judged again from its runs, on any clock (``leanbatch report --clock work``): every
run holds its counts, so its work needs no new measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from leanbatch.engine.judging.records import CLOCKS, RunRecord
from leanbatch.engine.judging.results import SCHEMA, build_results, parse_tolerance
from leanbatch.engine.judging.verdicts import GOALS

__all__ = ["check_payload", "merge_results", "rebuild"]


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
    if cfg.get("clock", "work") not in CLOCKS:
        raise _fail(f"{name}: config.clock", f"expected one of {', '.join(CLOCKS)}, got {cfg.get('clock')!r}")
    if cfg.get("goal") not in GOALS:
        raise _fail(f"{name}: config.goal", f"expected one of {', '.join(GOALS)}, got {cfg.get('goal')!r}")
    parse_tolerance(payload.get("tolerance"), f"{name}: tolerance")
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


def rebuild(payload: dict[str, Any], name: str = "results.json", clock: str | None = None) -> dict[str, Any]:
    """``payload`` with its summary and sections recomputed from its runs (checked first), on ``clock``
    (None: the one its config names); everything measured (runs, configuration, data, versions,
    command) is kept.

    Example:
        >>> run = RunRecord("baseline", "baseline", 0, 90.0, [], train_time_s=3.0)
        >>> payload = build_results([run], {"methods": [], "goal": "max", "seeds": [0], "clock": "wall"}, {})
        >>> rebuild(payload, clock="work")["config"]["clock"], payload["summary"][0]["cost_mean"]
        ('work', 3.0)
    """
    runs = check_payload(payload, name)
    config = payload["config"] if clock is None else {**payload["config"], "clock": clock}
    new = build_results(
        runs, config, payload["data"], tolerance=payload["tolerance"],
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
    first, name = payloads[0], sources[0]
    seen: dict[tuple[str, int], str] = {}
    methods: dict[str, dict[str, Any]] = {}
    for payload, source in zip(payloads, sources, strict=True):
        check_payload(payload, source)  # the first first: the others are held to it
        if (mine := payload["config"].get("task_id")) != (theirs := first["config"].get("task_id")):
            raise ValueError(
                f"{source} and {name} trained different tasks ({_task(mine)}; {_task(theirs)}): only parts of "
                "one study merge"
            )
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


def _task(identity: Any) -> str:
    if not isinstance(identity, dict):
        return "a task not recorded (an older leanbatch)"
    sha = identity.get("sha256")
    return (
        f"{identity.get('module')}:{identity.get('function')}, file {'unknown' if sha is None else sha[:12]}"
    )


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
