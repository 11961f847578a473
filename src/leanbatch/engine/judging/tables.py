"""The printed answer of a study: :func:`format_brief`, the terminal's last block, and the full tables
(:func:`format_results`: the answer, this machine's wall clock, the summary, the envelope, the
controls; their columns are report.html's glossary, :data:`~leanbatch.engine.judging.html.GLOSSARY`).

Every table names the metric and its goal (``higher is better`` / ``lower is better``); all but the
realisation are on the study's clock (``work`` by default: the same training prints them the same).

Example:
    >>> print(format_controls({"config": {}, "controls": {"rows": []}}))
    controls: none (add --controls)
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Collection, Iterator
from typing import Any

from leanbatch.engine.judging.records import AXES
from leanbatch.engine.judging.verdicts import std_of

__all__ = [
    "answers",
    "format_answer",
    "format_brief",
    "format_controls",
    "format_envelope",
    "format_realisation",
    "format_results",
    "format_summary",
    "overall",
    "tolerance_text",
]


def _fmt(x: Any, spec: str, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) + suffix


def _markdown(lines: list[list[str]], left: Collection[int] = (0,)) -> list[str]:
    """Rows of cells (the head first) as an aligned Markdown table: the ``left`` columns flush left,
    the others right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    align = ["<" if i in left else ">" for i in range(len(widths))]
    out = [
        "| " + " | ".join(f"{c:{a}{w}}" for c, a, w in zip(line, align, widths, strict=True)) + " |"
        for line in lines
    ]
    rule = "|".join(
        "-" * (w + 2) if a == "<" else "-" * (w + 1) + ":" for a, w in zip(align, widths, strict=True)
    )
    return [out[0], f"|{rule}|", *out[1:]]


def _saved(ratio: float | None) -> str:
    """The one sign convention of every table: the share saved against the full baseline, positive
    when the arm cost less (``38.2%``), negative when it cost more."""
    return _fmt(None if ratio is None else (1 - ratio) * 100, ".1f", "%")


def tolerance_text(spec: float | str, metric: str) -> str:
    """What ``tolerance`` (results.json's, ``"1%"`` or a number) means, in a few words.

    Example:
        >>> tolerance_text("1%", "accuracy"), tolerance_text(0.2, "accuracy")
        ("1% of the baseline's final accuracy", '0.2 (in accuracy units)')
    """
    return (
        f"{spec} of the baseline's final {metric}"
        if isinstance(spec, str)
        else f"{spec:g} (in {metric} units)"
    )


def _study(payload: dict[str, Any]) -> tuple[str, str, str]:
    """The study's metric, goal and clock (a doctest's bare config: ``metric``, ``max``, ``work``)."""
    cfg = payload["config"]
    return cfg.get("metric", "metric"), cfg.get("goal", "max"), cfg.get("clock", "work")


def _goal(goal: str) -> str:
    return "higher is better" if goal == "max" else "lower is better"


def _spread(row: dict[str, Any]) -> str:
    """``+0.12 ± 0.3``: a comparison's mean difference and its spread (``-`` without one)."""
    mean = _fmt(row["diff_mean"], "+.3g")
    return mean if mean == "-" or row["diff_std"] is None else f"{mean} ± {row['diff_std']:.2g}"


def _diff(row: dict[str, Any] | None) -> str:
    """``+0.12 ± 0.3 on``: a comparison's mean difference, its spread and its verdict."""
    if row is None:
        return "(no twin)"
    spread = _spread(row)
    return _verdict(row) if spread == "-" else f"{spread} {row['verdict']}"


def _judged(row: dict[str, Any]) -> str:
    """``+0.12 ± 0.3: on (within noise)``: a comparison's difference (kept on one line when wrapped:
    no-break spaces around ``±``), then its verdict."""
    spread = _spread(row).replace(" ± ", "\u00a0±\u00a0")
    return _verdict(row) if spread == "-" else f"{spread}: {_verdict(row)}"


def _ci(row: dict[str, Any]) -> str:
    return "-" if row["ci_low"] is None else f"[{row['ci_low']:+.3g}, {row['ci_high']:+.3g}]"


def _value(mean: float, std: float) -> str:
    return f"{mean:.4g} ± {std:.2g}"


def _verdict(row: dict[str, Any]) -> str:
    v, n = str(row["verdict"]), len(row["seeds"])
    if v == "out of range":
        parts = [f"faster than every baseline run in {row['faster']}/{n} seeds"] if row.get("faster") else []
        parts += [f"slower than every baseline run in {row['slower']}/{n} seeds"] if row.get("slower") else []
        return f"out of range ({', '.join(parts) or 'between the families, where neither is defined'})"
    return {"on": "on (within noise)", "undecided": "undecided (1 seed: no spread)"}.get(v, v)


def overall(envelope_verdict: str | None, twin_verdict: str | None) -> str:
    """What an arm's two verdicts mean together, in a few words.

    Example:
        >>> overall("better", "better"), overall("better", "on"), overall("on", None), overall("worse", "better")
        ('pays: better than the plain alternatives and its twin', 'better than the plain alternatives; its twin does as well', 'a tie with training the baseline less', 'worse than training the baseline less')
    """
    if envelope_verdict == "better":
        if twin_verdict in (None, "better"):
            return "pays: better than the plain alternatives" + (" and its twin" if twin_verdict else "")
        return "better than the plain alternatives; its twin does as well"
    if envelope_verdict == "on":
        return "a tie with training the baseline less"
    if envelope_verdict == "worse":
        return "worse than training the baseline less"
    return f"not decided ({envelope_verdict or 'no envelope'})"


def answers(payload: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Any, Any, str]]:
    """Each method of the summary but the yardsticks (the baselines, the added twins): its row, its
    envelope row and its twin's (None without), and what they mean together (:func:`overall`).

    Example:
        >>> rows = {"summary": [{"method": "sb", "kind": "sb"}], "envelope": {"rows": []}}
        >>> [(row["method"], verdict) for row, _, _, verdict in answers({**rows, "controls": {"rows": []}})]
        [('sb', 'not decided (no envelope)')]
    """
    env = {r["method"]: r for r in payload["envelope"]["rows"]}
    twins = {r["method"]: r for r in payload["controls"]["rows"]}
    for row in payload["summary"]:
        if row["kind"] != "baseline" and "~" not in row["method"]:
            e, t = env.get(row["method"]), twins.get(row["method"])
            yield row, e, t, overall(None if e is None else e["verdict"], None if t is None else t["verdict"])


def format_answer(payload: dict[str, Any]) -> str:
    """One line per method that is not a baseline: the answer, ahead of the tables (judged on the
    study's clock: the same training prints the same answer on any machine)."""
    metric, goal, clock = _study(payload)
    saved = "work saved" if clock == "work" else f"{AXES[clock][0].removesuffix(' s')} saved"
    lines = [["method", saved, f"{metric} vs baseline", "vs envelope", "vs its twin", "verdict"]]
    lines += [
        [row["method"], _saved(row["cost_ratio_vs_baseline"]), _fmt(row["metric_delta_vs_baseline"], "+.3g"),
         "-" if e is None else _diff(e), _diff(t), verdict]
        for row, e, t, verdict in answers(payload)
    ]  # fmt: skip
    seeds = payload["config"].get("seeds", [])
    title = (
        f"the answer: {metric} ({_goal(goal)}), {len(seeds)} seed(s), {clock} clock; each method against the full "
        f"baseline, the envelope (the baseline trained for fewer steps or on smaller batches, at the method's own "
        f"{'work' if clock == 'work' else 'time'}) and its uniform twin (--controls); diffs are mean ± std over seeds"
    )
    if len(lines) == 1:
        return f"{title}\n(no method but the baseline)"
    return "\n".join([title, "", *_markdown(lines, left=(0, 3, 4, 5))])


def format_brief(payload: dict[str, Any], width: int = 100, where: str = "") -> str:
    """The answer as the terminal's last block: per method its verdict, then its figures, every line
    wrapped to ``width`` columns; ``where``: the files that hold the full tables.

    Example:
        >>> print(format_brief({"config": {"seeds": [0]}, "summary": [], "envelope": {"rows": []},
        ...                     "controls": {"rows": []}}, 70))
        the answer (metric, higher is better; 1 seed(s); work clock):
          no method but the baseline
    """
    metric, goal, clock = _study(payload)
    saved = "work" if clock == "work" else f"{clock} time"
    seeds = len(payload["config"].get("seeds", []))
    head = f"the answer ({metric}, {_goal(goal)}; {seeds} seed(s); {clock} clock):"
    lines = textwrap.wrap(head, width)
    rows = list(answers(payload))
    for row, e, t, verdict in rows:
        figures = [
            f"{saved} saved {_saved(row['cost_ratio_vs_baseline'])}",
            f"{metric} vs the full baseline {_fmt(row['metric_delta_vs_baseline'], '+.3g')}",
            "no envelope" if e is None else f"vs the envelope {_judged(e)}",
            "no twin ran" if t is None else f"vs its twin {t['control']} {_judged(t)}",
        ]
        if clock == "work" and row.get("time_ratio_vs_baseline") is not None:
            figures.append(f"time saved on this machine {_saved(row['time_ratio_vs_baseline'])}")
        lines += textwrap.wrap(
            f"{row['method']}: {verdict}", width, initial_indent="  ", subsequent_indent="    "
        )
        lines += textwrap.wrap("; ".join(figures), width, initial_indent="    ", subsequent_indent="    ")
    if not rows:
        lines.append("  no method but the baseline")
    if where:
        # a path stays whole, to copy: only a path longer than the terminal overflows it
        lines += textwrap.wrap(
            f"the full tables: {where}", width, break_on_hyphens=False, break_long_words=False
        )
    return "\n".join(lines)


def format_summary(payload: dict[str, Any]) -> str:
    """Every arm's metric, cost on the study's clock and work (``fwd``, ``bwd``, ``ideal x``, ``t->target``)."""
    metric, goal, clock = _study(payload)
    rows, tolerance = payload["summary"], payload["tolerance"]
    head, _, spec = AXES[clock]
    unit = head.removesuffix(" s")
    lines = [["method", f"{metric} ({goal})", head, f"{unit} saved", "fwd", "bwd", "ideal x", "t->target"]]
    for r in rows:
        reach = r["to_target"]
        reach_s = (
            f"- ({r['reached_target']}/{len(r['seeds'])})"
            if reach is None and r["reached_target"] is not None
            else _fmt(reach, spec)
        )
        lines.append([
            r["method"], _value(r["metric_mean"], r["metric_std"]), _fmt(r["cost_mean"], spec),
            _saved(r["cost_ratio_vs_baseline"]), _fmt(r["forward_fraction"], ".2f"),
            _fmt(r["backward_fraction"], ".2f"), _fmt(r["ideal_speedup"], ".2f"), reach_s,
        ])  # fmt: skip
    seeds = rows[0]["seeds"] if rows else []
    way = "-" if goal == "max" else "+"
    note = (
        f"\nmean ± std over seeds {seeds}, on the {clock} clock; {unit} saved: against the full baseline; t->target: "
        f"{unit} until the baseline's final {metric} {way} the tolerance, {tolerance_text(tolerance, metric)}, was first reached"
    )
    return "\n".join([*_markdown(lines), note])


def format_realisation(payload: dict[str, Any]) -> str:
    """This machine's wall clock: how much of each arm's ideal saving became time (``actual x``,
    ``achieved``, mean ± std over seeds), and one line when the baseline's own timing spread is
    larger than an arm's time saved."""
    lines = [["method", "time s", "time saved", "actual x", "achieved", "cpu x"]]
    lines += [
        [r["method"], _value(r["time_s_mean"], r["time_s_std"]), _saved(r["time_ratio_vs_baseline"]),
         _pm(r["actual_speedup"], r["actual_speedup_std"]), _pm(r["achieved_of_ideal"], r["achieved_std"]),
         _fmt(r["cpu_speedup"], ".2f")]
        for r in payload["summary"]
    ]  # fmt: skip
    note = "\non this machine (wall-clock, training only): actual x = the full baseline's time / the arm's, paired by seed; achieved = actual / ideal"
    timing = payload.get("timing") or {}
    if timing.get("within_noise"):
        note += (
            f"\ntiming noise: the full baseline's own runs spread ±{timing['baseline_spread'] * 100:.1f}% in time, more than "
            f"the time saved by {', '.join(timing['within_noise'])}: on this machine that saving is within timing noise"
        )
    return "\n".join([*_markdown(lines), note])


def _pm(mean: float | None, std: float | None) -> str:
    return _fmt(mean, ".2f") + ("" if mean is None or std is None else f" ± {std:.2f}")


def format_envelope(payload: dict[str, Any]) -> str:
    """The envelope's points, then every arm against the envelope (paired by seed, at its own cost).

    Example:
        >>> format_envelope({"config": {}, "envelope": {"families": {}, "rows": []}})
        'envelope: no baseline budget runs, no envelope (add --budgets or --batch-budgets)'
    """
    section, metric = payload["envelope"], _study(payload)[0]
    families = section["families"]
    if sum(len(points) for points in families.values()) < 2:
        return "envelope: no baseline budget runs, no envelope (add --budgets or --batch-budgets)"
    time_head, _, spec = AXES[section.get("clock", "work")]
    head = [
        "method",
        "family / reached by",
        metric,
        time_head,
        "envelope",
        "vs envelope",
        "95% CI",
        "verdict",
    ]
    lines = [head]
    lines += [
        [p["method"], f"{family} {p['share']:g}", _value(p["metric_mean"], p["metric_std"]),
         _fmt(p["cost_mean"], spec), "", "", "", "envelope"]
        for family, points in families.items() for p in points
    ]  # fmt: skip
    for r in section["rows"]:
        metrics = [s["metric"] for s in r["per_seed"]]
        by = [s.get("family") for s in r["per_seed"] if s.get("family")]
        reached = ", ".join(f"{f} {by.count(f)}/{len(metrics)}" for f in dict.fromkeys(by))
        lines.append([
            r["method"], reached, _value(r["metric_mean"], std_of(metrics)), _fmt(r["cost_mean"], spec),
            _fmt(r["reference_mean"], ".4g"), _spread(r), _ci(r), _verdict(r),
        ])  # fmt: skip
    note = (
        f"\nenvelope ({section.get('clock', 'work')} clock; {metric}, {_goal(section.get('goal', 'max'))}): each arm "
        "against the best plain use of its cost, per seed the best of the baseline trained for fewer steps (steps) "
        "and on smaller batches for all its steps (batch), never extrapolated; vs envelope = mean ± std of the "
        "per-seed differences; better/worse only when the 95% CI of the gain excludes 0 and |mean| > std"
    )
    return "\n".join([*_markdown(lines, left=(0, 1, len(head) - 1)), note])


def format_controls(payload: dict[str, Any]) -> str:
    """Each method against its uniform twin, paired by seed."""
    section, metric = payload["controls"], _study(payload)[0]
    if not section["rows"]:
        return "controls: none (add --controls)"
    cost, _, spec = AXES[section.get("clock", "work")]
    head = [
        "method",
        "twin",
        metric,
        f"twin {metric}",
        cost,
        f"twin {cost}",
        "vs twin",
        "95% CI",
        "verdict",
    ]
    lines = [head]
    lines += [
        [r["method"], r["control"], _fmt(r["metric_mean"], ".4g"), _fmt(r["control_metric_mean"], ".4g"),
         _fmt(r["cost_mean"], spec), _fmt(r["control_cost_mean"], spec), _spread(r), _ci(r), _verdict(r)]
        for r in section["rows"]
    ]  # fmt: skip
    note = (
        f"\ncontrols ({metric}, {_goal(section.get('goal', 'max'))}): each method against its uniform twin (the same "
        "budget chosen at random), paired by seed, each at its own cost; vs twin = mean ± std of the per-seed "
        "differences; better/worse only when the 95% CI of the gain excludes 0 and |mean| > std"
    )
    return "\n".join([*_markdown(lines, left=(0, 1, len(head) - 1)), note])


def format_results(payload: dict[str, Any]) -> str:
    """The whole terminal report: the answer, the realisation on this machine, the summary, the envelope
    and the controls (on ``config.clock``)."""
    parts = [f(payload) for f in (format_answer, format_realisation, format_summary, format_envelope)]
    if payload["controls"]["rows"]:
        parts.append(format_controls(payload))
    if payload.get("failed"):
        parts.append(
            "failed: " + "; ".join(f"{f['method']} seed {f['seed']}: {f['error']}" for f in payload["failed"])
        )
    return "\n\n".join(parts)
