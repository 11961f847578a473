"""A study on a Ray cluster (``--ray``, ``bench(..., ray=...)``): a local Ray instance of 2 CPUs, started
once for the module, and real trials of real tasks.

- The Ray study of a deterministic task equals the local engine's, run for run (metric, curve, work
  counts) and verdict for verdict.
- Faults: a trial whose worker process is killed (SIGKILL, by the task itself, once) is retried and
  the study completes; a task that raises in one arm is reported once, not retried, and the other
  arms finish; the driver killed with ``kill -9`` (a real ``leanbatch bench --ray ADDRESS`` process
  joined to the module's cluster) and started again trains only the runs it had not recorded.
- A distributed run (2 processes, gloo, DDP) is one trial in a placement group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import engine_tasks  # noqa: E402  (tests/ is on the path)
import pytest
import torch
from test_faults import Child
from test_resume_study import _runs, _verdicts

from leanbatch import cli
from leanbatch.engine import Cluster, bench
from leanbatch.engine.judging.journal import JOURNAL

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("restore_torch_globals")]

HERE = Path(__file__).resolve().parent
STUDY = dict(methods="baseline,random", seeds=[0], budgets="0.5,1", batch_budgets="none", plots=False)
DEADLINE = 240.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local Ray instance of 2 CPUs; the tasks' files (set before it starts: its workers inherit them)."""
    folder = tmp_path_factory.mktemp("ray")
    files = {"LEANBATCH_TEST_COUNT": str(folder / "count.txt"), "LEANBATCH_TEST_STALL": str(folder / "stall"),
             "LEANBATCH_TEST_MARKS": str(folder),  # and the tasks' module, for the workers to import
             "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    ray = pytest.importorskip("ray", reason='the ray extra: pip install "leanbatch[ray]"')
    before = {k: os.environ.get(k) for k in files}
    os.environ.update(files)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield files
    finally:
        ray.shutdown()
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _cluster(files: dict[str, str], **options: Any) -> Cluster:
    """The module's cluster, one torch thread a run, Tune quiet and its logs in the module's folder."""
    return Cluster(threads=1, verbose=0, storage=Path(files["LEANBATCH_TEST_MARKS"]) / "tune", **options)


def test_a_ray_study_equals_the_local_one(cluster: dict[str, str]) -> None:
    torch.set_num_threads(1)
    local = bench(engine_tasks.train, **STUDY)
    on_ray = bench(engine_tasks.train, ray=_cluster(cluster), **STUDY)
    assert len(on_ray["runs"]) == 3 and on_ray["failed"] == [] and on_ray["interrupted"] is False
    assert _runs(on_ray) == _runs(local)
    assert _verdicts(on_ray) == _verdicts(local)


def faulty(run):  # type: ignore[no-untyped-def]
    """``train``, but the first try of ``random`` kills its own worker process after an epoch, and
    ``infobatch`` raises after an epoch; every start is marked in a file."""
    marks = Path(os.environ["LEANBATCH_TEST_MARKS"])
    with open(marks / "starts.txt", "a") as fh:
        fh.write(f"{run.label}\n")
    killed = marks / "killed"

    def log(**values: float) -> None:
        run.log(**values)
        if run.label == "random" and not killed.exists():
            killed.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        if run.label == "infobatch":
            raise ZeroDivisionError("the user's bug")

    return engine_tasks.train(engine_tasks._Logged(run, log))


@pytest.fixture(scope="module")
def faults(cluster: dict[str, str]) -> tuple[Any, list[str]]:
    study = dict(STUDY, methods="random,infobatch", budgets="none")
    report = bench(faulty, ray=_cluster(cluster, retries=1), **study)
    starts = (Path(cluster["LEANBATCH_TEST_MARKS"]) / "starts.txt").read_text().splitlines()
    return report, starts


def test_a_trial_whose_worker_is_killed_is_retried_and_the_study_completes(
    faults: tuple[Any, list[str]],
) -> None:
    report, starts = faults
    assert starts.count("random") == 2  # killed once, tried again
    run = next(r for r in report["runs"] if r["method"] == "random")
    assert [e["epoch"] for e in run["epochs"]] == [0, 1, 2]  # the whole run, from the start
    assert report["interrupted"] is False


def test_a_task_that_raises_in_one_arm_is_reported_once_and_the_others_finish(
    faults: tuple[Any, list[str]],
) -> None:
    report, starts = faults
    assert starts.count("infobatch") == 1  # not retried as a lost worker would be
    assert report["failed"] == [
        {"method": "infobatch", "seed": 0, "error": "the task raised ZeroDivisionError: the user's bug"}
    ]
    assert [r["method"] for r in report["runs"]] == ["random"]


def test_the_driver_killed_and_started_again_trains_only_the_missing_runs(
    cluster: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    count, stall = Path(cluster["LEANBATCH_TEST_COUNT"]), Path(cluster["LEANBATCH_TEST_STALL"])
    count.unlink(missing_ok=True)
    stall.write_text("1")
    import ray

    out, address = tmp_path / "out", ray.get_runtime_context().gcs_address
    argv = ["bench", "--task", f"{HERE / 'engine_tasks.py'}:counted", "--methods", "baseline,random", "--seeds",
            "0,1", "--budgets", "none", "--batch-budgets", "none", "--no-plots", "--no-progress", "--threads", "1"]  # fmt: skip
    child = Child([sys.executable, "-m", "leanbatch", *argv, "--ray", address, "--out", str(out)], tmp_path)
    deadline = time.monotonic() + DEADLINE
    while not Path(f"{stall}.stalled").exists():
        assert time.monotonic() < deadline and child.proc.poll() is None, child.finish()
        time.sleep(0.1)
    child.proc.send_signal(signal.SIGKILL)
    assert child.finish()[0] == -signal.SIGKILL
    stall.unlink()
    kept = {tuple(line.split(" seed ")) for line in _recorded(out)}
    assert kept  # at least the one counted before the stall
    before = len(count.read_text().splitlines())

    assert cli.main([*argv, "--ray", "--out", str(out)]) == 0
    assert f"kept {len(kept)} finished run" in capsys.readouterr().out
    again = count.read_text().splitlines()[before:]
    everything = {(m, s) for m in ("baseline", "random") for s in ("0", "1")}
    assert sorted(tuple(line.split(" seed ")) for line in again) == sorted(everything - kept)
    payload = json.loads((out / "results.json").read_text())
    assert {(r["method"], str(r["seed"])) for r in payload["runs"]} == everything
    assert not (out / JOURNAL).exists()
    curves = [p.read_text().splitlines() for p in (out / "tune").glob("leanbatch-*/*/progress.csv")]
    assert any("metric" in c[0].split(",") and len(c) == 1 + 3 + 1 for c in curves)  # head, 3 logs, end


def _recorded(out: Path) -> list[str]:
    lines = (out / JOURNAL).read_text().splitlines()[1:]
    return [f"{(r := json.loads(line)['run'])['method']} seed {r['seed']}" for line in lines]


def test_a_distributed_run_of_two_gloo_processes_is_one_trial(cluster: dict[str, str]) -> None:
    sys.path.insert(0, str(HERE.parent / "examples"))
    try:
        import distributed_task
    finally:
        sys.path.remove(str(HERE.parent / "examples"))
    report = bench(distributed_task.train, methods="baseline", seeds=[0], budgets="none", batch_budgets="none",
                   metric="accuracy", plots=False, ray=_cluster(cluster, workers=2))  # fmt: skip
    (run,) = report["runs"]
    assert report["failed"] == [] and run["num_samples"] == 1000  # each process trained its half of 2,000
    assert [e["forwarded"] for e in run["epochs"]] == [1000] * distributed_task.EPOCHS
    assert run["metric"] > 40.0  # DDP trained it: 5 classes, chance is 20
    assert report["config"]["world_size"] == 2  # what each run was, not the driver's one process


def test_without_ray_the_option_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed: its import fails
    argv = ["bench", "--task", f"{HERE / 'engine_tasks.py'}:train", "--methods", "baseline", "--ray"]
    assert cli.main([*argv, "--no-plots", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        'leanbatch: error: --ray needs Ray Tune, the ray extra: pip install "leanbatch[ray]"'
    )
    assert len(err.splitlines()) == 1 and not (tmp_path / "out" / JOURNAL).exists()
    monkeypatch.undo()
    assert cli.main([*argv[:-1], "--retries", "2", "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err
        == "leanbatch: error: --retries is an option of --ray: add --ray (docs/ray.md)\n"
    )
