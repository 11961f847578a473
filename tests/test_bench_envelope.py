"""The envelope of the baseline's same-compute variants (step budgets, batch budgets), and the batch
budgets themselves: known curves in, known envelope values and verdicts out; tiny real runs whose
records show the batch size, the steps, the schedule and the LR rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import TINY, _restore_torch_globals, _run  # noqa: F401  (the fixture restores torch's globals)

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.data import load_data
from leanbatch.bench.envelope import envelope, envelope_at, seed_curves
from leanbatch.bench.frontier import equal_time
from leanbatch.bench.interleave import train_interleaved
from leanbatch.bench.methods import parse_methods
from leanbatch.bench.records import EpochRecord, RunResult
from leanbatch.bench.report import read_results, rebuild

# Per seed s, every accuracy is offset by OFFSETS[s]. The step family is concave, the batch family
# (two batch budgets, then the full baseline, which both families share) rises later and faster:
# the step family is higher up to their crossing (between 12 and 18), the batch family after it.
OFFSETS = {0: 0.0, 1: 0.6, 2: -0.4}
STEPS = [(10.0, 90.0), (20.0, 96.0), (30.0, 100.0)]  # budgets 1/3, 2/3, 1
BATCH = [(12.0, 86.0), (18.0, 97.0)]  # batch budgets 0.5, 0.7; then (30, 100), the full baseline


def _curve(points: list[tuple[float, float]], t: float) -> float | None:
    """numpy's piecewise-linear interpolation, inside the points' times only: the independent oracle."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return float(np.interp(t, xs, ys)) if xs[0] <= t <= xs[-1] else None


def steps(t: float, o: float) -> float:
    return _curve(STEPS, t) + o  # type: ignore[operator]


def best(t: float, o: float) -> float:
    """The envelope by brute force: the larger of the families defined at t."""
    return max(v for v in (_curve(STEPS, t), _curve([*BATCH, STEPS[-1]], t)) if v is not None) + o


def _run_at(
    label: str, kind: str, seed: int, t: float, acc: float, budget: float = 1.0, b: float = 1.0
) -> RunResult:
    e = EpochRecord(0, t, 2 * t, acc, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)
    return RunResult(label, kind, seed, 10, [e], budget=budget, batch=b)


def _baselines(with_batch: bool = True) -> list[RunResult]:
    runs = []
    for s, o in OFFSETS.items():
        for (t, acc), budget in zip(STEPS, (1 / 3, 2 / 3, 1.0), strict=True):
            runs.append(
                _run_at(
                    "baseline" if budget == 1 else f"baseline[budget={budget:.2f}]",
                    "baseline",
                    s,
                    t,
                    acc + o,
                    budget,
                )
            )
        for (t, acc), b in zip(BATCH, (0.5, 0.7), strict=True) if with_batch else ():
            runs.append(_run_at(f"baseline[batch={b}]", "baseline", s, t, acc + o, b=b))
    return runs


def _method(label: str, times: dict[int, float], diffs: dict[int, float], yardstick) -> list[RunResult]:  # type: ignore[no-untyped-def]
    return [_run_at(label, "sb", s, t, yardstick(t, OFFSETS[s]) + diffs[s]) for s, t in times.items()]


def test_two_crossing_families_give_their_max_where_each_is_defined() -> None:
    curves = seed_curves(_baselines())[1]
    assert sorted(curves) == ["batch", "steps"]
    assert sorted(curves["batch"]) == [(12.0, 86.6), (18.0, 97.6), (30.0, 100.6)]
    for k in range(201):
        t = 10.0 + k * 0.1
        value, family, where = envelope_at(curves, t)
        assert where == "inside" and value == pytest.approx(best(t, 0.6)), t
        assert value == pytest.approx(
            steps(t, 0.6) if family == "steps" else _curve(BATCH + [STEPS[-1]], t) + 0.6
        )
    assert (
        envelope_at(curves, 11.0)[1] == envelope_at(curves, 14.0)[1] == "steps"
    )  # batch undefined, then lower
    assert envelope_at(curves, 17.0)[1] == envelope_at(curves, 25.0)[1] == "batch"
    assert [envelope_at(curves, t)[2] for t in (9.99, 30.01)] == ["faster", "slower"]


def test_methods_are_paired_with_the_envelope_per_seed_and_judged_by_the_one_rule() -> None:
    runs = _baselines()
    late = {0: 19.0, 1: 21.0, 2: 20.0}  # where the batch family is the higher one
    runs += _method("above", late, {0: 0.5, 1: 0.7, 2: 0.6}, best)
    runs += _method("above-the-steps-only", late, {0: 0.5, 1: 0.7, 2: 0.6}, steps)
    flat = lambda t, o: 95.0  # noqa: E731
    runs += _method("too-quick", {0: 9.0, 1: 12.0, 2: 12.0}, {0: 0.0, 1: 0.0, 2: 0.0}, flat)
    runs += _method("too-slow", {0: 25.0, 1: 31.0, 2: 25.0}, {0: 0.0, 1: 0.0, 2: 0.0}, flat)
    rows = {r["method"]: r for r in envelope(runs)["rows"]}
    above = rows["above"]
    assert [p["diff"] for p in above["per_seed"]] == pytest.approx([0.5, 0.7, 0.6])
    assert [p["family"] for p in above["per_seed"]] == ["batch"] * 3
    half = 4.303 * 0.1 / math.sqrt(3)
    assert (above["ci_low"], above["ci_high"]) == pytest.approx((0.6 - half, 0.6 + half))
    assert above["verdict"] == "above"
    # 0.5..0.7 above the step frontier, but the batch family is higher still there
    below = rows["above-the-steps-only"]
    expected = [
        steps(t, OFFSETS[s]) + d - best(t, OFFSETS[s])
        for (s, t), d in zip(late.items(), (0.5, 0.7, 0.6), strict=True)
    ]
    assert [p["diff"] for p in below["per_seed"]] == pytest.approx(expected) and max(expected) < 0
    assert below["verdict"] == "below"
    frontier = {r["method"]: r for r in equal_time(runs)["rows"]}
    assert frontier["above-the-steps-only"]["verdict"] == "above"  # the step frontier alone credits it
    # never extrapolated: faster than every family at seed 0 (9 < 10), slower at seed 1 (31 > 30)
    assert rows["too-quick"]["verdict"] == "out of range" and rows["too-quick"]["faster"] == 1
    assert rows["too-quick"]["per_seed"][0]["frontier_acc"] is None
    assert rows["too-slow"]["verdict"] == "out of range" and rows["too-slow"]["slower"] == 1
    assert [p["range"] for p in rows["too-slow"]["per_seed"]] == ["inside", "slower", "inside"]


def test_one_family_only_is_the_step_frontier() -> None:
    runs = _baselines(with_batch=False) + _method(
        "sb", {0: 12.0, 1: 18.0, 2: 27.0}, {0: 0.2, 1: 0.3, 2: 0.1}, steps
    )
    section = envelope(runs)
    assert list(section["families"]) == ["steps"] and section["batch_budgets"] == []
    (row,) = section["rows"]
    (same,) = equal_time(runs)["rows"]
    for key in ("frontier_acc_mean", "diff_mean", "diff_std", "ci_low", "ci_high", "verdict"):
        assert row[key] == pytest.approx(same[key]), key
    # and two families that share no time leave a gap where neither is defined
    gap = {"steps": [(10.0, 90.0), (20.0, 95.0)], "batch": [(30.0, 96.0), (40.0, 98.0)]}
    assert envelope_at(gap, 25.0) == (None, None, "gap")


def test_the_envelope_section_lists_each_familys_points_on_both_clocks() -> None:
    runs = _baselines()
    wall, cpu = envelope(runs), envelope(runs, clock="cpu")
    assert [p["method"] for p in wall["families"]["steps"]] == [
        "baseline[budget=0.33]", "baseline[budget=0.67]", "baseline",
    ]  # fmt: skip
    assert [p["method"] for p in wall["families"]["batch"]] == [
        "baseline[batch=0.5]",
        "baseline[batch=0.7]",
        "baseline",
    ]
    assert wall["batch_budgets"] == [0.5, 0.7, 1.0] and cpu["clock"] == "cpu"
    assert cpu["families"]["batch"][0]["train_time_s_mean"] == pytest.approx(24.0)  # CPU = 2 x wall here
    # the equal-time section keeps its step frontier; the batch runs are rows compared with it
    section = equal_time(runs)
    assert [p["method"] for p in section["frontier"]] == [
        "baseline[budget=0.33]",
        "baseline[budget=0.67]",
        "baseline",
    ]
    assert [r["method"] for r in section["rows"]] == ["baseline[batch=0.5]", "baseline[batch=0.7]"]


# ---------------------------------------------------------------------------- batch budgets, for real
def _tiny(lr_rule: str) -> TrainConfig:
    return TrainConfig(epochs=3, batch_size=32, widths=(8,), lr_rule=lr_rule, warmup=0.0)


def test_a_batch_budget_trains_its_smaller_batches_for_all_the_baselines_steps() -> None:
    data = load_data("digits", 320, 60)
    rows = parse_methods("baseline,baseline[batch=0.5]")
    full, half = train_interleaved(data, rows, 0, _tiny("same"))
    torch.set_flush_denormal(False)
    assert [e.steps for e in full.epochs] == [10, 10, 10]  # 320 / 32
    assert [e.steps for e in half.epochs] == [20, 10]  # 30 steps of 16 rows: an epoch and a half
    assert [e.forwarded for e in half.epochs] == [320, 160] and half.batch == 0.5
    assert half.totals()["work_fraction"] == pytest.approx(0.5)
    # the schedule over its own steps: its last step is the full baseline's last (same progress, same LR)
    assert half.epochs[-1].lr == pytest.approx(full.epochs[-1].lr) and half.epochs[-1].lr < 0.01
    assert half.epochs[0].lr == pytest.approx(full.epochs[1].lr)  # step 20 of 30 in both


def test_the_lr_rule_scales_batch_budgets_and_selected_batches_by_their_rows() -> None:
    data = load_data("digits", 320, 60)
    rows = parse_methods("baseline,baseline[batch=0.5],obs[keep=0.5]")
    same = train_interleaved(data, rows, 0, _tiny("same"))
    scaled = train_interleaved(data, rows, 0, _tiny("scaled"))
    torch.set_flush_denormal(False)
    assert [e.lr for e in scaled[0].epochs] == [e.lr for e in same[0].epochs]  # full batches: unchanged
    for k in (1, 2):  # 16 of 32 rows, every step (obs selects on every batch)
        ratios = [a.lr / b.lr for a, b in zip(scaled[k].epochs, same[k].epochs, strict=True)]
        assert ratios == pytest.approx([0.5] * len(ratios)), rows[k].label


def test_batch_budgets_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*TINY, "--methods", "baseline,obs", "--batch-budgets", "0.5,0.75", "--budgets", "0.5,1"]
    code, out, err = _run([*args, "--lr-rule", "scaled", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["config"]["batch_budgets"] == [0.5, 0.75] and payload["config"]["lr_rule"] == "scaled"
    runs = {r["method"]: r for r in payload["runs"]}
    assert runs["baseline[batch=0.75]"]["steps"] == runs["baseline"]["steps"] == 30
    quarter = runs["baseline[batch=0.75]"]["epochs"]  # 30 steps of 24 rows: 14 an epoch (the last of 8)
    assert [(e["steps"], e["forwarded"]) for e in quarter] == [(14, 320), (14, 320), (2, 48)]
    assert [p["method"] for p in payload["envelope"]["families"]["batch"]] == [
        "baseline[batch=0.5]", "baseline[batch=0.75]", "baseline",
    ]  # fmt: skip
    assert "| baseline[batch=0.5]" in out and "vs envelope" in out and (tmp_path / "equal_time.png").is_file()
    for bad, rows in (("0.03", 1), ("0.01", 0)):  # round(b x 32) rows: 0 or 1 is refused
        code, out, err = _run([*TINY, "--batch-budgets", bad, "--out", str(tmp_path / "x")], capsys)
        assert code == 2 and err.count("\n") == 1 and f"= {rows} rows" in err and not out


def test_the_report_of_an_old_result_gains_an_envelope_equal_to_its_frontier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(__file__).parent.parent / "benchmarks" / "results" / "quick" / "results.json"
    code, out, err = _run(["report", str(path), "--out", str(tmp_path), "--no-plots"], capsys)
    assert code == 0 and "| infobatch " in out and "vs envelope" in out, err
    assert json.loads((tmp_path / "results.json").read_text())["envelope"]["rows"]
    stored = json.loads(path.read_text())
    assert "envelope" not in stored and "batch_budgets" not in stored["config"]
    new = rebuild(read_results(path))
    assert new["config"]["lr_rule"] == "same" and new["config"]["batch_budgets"] == []
    assert list(new["envelope"]["families"]) == ["steps"] and new["controls"]["rows"] == []
    assert new["equal_time"]["rows"] == stored["equal_time"]["rows"]  # the old section, unchanged
    for env, eq in zip(new["envelope"]["rows"], stored["equal_time"]["rows"], strict=True):
        assert env["method"] == eq["method"] and env["verdict"] == eq["verdict"]
        assert env["diff_mean"] == pytest.approx(eq["diff_mean"])
    assert {k for k in stored if k != "envelope"} <= set(new)
