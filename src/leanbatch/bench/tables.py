"""The printed tables of a comparison: the summary, equal time, the envelope, the controls.

- :func:`format_table`: one row per method (columns: :mod:`~leanbatch.bench.report`).
- :func:`format_equal_time`: every method against the baseline trained for fewer steps
  (:mod:`~leanbatch.bench.frontier`): ``frontier %`` is the accuracy the budget runs reach at
  the method's own training time (per seed, interpolated, never extrapolated), ``vs frontier``
  the paired difference (mean ± std over seeds, in points), ``95% CI`` its confidence interval,
  and ``verdict`` above / on (within noise) / below / out of range.
- :func:`format_envelope`: the same against the envelope of the step budgets and the batch
  budgets (:mod:`~leanbatch.bench.envelope`); ``reached by`` names the family that is higher at
  the method's time, per seed.
- :func:`format_controls`: each method against its uniform twin (:mod:`~leanbatch.bench.controls`).

Example:
    >>> print(format_controls({"rows": []}))
    controls: none (add --controls)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from leanbatch.bench.frontier import std_of

__all__ = ["format_controls", "format_envelope", "format_equal_time", "format_table"]


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


def _verdict_text(row: dict[str, Any], envelope: bool = False) -> str:
    verdict = str(row["verdict"])
    n = len(row["seeds"])
    if verdict == "out of range":
        shortest, longest = (
            ("every baseline run",) * 2 if envelope else ("the shortest budget", "the longest budget")
        )
        parts = []
        if row["faster"]:
            parts.append(f"faster than {shortest} in {row['faster']}/{n} seeds")
        if row["slower"]:
            parts.append(f"slower than {longest} in {row['slower']}/{n} seeds")
        if n - row["faster"] - row["slower"] - sum(s["range"] == "inside" for s in row["per_seed"]):
            parts.append("between the families, where neither is defined, in some seeds")
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
    lines += [_point_row(p, f"{p['budget']:g}", "frontier") for p in section["frontier"]]
    lines += _comparison_rows(section["rows"], reached=False)
    out = _markdown(lines, left=(0, len(head) - 1))
    out.append(
        f"\nequal time ({section.get('clock', 'wall')} clock): each method against the baseline trained for "
        "a fraction (budget) of its steps, at the method's own training time, paired by seed; vs frontier = mean ± std of the per-seed "
        "differences (points), never extrapolated; above/below only when the 95% CI excludes 0 and "
        "|mean| > std, else on (within noise)"
    )
    return "\n".join(out)


def _point_row(p: dict[str, Any], share: str, what: str) -> list[str]:
    """The line of a baseline point (a frontier's, a family's): label, share, accuracy, time, ``what``."""
    acc = f"{p['acc_mean']:.2f} ± {p['acc_std']:.2f}"
    return [p["method"], share, acc, _fmt(p["train_time_s_mean"], ".1f"), "", "", "", what]


def _comparison_rows(rows: Sequence[dict[str, Any]], reached: bool) -> list[list[str]]:
    """The method lines of an equal-time or envelope table (``reached``: the family column's text)."""
    lines = []
    for r in rows:
        diff = "-"
        if r["diff_mean"] is not None:
            diff = f"{r['diff_mean']:+.2f}" + ("" if r["diff_std"] is None else f" ± {r['diff_std']:.2f}")
        ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
        acc = [s["acc"] for s in r["per_seed"]]
        families = [s.get("family") for s in r["per_seed"] if s.get("family")]
        by = ", ".join(f"{f} {families.count(f)}/{len(acc)}" for f in dict.fromkeys(families))
        lines.append(
            [
                r["method"],
                by if reached else "",
                f"{r['acc_mean']:.2f} ± {std_of(acc):.2f}",
                _fmt(r["train_time_s_mean"], ".1f"),
                _fmt(r["frontier_acc_mean"], ".2f"),
                diff,
                ci,
                _verdict_text(r, envelope=reached),
            ]
        )
    return lines


def format_envelope(section: dict[str, Any]) -> str:
    """The envelope table: each family's points, then every method against the envelope.

    Example:
        >>> format_envelope({"families": {}, "rows": []})
        'envelope: no baseline budget runs, no envelope (add --budgets or --batch-budgets)'
    """
    families = section["families"]
    if sum(len(points) for points in families.values()) < 2:
        return "envelope: no baseline budget runs, no envelope (add --budgets or --batch-budgets)"
    time_head = "time s" if section.get("clock", "wall") == "wall" else "cpu s"
    head = [
        "method",
        "family / reached by",
        "acc %",
        time_head,
        "envelope %",
        "vs envelope",
        "95% CI",
        "verdict",
    ]
    lines = [head]
    for family, points in families.items():
        for p in points:
            share = p["budget"] if family == "steps" else p["batch"]
            lines.append(_point_row(p, f"{family} {share:g}", "envelope"))
    lines += _comparison_rows(section["rows"], reached=True)
    out = _markdown(lines, left=(0, 1, len(head) - 1))
    out.append(
        f"\nenvelope ({section.get('clock', 'wall')} clock): each method against the best plain use of its "
        "time, per seed the higher of the baseline trained for fewer steps (steps) and on smaller batches "
        "for all its steps (batch), never extrapolated; vs envelope = mean ± std of the per-seed differences "
        "(points); above/below only when the 95% CI excludes 0 and |mean| > std, else on (within noise)"
    )
    return "\n".join(out)


def format_controls(section: dict[str, Any]) -> str:
    """The controls table: each method against its uniform twin, paired by seed.

    Example:
        >>> row = {"method": "obs", "control": "obs~uniform", "acc_mean": 95.0, "control_acc_mean": 94.0,
        ...        "train_time_s_mean": 2.0, "control_train_time_s_mean": 1.9, "diff_mean": 1.0, "diff_std": None,
        ...        "ci_low": None, "ci_high": None, "verdict": "undecided", "seeds": [0]}
        >>> print(format_controls({"rows": [row]}).splitlines()[2])
        | obs    | obs~uniform | 95.00 |      94.00 |    2.0 |         1.9 |   +1.00 |      - | undecided (1 seed: no spread) |
    """
    if not section["rows"]:
        return "controls: none (add --controls)"
    head = ["method", "twin", "acc %", "twin acc %", "time s", "twin time s", "vs twin", "95% CI", "verdict"]
    lines = [head]
    for r in section["rows"]:
        diff = _fmt(r["diff_mean"], "+.2f") + ("" if r["diff_std"] is None else f" ± {r['diff_std']:.2f}")
        ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
        lines.append(
            [
                r["method"],
                r["control"],
                _fmt(r["acc_mean"], ".2f"),
                _fmt(r["control_acc_mean"], ".2f"),
                _fmt(r["train_time_s_mean"], ".1f"),
                _fmt(r["control_train_time_s_mean"], ".1f"),
                diff,
                ci,
                _verdict_text(r),
            ]
        )
    out = _markdown(lines, left=(0, 1, len(head) - 1))
    out.append(
        "\ncontrols: each method against its uniform twin (the same budget chosen at random), paired by seed, "
        "each at its own time; vs twin = mean ± std of the per-seed differences in final accuracy (points); "
        "above/below only when the 95% CI excludes 0 and |mean| > std, else on (within noise)"
    )
    return "\n".join(out)
