"""One-off migration of the stored study results from ``leanbatch.bench/2`` to ``leanbatch.bench/3``.

Provenance, not part of the package: nothing under ``src/`` imports it. The studies under
``benchmarks/results/*/results.json`` were measured by the bench before the engine rebuild
(issue 23) and written as schema 2; ``leanbatch report`` reads schema 3 only. This script was run
once over them (``python benchmarks/migrate_results.py``) and its output committed; the schema-2
files stay in git history. Run again, it leaves a schema-3 file as it is.

It keeps every measurement as it was (the same floats: accuracies, times, seeds, counts) and
moves it to the key schema 3 gives it (``docs/results-json.md``):

- ``tolerance_points`` -> ``tolerance`` (percentage points of accuracy: the metric's own units).
- ``config``: the training options -> ``config.task_config`` with ``preset`` (``"quick"`` for the
  old ``quick: true``) and ``dropped_last_batch``; ``task`` ``images``, ``metric`` ``accuracy``,
  ``goal`` ``max``; ``seeds``, ``interleave``, ``clock``, ``controls`` (``false`` where absent:
  ``--controls`` did not exist), ``world_size`` (1 where absent: torchrun support came later),
  ``budgets``/``batch_budgets`` from the baseline arms, as schema 3 computes them.
- ``config.methods[]``: ``label``, ``kind``, ``budget``, ``batch``, ``control`` kept (``batch`` 1
  and ``control`` null where absent); ``settings`` kept where schema 2 wrote them, else made from
  the old flat keys by the names the schema-2 registry gave them (``sb_keep`` is ``keep`` of
  ``sb``, ``sel_keep`` ``keep`` of ``obs``...). Only the keys the file recorded: a setting the old
  file did not record (its then default) is not filled in. The labels are the ones measured, old
  spellings included (``infobatch[ib_max_weight=1]``, ``obs[sel_keep=0.7]``).
- ``runs[]``: ``final_test_acc`` -> ``metric``; ``load_avg_start_end`` -> ``load_avg``;
  ``loss_histograms`` -> ``histograms`` (the same fields); ``eval_time_s`` -> ``untimed_s``
  (schema 2's clock excluded the evaluation only); ``num_samples`` = ``data.num_train`` and
  ``num_epochs`` = ``config.epochs`` (schema 2's full run: under torchrun its counts are summed
  over the processes, so ``num_samples`` is the whole set there too and the fractions hold);
  ``counts`` = the sums of the epochs' counts (schema 2 logged every step); ``setup`` (RHO-LOSS's
  holdout model) -> ``charged`` (``forwarded``, ``backpropagated``, ``cost``) with ``holdout``,
  ``setup_time_s`` and ``setup_cpu_time_s`` (already inside the run's times) in ``notes``; the
  torchrun measures ``gather_time_s``, ``overlap_time_s``, ``gather_overlap_time_s``,
  ``carried_share`` -> ``notes``. ``scale``: for a run with selection passes, the cost schema 2
  charged one (``scale_factor``, else the recorded ``sb_scale``, squared), else 1.
- ``runs[].epochs[]``: ``test_acc`` -> ``metric``, ``train_time``/``train_cpu_time`` ->
  ``train_time_s``/``train_cpu_time_s``; the counts, ``threshold`` and ``pruning`` kept
  (``dropped`` 0 where absent: those files predate it, and none of their batch sizes left a
  last batch of one); ``test_loss``, ``train_loss``, ``lr`` and, where recorded, ``update_time``
  and ``gathered_bytes`` -> ``values``.
- ``merged_from[]`` gains ``methods`` (schema 2 merged parts of one command on other seeds only, so
  every part ran every arm); ``recomputed_from`` is kept.
- ``summary``, ``envelope``, ``envelope_cpu`` and ``controls`` are recomputed by the engine's own
  :func:`leanbatch.engine.judging.results.rebuild`, as ``leanbatch report`` does; schema 2's derived
  sections without a schema-3 home (``equal_time``, ``equal_time_cpu``: the step frontier alone;
  ``sync``: from the runs' torchrun measures, kept in ``notes`` and ``values``) are dropped.

Before writing, it checks each run against its schema-2 record (the same metric, times, seeds,
curves and work fractions) and prints where a recomputed summary, envelope or controls figure
differs from the one schema 2 stored (schema 2 verdicts ``above``/``below``/``no frontier`` read
``better``/``worse``/``no envelope``).

Usage: ``python benchmarks/migrate_results.py [FOLDER]`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.outputs import write_results
from leanbatch.engine.judging.parts import rebuild
from leanbatch.engine.judging.results import SCHEMA

OLD = "leanbatch.bench/2"
_INFOBATCH = {"prune_ratio": "prune_ratio", "delta": "delta", "ib_target": "target",
              "ib_warmup": "warmup_epochs", "ib_refresh": "refresh_every", "ib_max_weight": "max_weight"}  # fmt: skip
_SB = {
    "sb_keep": "keep",
    "sb_start": "start",
    "sb_end": "end",
    "sb_scale": "scale_factor",
    "sb_interrupt": "interrupt",
}
_WINDOW = {"sel_keep": "keep", "sel_start": "start", "sel_end": "end", "sel_interrupt": "interrupt"}
_BANDIT = {"prune_fraction": "prune_ratio", "epsilon": "epsilon", "score_ema": "ema"}
# each kind's settings under the flat keys schema 2 (and before) wrote, as its registry named them
_ALIASES: dict[str, dict[str, str]] = {
    "random": _INFOBATCH,
    "infobatch": _INFOBATCH,
    "sb": _SB,
    "infobatch+sb": {**_INFOBATCH, **_SB, "stack_scores": "stack_scores"},
    "rs2": {"prune_fraction": "prune_ratio"},
    "epsilon-greedy": _BANDIT,
    "ucb": {**_BANDIT, "ucb_c": "c"},
    "seta": {
        "seta_prune": "prune_ratio",
        "seta_groups": "num_groups",
        "seta_window": "window_scale",
        "delta": "delta",
    },
    "obs": {**_WINDOW, "obs_pressure": "pressure", "obs_final_pressure": "final_pressure"},
    "sb-proxy": {**_WINDOW, "proxy_width": "width", "proxy_keep": "train_keep", "proxy_every": "train_every"},
}
_OFF_IS_ZERO = ("max_weight", "final_pressure")  # an option off was written 0 before it was null
_TRAINING = ("epochs", "batch_size", "lr", "momentum", "nesterov", "weight_decay", "warmup", "label_smoothing",
             "device", "model", "widths", "channels_last", "augment", "eval_batch_size", "flush_denormal",
             "histogram_epochs")  # fmt: skip
_VALUES = ("test_loss", "train_loss", "lr", "update_time", "gathered_bytes")
_COUNTS = ("steps", "loaded", "forwarded", "select_forwarded", "backpropagated", "dropped")
_RUN_NOTES = ("gather_time_s", "overlap_time_s", "gather_overlap_time_s", "carried_share")
_VERDICTS = {"above": "better", "below": "worse", "no frontier": "no envelope"}


def _settings(entry: dict[str, Any]) -> dict[str, Any]:
    """An arm's settings by the library's names: schema 2's own, or those its flat keys recorded."""
    if "settings" in entry:
        return dict(entry["settings"])
    if entry["kind"] == "baseline":
        return {"budget": entry.get("budget", 1.0), "batch": entry.get("batch", 1.0)}
    aliases = _ALIASES.get(entry["kind"])
    if aliases is None:
        raise ValueError(
            f"{entry['label']}: no settings and no old spelling known for kind {entry['kind']!r}"
        )
    out = {name: entry[key] for key, name in aliases.items() if key in entry}
    for name in _OFF_IS_ZERO:
        if out.get(name) == 0:
            out[name] = None
    return out


def _method(entry: dict[str, Any]) -> dict[str, Any]:
    return {"label": entry["label"], "kind": entry["kind"], "settings": _settings(entry),
            "budget": entry.get("budget", 1.0), "batch": entry.get("batch", 1.0),
            "control": entry.get("control")}  # fmt: skip


def _config(old: dict[str, Any], num_train: int) -> dict[str, Any]:
    c = old["config"]
    task = {k: c[k] for k in _TRAINING}
    task["lr_rule"] = c.get("lr_rule", "same")  # every run before --lr-rule trained with the same LR
    task["preset"] = "quick" if c.get("quick") else c.get("preset")
    if "dropped_last_batch" in c:
        task["dropped_last_batch"] = c["dropped_last_batch"]
    elif num_train % c["batch_size"] == 1:
        raise ValueError("a last batch of one, and no record of whether it was left out")
    else:
        task["dropped_last_batch"] = False
    methods = [_method(m) for m in c["methods"]]
    base = [m for m in methods if m["kind"] == "baseline"]
    return {
        "task": "images", "task_config": task, "metric": "accuracy", "goal": "max",
        "seeds": list(c["seeds"]), "methods": methods,
        "budgets": sorted({m["budget"] for m in base if m["batch"] == 1.0}),
        "batch_budgets": sorted({m["batch"] for m in base if m["batch"] != 1.0}),
        "controls": bool(c.get("controls", False)), "interleave": c["interleave"], "clock": c["clock"],
        "world_size": int(c.get("world_size", 1)),
    }  # fmt: skip


def _epoch(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "epoch": e["epoch"], "metric": e["test_acc"],
        "train_time_s": e["train_time"], "train_cpu_time_s": e["train_cpu_time"],
        **{k: e.get(k, 0) for k in _COUNTS},
        "threshold": e.get("threshold"), "pruning": e.get("pruning"),
        "values": {k: e[k] for k in _VALUES if k in e},
    }  # fmt: skip


def _scale(entry: dict[str, Any], selects: bool) -> float:
    """A selection pass's cost in forwards, as schema 2 charged it (1 for a run with none)."""
    if not selects:
        return 1.0
    factor = entry.get("settings", {}).get("scale_factor", entry.get("sb_scale", 1.0))
    return float(factor) ** 2


def _run(r: dict[str, Any], entry: dict[str, Any], num_train: int, epochs: int) -> dict[str, Any]:
    curve = [_epoch(e) for e in r["epochs"]]
    counts = {k: sum(e[k] for e in curve) for k in _COUNTS}
    setup = r.get("setup") or {}
    notes = {k: r[k] for k in _RUN_NOTES if k in r}
    if setup:
        notes.update(
            holdout=setup["holdout"], setup_time_s=setup["time_s"], setup_cpu_time_s=setup["cpu_time_s"]
        )
    return {
        "method": r["method"], "kind": r["kind"], "seed": r["seed"], "metric": r["final_test_acc"],
        "budget": r.get("budget", 1.0), "batch": r.get("batch", 1.0),
        "train_time_s": r["train_time_s"], "train_cpu_time_s": r["train_cpu_time_s"],
        "untimed_s": r["eval_time_s"], "num_samples": num_train, "num_epochs": epochs,
        "scale": _scale(entry, counts["select_forwarded"] > 0),
        "charged": {k: setup[k] for k in ("forwarded", "backpropagated", "cost")} if setup else {},
        "counts": counts, "histograms": r.get("loss_histograms", []),
        "load_avg": r.get("load_avg_start_end", []), "notes": notes, "epochs": curve,
    }  # fmt: skip


def migrate(old: dict[str, Any], name: str) -> dict[str, Any]:
    """The schema-3 payload of a schema-2 one (the module docstring says what goes where)."""
    if old.get("schema") != OLD:
        raise ValueError(f"{name}: schema {old.get('schema')!r}, not {OLD!r}")
    num_train, epochs = int(old["data"]["num_train"]), int(old["config"]["epochs"])
    entries = {m["label"]: m for m in old["config"]["methods"]}
    config = _config(old, num_train)
    payload: dict[str, Any] = {
        "schema": SCHEMA, "command": old.get("command"), "interrupted": bool(old.get("interrupted", False)),
        "failed": [], "config": config, "versions": old["versions"], "data": old["data"],
        "tolerance": old.get("tolerance_points", 0.2),
        "runs": [_run(r, entries[r["method"]], num_train, epochs) for r in old["runs"]],
    }  # fmt: skip
    if "merged_from" in old:
        labels = [m["label"] for m in config["methods"]]
        payload["merged_from"] = [{**part, "methods": labels} for part in old["merged_from"]]
    new = rebuild(payload, name)
    if "recomputed_from" in old:
        new["recomputed_from"] = old["recomputed_from"]
    return new


# ---------------------------------------------------------------------------- checking
def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def check_runs(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless every run holds what its schema-2 record held."""
    assert len(old["runs"]) == len(new["runs"])
    pairs = (("method", "method"), ("kind", "kind"), ("seed", "seed"), ("final_test_acc", "metric"),
             ("train_time_s", "train_time_s"), ("train_cpu_time_s", "train_cpu_time_s"), ("steps", "steps"),
             ("budget", "budget"), ("batch", "batch"))  # fmt: skip
    fractions = ("loaded_fraction", "forward_fraction", "backward_fraction", "work_fraction")
    for i, (a, b) in enumerate(zip(old["runs"], new["runs"], strict=True)):
        for ka, kb in pairs:
            if a.get(ka, 1.0) != b[kb]:
                raise ValueError(f"runs[{i}].{kb}: {a.get(ka)} became {b[kb]}")
        for k in fractions:
            if not _same(a[k], b[k]):
                raise ValueError(f"runs[{i}] {a['method']} seed {a['seed']}: {k} {a[k]} became {b[k]}")
        curves = [(e["test_acc"], e["train_time"], e["train_cpu_time"]) for e in a["epochs"]]
        if curves != [(e["metric"], e["train_time_s"], e["train_cpu_time_s"]) for e in b["epochs"]]:
            raise ValueError(f"runs[{i}] {a['method']} seed {a['seed']}: its curve changed")


def _rows(section: dict[str, Any], keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {r["method"]: {k: r.get(v) for k, v in keys.items()} for r in section["rows"]}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Where the recomputed summary, envelope and controls differ from schema 2's (verdicts mapped)."""
    out = []
    summary_keys = {"metric_mean": "acc_mean", "metric_std": "acc_std", "time_s_mean": "train_time_s_mean",
                    "work_fraction": "work_fraction", "time_to_target_s": "time_to_target_s"}  # fmt: skip
    was = {r["method"]: r for r in old["summary"]}
    for row in new["summary"]:
        for k, ko in summary_keys.items():
            if not _same(row[k], was[row["method"]][ko]):
                out.append(f"summary {row['method']} {k}: {was[row['method']][ko]} -> {row[k]}")
    # with no batch budgets, schema 2's envelope (absent before them) is its step frontier: equal_time
    sections = [("envelope", old.get("envelope") or old["equal_time"]), ("controls", old.get("controls"))]
    for name, section in sections:
        if section is None:
            continue
        before = _rows(section, {"diff_mean": "diff_mean", "verdict": "verdict"})
        for method, row in _rows(new[name], {"diff_mean": "diff_mean", "verdict": "verdict"}).items():
            prior = before.get(method)
            if prior is None:
                out.append(f"{name} {method}: a new row ({row['verdict']})")
                continue
            prior["verdict"] = _VERDICTS.get(prior["verdict"], prior["verdict"])
            for k in ("diff_mean", "verdict"):
                if not _same(prior[k], row[k]):
                    out.append(f"{name} {method} {k}: {prior[k]} -> {row[k]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Migrate stored results.json from schema 2 to 3, in place.")
    parser.add_argument("folder", nargs="?", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    for path in sorted(Path(args.folder).glob("*/results.json")):
        old = json.loads(path.read_text())
        if old.get("schema") == SCHEMA:
            print(f"{path}: already {SCHEMA}, left as it is")
            continue
        new = migrate(old, str(path))
        check_runs(old, new)
        notes = differences(old, new)
        write_results(path, new)
        print(f"{path}: {len(new['runs'])} runs -> {SCHEMA}" + "".join(f"\n  differs: {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
