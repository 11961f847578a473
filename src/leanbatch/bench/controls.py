"""Controls: each choosing method beside its uniform twin, and what the choosing buys.

A selection rule is worth its name only if it beats the same budget spent at random. Every kind
with a :class:`~leanbatch.bench.registry.Twin` has a *twin row*: the twin's kind with the
settings the two share copied from the method's row and the twin's ``fixed`` settings on top.
``leanbatch bench --controls`` adds, right after each row that has one, its twin labelled
``<label>~<name>``:

========================  =========================================================================
method                    twin row
========================  =========================================================================
``infobatch``             ``infobatch~random``: ``random`` (same prune_ratio, delta, ... drawn uniformly)
``sb``, ``sb-proxy``,     ``sb~uniform``...: ``uniform``, ``SelectiveBackprop(rule="uniform")`` with
``rho-loss``              the same keep and window, no selection pass (nor proxy, nor holdout model)
``infobatch+sb``          ``infobatch+sb~uniform``: ``infobatch+uniform`` (its pruning, then uniform)
``obs``, ``obs-epoch``    ``obs~uniform``...: the same kind at ``pressure=1`` (the loss-rank draw uniform)
========================  =========================================================================

A row whose twin is already among the rows (the same kind and settings: ``random`` beside
``infobatch`` with the same settings) is reused rather than run twice; a row that is its own twin
(``obs[pressure=1]``) gets none. The ``controls`` section of results.json pairs each method
with its twin by seed: the difference in final accuracy (method minus twin, each at its own
time), its 95% t interval and the verdict of :func:`~leanbatch.bench.frontier.interval`.

Example:
    >>> from leanbatch.bench.methods import parse_methods
    >>> [(r.label, r.kind, r.control) for r in with_controls(parse_methods("baseline,obs[keep=0.7]"))]
    [('baseline', 'baseline', None), ('obs[keep=0.7]', 'obs', 'obs[keep=0.7]~uniform'), ('obs[keep=0.7]~uniform', 'obs', None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from leanbatch.bench.frontier import CONFIDENCE, interval, mean_of
from leanbatch.bench.methods import MethodError, MethodRow, make_row
from leanbatch.bench.registry import REGISTRY

if TYPE_CHECKING:
    from leanbatch.bench.records import RunResult

__all__ = ["RULE", "controls", "twin_row", "with_controls"]

RULE = (
    "diff = method final accuracy - its uniform twin's, same seed, each at its own training time; "
    "above/below when the 95% t interval of the mean diff excludes 0 and |mean diff| > std of the diffs; "
    "otherwise on (within noise)"
)


def twin_row(row: MethodRow) -> MethodRow | None:
    """The uniform twin of ``row`` (see the module docstring); None when its kind has none or the row
    is its own twin.

    Example:
        >>> from leanbatch.bench.methods import parse_methods
        >>> twin = twin_row(parse_methods("sb[keep=0.7]")[0])
        >>> twin.label, twin.kind, twin.settings["keep"], twin.probe_selector().rule
        ('sb[keep=0.7]~uniform', 'uniform', 0.7, 'uniform')
        >>> twin_row(parse_methods("obs[pressure=1]")[0]) is None
        True
    """
    spec = row.method.twin
    if spec is None:
        return None
    kind = REGISTRY[spec.kind]
    settings = {s.name: row.settings[s.name] for s in kind.settings if s.name in row.settings}
    settings.update(dict(spec.fixed))
    if spec.kind == row.kind and settings == dict(row.settings):
        return None
    twin = make_row(spec.kind, f"{row.label}~{spec.name}", **settings)
    recorded = {k: row.recorded[k] for k in twin.recorded if k in row.recorded}
    return dataclasses.replace(twin, recorded={**twin.recorded, **recorded})


def with_controls(rows: Sequence[MethodRow]) -> list[MethodRow]:
    """``rows`` with each one's uniform twin right after it (or an equal row already there), every
    method row naming its twin's label in ``control``; :class:`MethodError` when no row has a twin.

    Example:
        >>> from leanbatch.bench.methods import parse_methods
        >>> [r.label for r in with_controls(parse_methods("infobatch,random,sb"))]
        ['infobatch', 'random', 'sb', 'sb~uniform']
        >>> with_controls(parse_methods("infobatch,random"))[0].control
        'random'
    """
    out = list(rows)
    for row in rows:
        twin = twin_row(row)
        if twin is None:
            continue
        same = next((r for r in out if r.kind == twin.kind and dict(r.settings) == dict(twin.settings)), None)
        if same is None:
            out.insert(out.index(row) + 1, twin)
        out[out.index(row)] = dataclasses.replace(row, control=twin.label if same is None else same.label)
    if not any(r.control for r in out):
        have = [k.name for k in REGISTRY.values() if k.twin is not None]
        raise MethodError(
            f"--controls: none of {', '.join(r.label for r in rows)} has a uniform twin to run beside it; "
            f"the methods that have one: {', '.join(have)}"
        )
    return out


def controls(runs: Sequence[RunResult], methods: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``controls`` section of results.json: one row per method of ``methods`` (``config.methods``)
    that names a ``control``, paired with it by seed.

    Example:
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> def run(label, seed, acc, t):
        ...     return RunResult(label, "obs", seed, 10, [EpochRecord(0, t, t, acc, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)])
        >>> runs = [run("obs", 0, 95.0, 2.0), run("obs~uniform", 0, 94.0, 1.9), run("obs", 1, 95.5, 2.1), run("obs~uniform", 1, 94.7, 2.0)]
        >>> row = controls(runs, [{"label": "obs", "control": "obs~uniform"}, {"label": "obs~uniform"}])["rows"][0]
        >>> row["control"], round(row["diff_mean"], 2), row["verdict"], [round(s["diff"], 2) for s in row["per_seed"]]
        ('obs~uniform', 0.9, 'on', [1.0, 0.8])
    """
    rows = []
    for m in methods:
        if not m.get("control"):
            continue
        mine = {r.seed: r for r in runs if r.label == m["label"]}
        theirs = {r.seed: r for r in runs if r.label == m["control"]}
        seeds = sorted(set(mine) & set(theirs))
        pairs = [(mine[s], theirs[s]) for s in seeds]
        diffs = [a.final_acc - b.final_acc for a, b in pairs]
        stats = interval(diffs)
        rows.append(
            {
                "method": m["label"],
                "control": m["control"],
                "seeds": seeds,
                "acc_mean": mean_of([a.final_acc for a, _ in pairs]),
                "control_acc_mean": mean_of([b.final_acc for _, b in pairs]),
                "train_time_s_mean": mean_of([a.train_time for a, _ in pairs]),
                "control_train_time_s_mean": mean_of([b.train_time for _, b in pairs]),
                "train_cpu_time_s_mean": mean_of([a.train_cpu_time for a, _ in pairs]),
                "control_train_cpu_time_s_mean": mean_of([b.train_cpu_time for _, b in pairs]),
                "diff_mean": stats.mean,
                "diff_std": stats.std,
                "ci_low": stats.low,
                "ci_high": stats.high,
                "verdict": stats.verdict,
                "per_seed": [_pair(a, b) for a, b in pairs],
            }
        )
    return {"rule": RULE, "confidence": CONFIDENCE, "rows": rows}


def _pair(a: RunResult, b: RunResult) -> dict[str, Any]:
    """One seed of a control row: the method's run ``a`` and its twin's ``b``."""
    return {
        "seed": a.seed,
        "acc": a.final_acc,
        "control_acc": b.final_acc,
        "diff": a.final_acc - b.final_acc,
        "train_time_s": a.train_time,
        "control_train_time_s": b.train_time,
    }
