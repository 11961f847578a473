"""Controls: each choosing arm beside its uniform twin, and what the choosing buys.

A selection rule is worth its name only if it beats the same budget spent at random. Every kind
with a :class:`~leanbatch.engine.registry.Twin` has a *twin arm*: the twin's kind with the
settings the two share copied from the method's arm and the twin's ``fixed`` settings on top.
``--controls`` adds, right after each arm that has one, its twin labelled ``<label>~<name>``:

========================  =========================================================================
method                    twin arm
========================  =========================================================================
``infobatch``             ``infobatch~random``: ``random`` (same prune_ratio, delta, ... drawn uniformly)
``sb``, ``sb-proxy``,     ``sb~uniform``...: ``uniform``, ``SelectiveBackprop(rule="uniform")`` with
``rho-loss``              the same keep and window, no selection pass (nor proxy, nor holdout model)
``infobatch+sb``          ``infobatch+sb~uniform``: ``infobatch+uniform`` (its pruning, then uniform)
``obs``, ``obs-epoch``    ``obs~uniform``...: the same kind at ``pressure=1`` (the loss-rank draw uniform)
========================  =========================================================================

An arm whose twin is already among the arms is paired with it rather than run twice; an arm that
is its own twin (``obs[pressure=1]``) gets none. The ``controls`` section of results.json pairs
each method with its twin by seed: the difference in final metric (method minus twin, each at
its own time), its 95% t interval and the verdict of :func:`~leanbatch.engine.verdicts.interval`.

Example:
    >>> from leanbatch.engine.arms import parse_methods
    >>> [(a.label, a.control) for a in with_controls(parse_methods("baseline,obs[keep=0.7]"))]
    [('baseline', None), ('obs[keep=0.7]', 'obs[keep=0.7]~uniform'), ('obs[keep=0.7]~uniform', None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from leanbatch.engine.arms import Arm, ArmError, make_arm
from leanbatch.engine.records import RunRecord
from leanbatch.engine.registry import REGISTRY
from leanbatch.engine.verdicts import CONFIDENCE, interval, mean_of

__all__ = ["RULE", "controls", "twin_arm", "with_controls"]

RULE = (
    "diff = arm's final metric - its uniform twin's, same seed, each at its own training time; "
    "better/worse when the 95% t interval of the mean gain excludes 0 and |mean diff| > std of the diffs; "
    "otherwise on (within noise)"
)


def twin_arm(arm: Arm) -> Arm | None:
    """The uniform twin of ``arm``; None when its kind has none or the arm is its own twin.

    Example:
        >>> from leanbatch.engine.arms import parse_methods
        >>> twin = twin_arm(parse_methods("sb[keep=0.7]")[0])
        >>> twin.label, twin.kind, twin.settings["keep"], twin.probe_selector().rule
        ('sb[keep=0.7]~uniform', 'uniform', 0.7, 'uniform')
    """
    spec = arm.method.twin
    if spec is None:
        return None
    kind = REGISTRY[spec.kind]
    settings = {s.name: arm.settings[s.name] for s in kind.settings if s.name in arm.settings}
    settings.update(dict(spec.fixed))
    if spec.kind == arm.kind and settings == dict(arm.settings):
        return None
    return make_arm(spec.kind, f"{arm.label}~{spec.name}", **settings)


def with_controls(arms: Sequence[Arm]) -> list[Arm]:
    """``arms`` with each one's uniform twin right after it (or an equal arm already there), every
    method naming its twin's label in ``control``; :class:`ArmError` when no arm has a twin.

    Example:
        >>> from leanbatch.engine.arms import parse_methods
        >>> [a.label for a in with_controls(parse_methods("infobatch,random,sb"))]
        ['infobatch', 'random', 'sb', 'sb~uniform']
    """
    out = list(arms)
    for arm in arms:
        twin = twin_arm(arm)
        if twin is None:
            continue
        same = next((a for a in out if a.kind == twin.kind and dict(a.settings) == dict(twin.settings)), None)
        if same is None:
            out.insert(out.index(arm) + 1, twin)
        out[out.index(arm)] = dataclasses.replace(arm, control=twin.label if same is None else same.label)
    if not any(a.control for a in out):
        have = [k.name for k in REGISTRY.values() if k.twin is not None]
        raise ArmError(
            f"--controls: none of {', '.join(a.label for a in arms)} has a uniform twin to run beside it; "
            f"the methods that have one: {', '.join(have)}"
        )
    return out


def controls(
    runs: Sequence[RunRecord], methods: Sequence[dict[str, Any]], goal: str = "max"
) -> dict[str, Any]:
    """The ``controls`` section of results.json: one row per arm of ``methods`` (``config.methods``)
    that names a ``control``, paired with it by seed.

    Example:
        >>> def run(label, seed, m, t):
        ...     return RunRecord(label, "obs", seed, m, [], train_time_s=t)
        >>> runs = [run("obs", 0, 95.0, 2.0), run("obs~uniform", 0, 94.0, 1.9), run("obs", 1, 95.5, 2.1), run("obs~uniform", 1, 94.7, 2.0)]
        >>> row = controls(runs, [{"label": "obs", "control": "obs~uniform"}])["rows"][0]
        >>> row["control"], round(row["diff_mean"], 2), row["verdict"], [round(s["diff"], 2) for s in row["per_seed"]]
        ('obs~uniform', 0.9, 'on', [1.0, 0.8])
    """
    rows = []
    for m in methods:
        if not m.get("control"):
            continue
        mine = {r.seed: r for r in runs if r.method == m["label"]}
        theirs = {r.seed: r for r in runs if r.method == m["control"]}
        pairs = [(mine[s], theirs[s]) for s in sorted(set(mine) & set(theirs))]
        stats = interval([a.metric - b.metric for a, b in pairs], goal)
        rows.append(
            {
                "method": m["label"],
                "control": m["control"],
                "seeds": [a.seed for a, _ in pairs],
                "metric_mean": mean_of([a.metric for a, _ in pairs]),
                "control_metric_mean": mean_of([b.metric for _, b in pairs]),
                "time_s_mean": mean_of([a.train_time_s for a, _ in pairs]),
                "control_time_s_mean": mean_of([b.train_time_s for _, b in pairs]),
                "diff_mean": stats.mean,
                "diff_std": stats.std,
                "ci_low": stats.low,
                "ci_high": stats.high,
                "verdict": stats.verdict,
                "per_seed": [
                    {
                        "seed": a.seed,
                        "metric": a.metric,
                        "control_metric": b.metric,
                        "diff": a.metric - b.metric,
                        "time_s": a.train_time_s,
                        "control_time_s": b.train_time_s,
                    }
                    for a, b in pairs
                ],  # fmt: skip
            }
        )
    return {"goal": goal, "rule": RULE, "confidence": CONFIDENCE, "rows": rows}
