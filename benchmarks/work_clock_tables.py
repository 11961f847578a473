"""The stored studies judged on the work clock beside the wall clock (issue 30): the tables of
docs/results.md's "Re-judged at equal work" and the README's "Measured results".

Nothing trains: every study under ``benchmarks/results/`` holds its runs' counts, and
:func:`leanbatch.engine.judging.parts.rebuild` judges them on any clock (what ``leanbatch report
--clock work|wall`` does). Usage: ``python benchmarks/work_clock_tables.py [STUDY ...]`` (default:
the three envelope studies); ``--moved`` lists every arm of every stored study whose verdict differs
between the two clocks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.parts import rebuild

RESULTS = Path(__file__).resolve().parent / "results"
STUDIES = ("cifar10-envelope-12ep", "cifar10-envelope-20ep", "mnist-envelope-8ep")


def _judged(study: str) -> tuple[dict[str, Any], dict[str, Any]]:
    payload = json.loads((RESULTS / study / "results.json").read_text())
    return rebuild(payload, study, "work"), rebuild(payload, study, "wall")


def _diff(row: dict[str, Any] | None) -> str:
    if row is None:
        return "(no twin)"
    if row["diff_mean"] is None:
        return row["verdict"]
    verdict = {"better": "**better**", "worse": "**worse**"}.get(row["verdict"], row["verdict"])
    return f"{row['diff_mean']:+.2f} ± {row['diff_std']:.2f} {verdict}"


def table(study: str) -> str:
    """One study's arms: work saved, the verdicts at equal work, and the wall clock beside."""
    work, wall = _judged(study)
    env = {r["method"]: r for r in work["envelope"]["rows"]}
    env_wall = {r["method"]: r for r in wall["envelope"]["rows"]}
    twins = {r["method"]: r for r in work["controls"]["rows"]}
    lines = [
        "| method | work saved | acc. vs full baseline | vs envelope, equal work | vs its twin | time saved | actual x | achieved | vs envelope, equal time |",
        "|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for r in work["summary"]:
        if r["kind"] == "baseline":
            continue
        m = r["method"]
        lines.append(
            f"| {m} | {(1 - r['cost_ratio_vs_baseline']) * 100:.1f}% | {r['metric_delta_vs_baseline']:+.2f} "
            f"| {_diff(env.get(m))} | {_diff(twins.get(m)) if r.get('control') else '(no twin)'} "
            f"| {(1 - r['time_ratio_vs_baseline']) * 100:.1f}% | {r['actual_speedup']:.2f} ± {r['actual_speedup_std']:.2f} "
            f"| {r['achieved_of_ideal']:.2f} ± {r['achieved_std']:.2f} | {_diff(env_wall.get(m))} |"
        )
    return "\n".join(lines)


def moved() -> str:
    """Every arm of every stored study whose verdict differs between the wall and the work clock."""
    lines = ["| study | method | against | equal time (wall) | equal work |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*/results.json")):
        work, wall = _judged(path.parent.name)
        for section in ("envelope", "controls"):
            for a, b in zip(wall[section]["rows"], work[section]["rows"], strict=True):
                if a["verdict"] != b["verdict"]:
                    what = "envelope" if section == "envelope" else "twin"
                    lines.append(
                        f"| {path.parent.name} | {a['method']} | {what} | {a['verdict']} | {b['verdict']} |"
                    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="*", default=STUDIES)
    parser.add_argument("--moved", action="store_true", help="the verdicts that differ between the clocks")
    args = parser.parse_args()
    if args.moved:
        print(moved())
        return
    for study in args.studies:
        print(f"{study}\n\n{table(study)}\n")


if __name__ == "__main__":
    main()
