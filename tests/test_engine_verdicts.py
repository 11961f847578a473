"""The verdict rule and the envelope on known numbers: interpolation, the 95% interval, ties within the
seed spread, never extrapolated, the two families' best where each is defined, and a metric whose
goal is ``min`` judged the other way up (a lower loss is better)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from leanbatch.engine.judging.envelope import envelope, envelope_at
from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.judging.verdicts import interpolate, interval, judge, t_quantile


def test_interpolate_is_piecewise_linear_in_time_and_never_extrapolates() -> None:
    broken = [(30.0, 95.0), (10.0, 90.0), (20.0, 94.0)]  # any order
    assert [interpolate(broken, t) for t in (10.0, 15.0, 25.0, 30.0)] == pytest.approx(
        [90.0, 92.0, 94.5, 95.0]
    )
    assert interpolate([(10.0, 90.0), (10.0, 92.0), (20.0, 95.0)], 15.0) == pytest.approx(93.0)  # averaged
    for t in (9.999, 30.001, -1.0, math.inf):
        assert interpolate(broken, t) is None
    assert interpolate([(10.0, 90.0), (10.0, 91.0)], 10.0) is None  # two distinct times needed


def test_the_interval_is_students_t_at_95_percent() -> None:
    # the printed tables' 97.5% quantiles (df 1, 2, 4, 30) and the normal's in the limit
    assert [round(t_quantile(df), 3) for df in (1, 2, 4, 30, 10**6)] == [12.706, 4.303, 2.776, 2.042, 1.96]
    r = interval([0.5, 0.7, 0.6])  # mean 0.6, std 0.1, n 3: half-width 4.303 x 0.1 / sqrt(3)
    assert (r.ci_low, r.ci_high) == pytest.approx((0.6 - 0.24841, 0.6 + 0.24841), abs=1e-5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0)


@pytest.mark.parametrize(
    ("diffs", "max_verdict", "min_verdict"),
    [
        ((0.5, 0.7, 0.6), "better", "worse"),
        ((-0.9, -1.2, -1.0), "worse", "better"),
        ((1.0, -0.5, 0.2), "on", "on"),  # the interval straddles zero
        ((0.0, 0.0, 0.0), "on", "on"),
    ],
)
def test_the_verdict_follows_the_goal(diffs: tuple[float, ...], max_verdict: str, min_verdict: str) -> None:
    up, down = interval(diffs, "max"), interval(diffs, "min")
    assert (up.verdict, down.verdict) == (max_verdict, min_verdict)
    # the diffs stay metric - reference
    assert up.diff_mean == down.diff_mean == pytest.approx(sum(diffs) / 3)
    if len(set(diffs)) > 1:
        half = 4.302653 * up.diff_std / math.sqrt(3)  # type: ignore[operator]
        assert (up.ci_low, up.ci_high) == pytest.approx((up.diff_mean - half, up.diff_mean + half))


def test_a_difference_inside_the_seed_spread_is_a_tie_even_when_significant() -> None:
    diffs = [0.35 + d for d in (-0.6, 0.6, -0.4, 0.4, -0.2, 0.2, -0.5, 0.5, 0.0, 0.0)]
    r = interval(diffs)
    assert r.ci_low is not None and r.ci_low > 0 and r.verdict == "on"
    assert r.diff_std is not None and r.diff_mean < r.diff_std
    assert interval([2.0]).verdict == "undecided" and interval([]).verdict == "no pairs"


# ---------------------------------------------------------------------------- the envelope
# Per seed s, every value is offset by OFFSETS[s]. The step family is concave, the batch family (two
# batch budgets, then the full baseline, which both share) rises later and faster: the step family is
# higher up to their crossing (between 12 and 18), the batch family after it.
OFFSETS = {0: 0.0, 1: 0.6, 2: -0.4}
STEPS = [(10.0, 90.0), (20.0, 96.0), (30.0, 100.0)]  # budgets 1/3, 2/3, 1
BATCH = [(12.0, 86.0), (18.0, 97.0)]  # batch budgets 0.5, 0.7; then (30, 100), the full baseline


def _curve(points: list[tuple[float, float]], t: float) -> float | None:
    """numpy's piecewise-linear interpolation inside the points' times: the independent oracle."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return float(np.interp(t, xs, ys)) if xs[0] <= t <= xs[-1] else None


def best(t: float, o: float, pick: object = max) -> float:
    values = [v for v in (_curve(STEPS, t), _curve([*BATCH, STEPS[-1]], t)) if v is not None]
    return pick(values) + o  # type: ignore[operator]


def _run(label: str, seed: int, t: float, m: float, budget: float = 1.0, batch: float = 1.0) -> RunRecord:
    kind = "baseline" if label.startswith("baseline") else "sb"
    return RunRecord(label, kind, seed, m, [], budget, batch, train_time_s=t, train_cpu_time_s=2 * t)


def _baselines(sign: float = 1.0) -> list[RunRecord]:
    runs = []
    for s, o in OFFSETS.items():
        for (t, m), b in zip(STEPS, (1 / 3, 2 / 3, 1.0), strict=True):
            runs.append(
                _run("baseline" if b == 1 else f"baseline[budget={b:.2f}]", s, t, sign * (m + o), budget=b)
            )
        for (t, m), b in zip(BATCH, (0.5, 0.7), strict=True):
            runs.append(_run(f"baseline[batch={b}]", s, t, sign * (m + o), batch=b))
    return runs


def test_two_crossing_families_give_their_best_where_each_is_defined() -> None:
    curves = {"steps": STEPS, "batch": [*BATCH, STEPS[-1]]}
    for k in range(201):
        t = 10.0 + k * 0.1
        value, family, where = envelope_at(curves, t)
        assert where == "inside" and value == pytest.approx(best(t, 0.0)), t
        low, _, _ = envelope_at({f: [(x, -y) for x, y in p] for f, p in curves.items()}, t, goal="min")
        assert low == pytest.approx(-best(t, 0.0))  # a loss: the lower of the two
    assert envelope_at(curves, 11.0)[1] == envelope_at(curves, 14.0)[1] == "steps"
    assert envelope_at(curves, 17.0)[1] == envelope_at(curves, 25.0)[1] == "batch"
    assert [envelope_at(curves, t)[2] for t in (9.99, 30.01)] == ["faster", "slower"]
    gap = {"steps": [(10.0, 90.0), (20.0, 95.0)], "batch": [(30.0, 96.0), (40.0, 98.0)]}
    assert envelope_at(gap, 25.0) == (None, None, "gap")


@pytest.mark.parametrize("goal", ["max", "min"])
def test_arms_are_paired_with_the_envelope_per_seed_and_judged_by_the_goal(goal: str) -> None:
    sign = 1.0 if goal == "max" else -1.0  # min: every value negated, so "better" is the same runs
    runs = _baselines(sign)
    late = {0: 19.0, 1: 21.0, 2: 20.0}  # where the batch family is the best one
    for label, gain in (("ahead", 1.0), ("behind", -1.0)):
        for s, t in late.items():
            runs.append(_run(label, s, t, sign * (best(t, OFFSETS[s]) + gain * (0.5 + 0.1 * s))))
    runs += [_run("too-quick", s, 9.0 if s == 0 else 12.0, 95.0) for s in OFFSETS]
    section = envelope(runs, clock="wall", goal=goal)
    rows = {r["method"]: r for r in section["rows"]}
    ahead = rows["ahead"]
    assert [p["diff"] for p in ahead["per_seed"]] == pytest.approx([sign * 0.5, sign * 0.6, sign * 0.7])
    assert [p["family"] for p in ahead["per_seed"]] == ["batch"] * 3
    assert ahead["verdict"] == "better" and rows["behind"]["verdict"] == "worse"
    assert section["goal"] == goal and list(section["families"]) == ["steps", "batch"]
    assert [p["share"] for p in section["families"]["batch"]] == [0.5, 0.7, 1.0]
    quick = rows["too-quick"]  # never extrapolated: faster than every run at seed 0
    assert (
        quick["verdict"] == "out of range"
        and quick["faster"] == 1
        and quick["per_seed"][0]["reference"] is None
    )
    cpu = envelope(runs, clock="cpu", goal=goal)
    assert cpu["families"]["batch"][0]["cost_mean"] == pytest.approx(24.0)  # CPU = 2 x wall here


def test_one_seed_is_undecided_and_a_single_reference_run_is_no_envelope() -> None:
    one = judge([])
    assert one.verdict == "no envelope"
    runs = [_run("baseline", 0, 20.0, 90.0), _run("sb", 0, 20.0, 91.0)]
    assert envelope(runs, clock="wall")["rows"][0]["verdict"] == "no envelope"
