"""The equal-time yardstick: interpolation, paired differences, verdicts, presets, the report and plot.

Known curves in, known differences out: every frontier here is a straight line or a broken
line whose value at any time is easy to write down, so the expected figures are computed in the
test from the curve, not copied from a run.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from leanbatch.bench.frontier import compare, equal_time, interpolate, is_frontier, t_quantile
from leanbatch.bench.methods import MethodError, parse_methods
from leanbatch.bench.plots import write_plots
from leanbatch.bench.presets import PresetError, parse_budgets, resolve, with_budgets
from leanbatch.bench.report import build_results, format_equal_time
from leanbatch.bench.train import EpochRecord, RunResult, budget_steps


def _line(offset: float, times: tuple[float, ...] = (10.0, 20.0, 30.0)) -> list[tuple[float, float]]:
    """A frontier on which accuracy = 80 + offset + 0.2 * time."""
    return [(t, 80.0 + offset + 0.2 * t) for t in times]


OFFSETS = {0: 0.0, 1: 1.0, 2: -0.5}
FRONTIER = {s: _line(o) for s, o in OFFSETS.items()}


def _runs_at(times: dict[int, float], diffs: dict[int, float]) -> dict[int, tuple[float, float]]:
    """Method runs that sit ``diffs`` points off the known line at the given times."""
    return {s: (t, 80.0 + OFFSETS[s] + 0.2 * t + diffs[s]) for s, t in times.items()}


# ---------------------------------------------------------------------------- interpolation
def test_interpolate_is_piecewise_linear_in_time() -> None:
    broken = [(30.0, 95.0), (10.0, 90.0), (20.0, 94.0)]  # any order
    assert interpolate(broken, 10.0) == pytest.approx(90.0)
    assert interpolate(broken, 15.0) == pytest.approx(92.0)
    assert interpolate(broken, 25.0) == pytest.approx(94.5)
    assert interpolate(broken, 30.0) == pytest.approx(95.0)
    # runs at the same time are averaged into one point
    assert interpolate([(10.0, 90.0), (10.0, 92.0), (20.0, 95.0)], 15.0) == pytest.approx(93.0)


@pytest.mark.parametrize("t", [9.999, 30.001, -1.0, math.inf])
def test_interpolate_never_extrapolates(t: float) -> None:
    assert interpolate([(10.0, 90.0), (20.0, 94.0), (30.0, 95.0)], t) is None


def test_interpolate_needs_two_distinct_times() -> None:
    assert interpolate([(10.0, 90.0)], 10.0) is None
    assert interpolate([(10.0, 90.0), (10.0, 91.0)], 10.0) is None


def test_t_quantile_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 41), 60, 120, 1000]:
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1.5e-3), df
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0)


# ---------------------------------------------------------------------------- verdicts
def test_known_differences_come_out() -> None:
    diffs = {0: 0.5, 1: 0.7, 2: 0.6}
    c = compare(FRONTIER, _runs_at({0: 14.0, 1: 21.0, 2: 27.5}, diffs))
    assert [p.diff for p in c.per_seed] == pytest.approx([0.5, 0.7, 0.6])
    expected_frontier = [80.0 + OFFSETS[s] + 0.2 * t for s, t in ((0, 14.0), (1, 21.0), (2, 27.5))]
    assert [p.frontier_acc for p in c.per_seed] == pytest.approx(expected_frontier)
    assert c.frontier_acc_mean == pytest.approx(statistics.fmean(expected_frontier))
    assert c.diff_mean == pytest.approx(0.6) and c.diff_std == pytest.approx(0.1)
    half = 4.303 * 0.1 / math.sqrt(3)
    assert (c.ci_low, c.ci_high) == pytest.approx((0.6 - half, 0.6 + half))
    assert c.verdict == "above" and c.faster == c.slower == 0
    assert {p.range for p in c.per_seed} == {"inside"}


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        ((0.5, 0.7, 0.6), "above"),
        ((-0.9, -1.2, -1.0), "below"),
        ((1.0, -0.5, 0.2), "on"),  # the interval straddles zero
        ((0.0, 0.0, 0.0), "on"),
    ],
)
def test_verdicts(diffs: tuple[float, ...], verdict: str) -> None:
    c = compare(FRONTIER, _runs_at({0: 15.0, 1: 15.0, 2: 25.0}, dict(enumerate(diffs))))
    assert c.verdict == verdict
    assert c.diff_mean == pytest.approx(statistics.fmean(diffs))


def test_a_difference_inside_the_seed_spread_is_a_tie_even_when_significant() -> None:
    # Ten seeds: the mean (0.35) is known well enough that its 95% interval excludes zero, but it is
    # smaller than the spread of the per-seed differences, which single seeds would not show.
    diffs = [0.35 + d for d in (-0.6, 0.6, -0.4, 0.4, -0.2, 0.2, -0.5, 0.5, 0.0, 0.0)]
    frontier = {s: _line(0.0) for s in range(10)}
    runs = {s: (20.0, 84.0 + d) for s, d in enumerate(diffs)}
    c = compare(frontier, runs)
    assert c.diff_std is not None and c.ci_low is not None
    assert c.ci_low > 0 and c.diff_mean is not None and c.diff_mean < c.diff_std
    assert c.verdict == "on"


def test_out_of_range_is_never_extrapolated() -> None:
    # Seed 1 ran faster than its shortest budget run: the line could be extended, but is not.
    c = compare(FRONTIER, _runs_at({0: 15.0, 1: 9.0, 2: 15.0}, {0: 1.0, 1: 1.0, 2: 1.0}))
    assert c.verdict == "out of range" and c.faster == 1 and c.slower == 0
    by_seed = {p.seed: p for p in c.per_seed}
    assert by_seed[1].range == "faster" and by_seed[1].frontier_acc is None and by_seed[1].diff is None
    assert by_seed[0].diff == pytest.approx(1.0)  # the seeds inside are still reported
    assert c.diff_mean is None and c.frontier_acc_mean is None and c.ci_low is None
    slow = compare(FRONTIER, _runs_at({0: 31.0, 1: 35.0, 2: 15.0}, {0: 0.0, 1: 0.0, 2: 0.0}))
    assert slow.verdict == "out of range" and slow.slower == 2 and slow.faster == 0


def test_one_seed_is_undecided_and_no_frontier_is_said() -> None:
    one = compare(FRONTIER, _runs_at({0: 15.0}, {0: 2.0}))
    assert one.verdict == "undecided" and one.diff_mean == pytest.approx(2.0) and one.diff_std is None
    single_budget = {0: [(20.0, 90.0)], 1: [(20.0, 91.0)]}
    assert compare(single_budget, {0: (20.0, 90.0), 1: (20.0, 91.0)}).verdict == "no frontier"
    # seeds without a frontier are not paired
    partial = compare({0: _line(0.0)}, {0: (20.0, 84.5), 5: (20.0, 99.0)})
    assert partial.seeds == [0] and partial.diff_mean == pytest.approx(0.5)


# ---------------------------------------------------------------------------- from runs
def _run(label: str, kind: str, seed: int, time: float, acc: float, budget: float = 1.0) -> RunResult:
    epoch = EpochRecord(
        epoch=0, train_time=time, train_cpu_time=2 * time, test_acc=acc, test_loss=0.1, train_loss=0.1,
        steps=10, loaded=100, forwarded=100, select_forwarded=0, backpropagated=100, lr=0.0,
    )  # fmt: skip
    return RunResult(label, kind, seed, num_train=100, epochs=[epoch], budget=budget, full_epochs=1)


def _synthetic_runs() -> list[RunResult]:
    runs = []
    for seed, offset in OFFSETS.items():
        for budget, time in ((1.0, 30.0), (0.5, 10.0), (0.75, 20.0)):
            label = "baseline" if budget == 1.0 else f"baseline[budget={budget:g}]"
            runs.append(_run(label, "baseline", seed, time, 80.0 + offset + 0.2 * time, budget))
        runs.append(_run("infobatch", "infobatch", seed, 15.0, 83.0 + offset - 0.8))
        # a method the registry does not know yet is held to the same yardstick
        runs.append(_run("newmethod", "newmethod", seed, 25.0 + seed, 85.0 + offset + 0.2 * seed + 0.3))
        runs.append(_run("tooquick", "tooquick", seed, 5.0, 95.0))
    return runs


def test_equal_time_section_from_runs() -> None:
    section = equal_time(_synthetic_runs())
    assert [p["budget"] for p in section["frontier"]] == [0.5, 0.75, 1.0]
    assert section["budgets"] == [0.5, 0.75, 1.0]
    half = section["frontier"][0]
    assert half["method"] == "baseline[budget=0.5]" and half["seeds"] == [0, 1, 2]
    assert half["acc_mean"] == pytest.approx(82.0 + statistics.fmean(OFFSETS.values()))
    assert half["train_time_s_mean"] == pytest.approx(10.0) and half["train_time_s_std"] == 0.0
    rows = {r["method"]: r for r in section["rows"]}
    assert list(rows) == ["infobatch", "newmethod", "tooquick"]
    assert rows["infobatch"]["diff_mean"] == pytest.approx(-0.8) and rows["infobatch"]["verdict"] == "below"
    assert rows["newmethod"]["diff_mean"] == pytest.approx(0.3) and rows["newmethod"]["verdict"] == "above"
    assert rows["tooquick"]["verdict"] == "out of range" and rows["tooquick"]["faster"] == 3
    assert [s["seed"] for s in rows["newmethod"]["per_seed"]] == [0, 1, 2]
    assert is_frontier("baseline") and not is_frontier("random")
    assert section["clock"] == "wall"


def test_equal_time_on_the_cpu_clock() -> None:
    wall, cpu = equal_time(_synthetic_runs()), equal_time(_synthetic_runs(), clock="cpu")
    assert cpu["clock"] == "cpu"
    # the synthetic runs' CPU time is twice their wall-clock: the same frontier, stretched
    for w, c in zip(wall["frontier"], cpu["frontier"], strict=True):
        assert c["train_time_s_mean"] == pytest.approx(2 * w["train_time_s_mean"])
    for w, c in zip(wall["rows"], cpu["rows"], strict=True):
        assert c["verdict"] == w["verdict"] and c["train_time_s_mean"] == pytest.approx(
            2 * w["train_time_s_mean"]
        )
        if w["diff_mean"] is not None:
            assert c["diff_mean"] == pytest.approx(w["diff_mean"])
    with pytest.raises(ValueError, match="clock"):
        equal_time(_synthetic_runs(), clock="gpu")


def test_equal_time_table_and_plot(tmp_path: Path) -> None:
    runs = _synthetic_runs()
    config = {"epochs": 1, "methods": [{"label": lab} for lab in ("baseline", "infobatch")]}
    payload = build_results(runs, config, {"name": "synthetic", "num_train": 100}, 0.2)
    assert payload["schema"] == "leanbatch.bench/2"
    assert [r["method"] for r in payload["equal_time"]["rows"]] == ["infobatch", "newmethod", "tooquick"]
    table = format_equal_time(payload["equal_time"])
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert lines["baseline[budget=0.5]"].rstrip(" |").endswith("frontier")
    assert "-0.80 ± 0.00" in lines["infobatch"] and "| below" in lines["infobatch"]
    assert "out of range (faster than the shortest budget in 3/3 seeds)" in lines["tooquick"]
    written = write_plots(payload, tmp_path)
    png = tmp_path / "equal_time.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # without budget runs there is no frontier: the table says so and no plot is drawn
    plain = [r for r in runs if r.label in ("baseline", "infobatch")]
    payload = build_results(plain, config, {"name": "synthetic", "num_train": 100}, 0.2)
    assert "no frontier" in format_equal_time(payload["equal_time"])
    other = tmp_path / "other"
    other.mkdir()
    assert write_plots(payload, other) and not (other / "equal_time.png").exists()


# ---------------------------------------------------------------------------- budgets and presets
def test_budget_steps_round_to_the_nearest_step() -> None:
    assert budget_steps(0.5, 3, 10) == 15
    assert budget_steps(0.75, 3, 10) == 23  # 22.5 rounds up
    assert budget_steps(0.7, 8, 32) == 179  # 179.2
    assert budget_steps(1.25, 4, 10) == 50
    assert budget_steps(1e-6, 1, 1) == 1


def test_parse_budgets() -> None:
    assert parse_budgets("0.85, 0.5,1") == [0.5, 0.85, 1.0]
    assert parse_budgets("none") == parse_budgets("") == []
    for bad in ("x", "0", "-0.5", "5", "inf", "0.5,0.5"):
        with pytest.raises(PresetError, match="--budgets"):
            parse_budgets(bad)


def test_with_budgets_adds_each_missing_baseline_once() -> None:
    methods = parse_methods("infobatch,baseline[budget=0.50],sb")
    labels = [m.label for m in with_budgets(methods, [0.5, 0.7, 1.0])]
    assert labels == ["baseline", "baseline[budget=0.50]", "baseline[budget=0.7]", "infobatch", "sb"]
    assert [m.label for m in with_budgets(parse_methods("infobatch"), [])] == ["infobatch"]
    with pytest.raises(MethodError, match="budget applies to baseline only"):
        parse_methods("sb[budget=0.5]")


def test_presets_fill_in_what_was_not_given() -> None:
    quick = resolve("quick", {"data": None, "epochs": None})
    assert (quick["data"], quick["epochs"], quick["seeds"]) == ("mnist-5k", 8, "0,1,2")
    cifar = resolve("cifar10", {"data": "some/folder", "epochs": 4, "model": None})
    assert cifar["data"] == "some/folder" and cifar["epochs"] == 4 and cifar["model"] == "cnn"
    assert parse_budgets(cifar["budgets"]) == [0.5, 0.7, 0.85, 1.0]
    with pytest.raises(PresetError, match="--preset cifar10 needs --data PATH"):
        resolve("cifar10", {})
    with pytest.raises(PresetError, match="unknown --preset"):
        resolve("nope", {})
