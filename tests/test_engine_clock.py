"""The work clock: the verdict is a function of the training, not of the machine.

The same deterministic task run twice, once with timing noise injected (sleeps inside training
steps), gives identical verdicts, envelope, controls and judged tables on the default clock, and
different wall-clock figures; the wall clock's realisation (``actual x``, ``achieved``, their spread)
and the one line when the baseline's own timing spread is larger than a saving."""

from __future__ import annotations

from collections.abc import Iterator

import engine_tasks  # noqa: E402  (tests/ is on the path)
import pytest
import torch

from leanbatch.engine import bench
from leanbatch.engine.judging.records import EpochRecord, RunRecord
from leanbatch.engine.judging.results import build_results
from leanbatch.engine.judging.tables import (
    format_answer,
    format_controls,
    format_envelope,
    format_results,
    format_summary,
)

JUDGED = (
    "metric_mean",
    "metric_std",
    "cost_mean",
    "cost_ratio_vs_baseline",
    "work_fraction",
    "ideal_speedup",
    "to_target",
)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic in both studies
    yield
    torch.set_num_threads(threads)
    engine_tasks.NOISE.clear()


def _study(**clock: str) -> dict:
    return bench(engine_tasks.noisy, methods="baseline,infobatch", seeds=[0, 1, 2], budgets="0.5,0.75,1",
                 batch_budgets="0.5", controls=True, **clock)  # fmt: skip


def _tables(report: dict) -> list[str]:
    return [f(report) for f in (format_answer, format_envelope, format_controls, format_summary)]


def test_timing_noise_moves_the_wall_clock_and_not_the_verdict(one_thread: None) -> None:
    quiet = _study()  # the default clock
    engine_tasks.NOISE.update({"infobatch": 0.01, "baseline[budget=0.5]": 0.006})  # slow two arms down
    noisy = _study()
    key = [(r["method"], r["seed"], r["metric"], r["counts"]) for r in quiet["runs"]]
    assert key == [
        (r["method"], r["seed"], r["metric"], r["counts"]) for r in noisy["runs"]
    ]  # the same training
    assert quiet["config"]["clock"] == "work" and quiet["envelope"] == noisy["envelope"]
    assert quiet["controls"] == noisy["controls"] and _tables(quiet) == _tables(noisy)
    for a, b in zip(quiet["summary"], noisy["summary"], strict=True):
        assert {k: a[k] for k in JUDGED} == {k: b[k] for k in JUDGED}, a["method"]
    slow = {r["method"]: r for r in noisy["summary"]}
    fast = {r["method"]: r for r in quiet["summary"]}
    assert (
        slow["infobatch"]["time_s_mean"] > fast["infobatch"]["time_s_mean"] + 0.2
    )  # ~30 steps x 10 ms a run
    assert slow["infobatch"]["actual_speedup"] < fast["infobatch"]["actual_speedup"]
    assert quiet["envelope"]["rows"][0]["verdict"] in ("better", "on", "worse")  # judged: every seed inside


def test_the_wall_clock_judges_by_time_when_asked(one_thread: None) -> None:
    engine_tasks.NOISE.update(
        {"infobatch": 0.05}
    )  # ten times its training time: slower than every baseline run
    wall = _study(clock="wall")
    row = wall["envelope"]["rows"][0]
    assert wall["config"]["clock"] == wall["envelope"]["clock"] == "wall"
    assert row["verdict"] == "out of range" and row["slower"] == 3
    assert row["per_seed"][0]["cost"] == next(
        r["train_time_s"] for r in wall["runs"] if r["method"] == "infobatch" and r["seed"] == 0
    )


def _run(label: str, seed: int, time_s: float, work: int, metric: float = 90.0) -> RunRecord:
    epoch = EpochRecord(0, metric, time_s, time_s, steps=1, loaded=work, forwarded=work, backpropagated=work)
    return RunRecord(label, "baseline" if label.startswith("baseline") else "sb", seed, metric, [epoch],
                     train_time_s=time_s, num_samples=100, num_epochs=1)  # fmt: skip


def test_the_realisation_has_its_spread_and_says_when_noise_hides_a_saving() -> None:
    runs = [_run("baseline", 0, 10.0, 100), _run("baseline", 1, 14.0, 100),  # the baseline's own spread: 24%
            _run("obs", 0, 9.0, 50), _run("obs", 1, 13.0, 50), _run("ib", 0, 5.0, 60), _run("ib", 1, 7.0, 60)]  # fmt: skip
    cfg = {
        "methods": [{"label": m, "control": None} for m in ("baseline", "obs", "ib")],
        "goal": "max",
        "seeds": [0, 1],
    }
    payload = build_results(runs, cfg, {})
    rows = {r["method"]: r for r in payload["summary"]}
    assert rows["obs"]["ideal_speedup"] == pytest.approx(2.0) and rows["obs"]["cost_mean"] == pytest.approx(
        0.5
    )
    assert rows["obs"]["actual_speedup"] == pytest.approx((10 / 9 + 14 / 13) / 2)  # paired by seed
    assert rows["obs"]["actual_speedup_std"] == pytest.approx(abs(10 / 9 - 14 / 13) / 2**0.5)
    assert rows["obs"]["achieved_of_ideal"] == pytest.approx((10 / 9 + 14 / 13) / 4)
    assert payload["timing"]["within_noise"] == ["obs"]  # 8% saved in time, inside the baseline's 24%
    text = format_results(payload)
    noise = [line for line in text.splitlines() if line.startswith("timing noise")]
    assert len(noise) == 1 and "obs" in noise[0] and "ib" not in noise[0]
    quiet = build_results([r for r in runs if not (r.method == "baseline" and r.seed == 1)], cfg, {})
    assert quiet["timing"] == {"baseline_spread": None, "within_noise": []}  # one baseline run: no spread


def test_a_wall_clock_study_is_judged_again_on_the_work_clock() -> None:
    """A results.json judged by wall time is judged again on the work clock from its runs' counts."""
    from leanbatch.engine.judging.parts import rebuild

    runs = [_run("baseline", s, 10.0, 100, 90.0 + s) for s in (0, 1)]
    runs += [_run("baseline[budget=0.5]", s, 4.0, 50, 85.0 + s) for s in (0, 1)]
    runs += [_run("obs", s, 9.0, 60, 88.0 + s) for s in (0, 1)]  # 60% of the work, 90% of the time
    for r in runs:
        r.budget = 0.5 if "budget" in r.method else 1.0
    cfg = {
        "methods": [{"label": r.method, "control": None} for r in runs[::2]],
        "goal": "max",
        "seeds": [0, 1],
    }
    old = build_results(runs, {**cfg, "clock": "wall"}, {})
    assert old["envelope"]["rows"][0]["per_seed"][0]["range"] == "inside"  # 9 s: between 4 and 10
    new = rebuild(old, clock="work")
    per_seed = new["envelope"]["rows"][0]["per_seed"]
    assert new["config"]["clock"] == "work" and [p["cost"] for p in per_seed] == pytest.approx([0.6, 0.6])
    assert [p["reference"] for p in per_seed] == pytest.approx([86.0, 87.0])  # 85 + (90 - 85) x 0.2, per seed
