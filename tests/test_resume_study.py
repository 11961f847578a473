"""A study killed (``kill -9``) and started again on the same ``--out`` keeps its finished runs and
trains only the rest: the result equals an uninterrupted study's, and no run trains twice.

The task (``engine_tasks.counted``) appends every finished training to a file, so the count of
trainings is the task's own, not the engine's word; it stalls, saying so, once N runs are counted,
and the test kills the process there: a real process, a real SIGKILL.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from test_faults import Child

from leanbatch import cli
from leanbatch.engine.judging.journal import JOURNAL

TASK = str(Path(__file__).resolve().parent / "engine_tasks.py") + ":counted"
STUDY = ["--task", TASK, "--methods", "baseline,random", "--budgets", "0.5,1", "--batch-budgets", "none"]
STUDY += ["--seeds", "0,1", "--no-plots", "--no-progress", "--threads", "1"]
RUNS = 6  # 3 arms x 2 seeds

pytestmark = pytest.mark.usefixtures("restore_torch_globals")


def _bench(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "leanbatch", "bench", *STUDY, *extra, "--out", str(out)]


def _runs(payload: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each run's figures that the training decides (not its timings), by arm and seed."""
    keys = ("metric", "counts", "num_samples", "num_epochs", "work_fraction", "steps")
    return {
        (r["method"], r["seed"]): {
            **{k: r[k] for k in keys},
            "curve": [(e["epoch"], e["metric"], e["forwarded"], e["backpropagated"]) for e in r["epochs"]],
        }
        for r in payload["runs"]
    }


_WALL = ("time", "speedup", "achieved")  # the wall clock's figures: measured, not decided by the training


def _verdicts(payload: dict[str, Any]) -> list[Any]:
    """The judgement on the work clock: the summary (less the wall clock), the envelope, the controls."""
    summary = [{k: v for k, v in row.items() if not any(w in k for w in _WALL)} for row in payload["summary"]]
    return [summary, payload["envelope"], payload["controls"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("whole")
    count = folder / "count.txt"
    child = Child(_bench(folder / "out"), folder, env={"LEANBATCH_TEST_COUNT": str(count)})
    code, _, err = child.finish()
    assert code == 0, err
    assert len(count.read_text().splitlines()) == RUNS
    assert not (folder / "out" / JOURNAL).exists()  # complete: results.json is the record
    return json.loads((folder / "out" / "results.json").read_text())


def test_a_killed_study_started_again_trains_only_the_rest(
    tmp_path: Path, uninterrupted: dict[str, Any]
) -> None:
    out, count = tmp_path / "out", tmp_path / "count.txt"
    env = {"LEANBATCH_TEST_COUNT": str(count)}
    (tmp_path / "stall").write_text("2")
    child = Child(_bench(out), tmp_path, env={**env, "LEANBATCH_TEST_STALL": str(tmp_path / "stall")})
    child.wait_for("stalled in")
    child.proc.send_signal(signal.SIGKILL)
    code, _, _ = child.finish()
    assert code == -signal.SIGKILL
    recorded = len((out / JOURNAL).read_text().splitlines()) - 1  # the study's identity, then a line a run
    assert 2 <= recorded < RUNS and len(count.read_text().splitlines()) == recorded  # every finished run kept
    saved = json.loads((out / "results.json").read_text())  # the save after seed 0: marked unfinished
    assert saved["interrupted"] is True and len(saved["runs"]) < recorded + 1

    again = Child(_bench(out), tmp_path, env=env)
    code, stdout, err = again.finish()
    assert code == 0, err
    assert f"leanbatch: resumed from runs.jsonl: kept {recorded} finished runs (" in stdout
    assert f"), {RUNS - recorded} to train" in stdout
    trained = count.read_text().splitlines()
    assert len(trained) == RUNS and len(set(trained)) == RUNS  # each run trained once, none twice
    payload = json.loads((out / "results.json").read_text())
    assert payload["interrupted"] is False and payload["failed"] == []
    assert _runs(payload) == _runs(uninterrupted)
    assert _verdicts(payload) == _verdicts(uninterrupted)
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]  # the record and the saves gone


def test_runs_of_another_study_are_refused_or_dropped_with_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, count = tmp_path / "out", tmp_path / "count.txt"
    monkeypatch.setenv("LEANBATCH_TEST_COUNT", str(count))
    lines = [{"format": "leanbatch.runs/1", "study": {"metric": "loss"}}]
    (out).mkdir()
    (out / JOURNAL).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["bench", *STUDY, "--seeds", "0", "--methods", "baseline", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"leanbatch: error: {out / JOURNAL} holds the finished runs of another study (")
    assert "pass --fresh to train it all again" in err and len(err.splitlines()) == 1
    assert not count.exists()  # nothing trained
    argv = ["bench", *STUDY, "--seeds", "0", "--methods", "baseline", "--fresh", "--out", str(out)]
    assert cli.main(argv) == 0
    assert len(count.read_text().splitlines()) == 2  # baseline and its budget, from the start
