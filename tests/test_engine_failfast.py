"""A breach of the contract every arm shares stops the study at its first sign, and the three contract
bugs of issue 30 stay fixed.

- A missing metric, a batch larger than ``run.batch_size(B)`` and a budget the loop cannot train
  stop the study within the first arm's first epoch (a task that counts what it trained): exit
  status 2, one line naming the arm and the fix, nothing written; the Python call raises a
  ``ValueError`` that names its ``metric=`` argument.
- A loader that drops its last partial batch (``drop_last=True``): the budgets count the loader's
  real steps.
- A task whose loop lives in a helper module: nothing is guessed from its bytecode; it runs, and a
  task that truly never calls ``run.select`` is stopped (or, with the default methods, those arms
  left out) at the first step.
- Parts of two different tasks that share a function name do not merge.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import engine_task_helper  # noqa: E402  (tests/ is on the path)
import engine_tasks  # noqa: E402
import pytest
import torch

from leanbatch import cli
from leanbatch.engine import bench

HERE = Path(__file__).resolve().parent
TASKS = HERE / "engine_tasks.py"
QUIET = ["--no-plots", "--no-progress", "--threads", "1"]


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _loaded(path: Path) -> ModuleType:
    """The module ``leanbatch bench --task path:...`` loaded (its counters)."""
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path)
                and m.__name__.startswith("leanbatch_task_"))  # fmt: skip


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("misnamed_metric", "run.log(...) gave accuracy but no 'metric': name it with --metric accuracy"),
        (
            "hard_coded_batch",
            "trained a batch of 32 rows where run.batch_size(32) gave 16: build the DataLoader",
        ),
        ("skips_batches", "epoch 0 trained 12 steps where its 384 samples make 24 batches of 16"),
        ("mean_loss", "update(): loss is a scalar: pass per-sample losses, e.g. F.cross_entropy("),
    ],
)
def test_a_shared_breach_stops_the_study_in_the_first_arms_first_epoch(
    name: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    code = cli.main(["bench", "--task", f"{TASKS}:{name}", "--seeds", "0,1,2", *QUIET, "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"baseline[batch=0.5] seed 0: {needle}" in err and "the study stopped, nothing written" in err
    assert not (out / "results.json").exists() and not (out / "results.partial.json").exists()
    trained = _loaded(TASKS).TRAINED  # what the task itself counted: one arm, within its first epoch
    assert list(trained) == ["baseline[batch=0.5]"] and len(trained["baseline[batch=0.5]"]) == 1, trained
    assert trained["baseline[batch=0.5]"][0] <= 384 // 16


def test_from_python_a_missing_metric_names_the_metric_argument() -> None:
    engine_tasks.TRAINED.clear()
    with pytest.raises(ValueError, match=r"name it with metric='accuracy'; the study stopped") as caught:
        bench(engine_tasks.misnamed_metric, methods="baseline,infobatch", seeds=[0, 1])
    assert "--metric" not in str(caught.value) and sum(map(len, engine_tasks.TRAINED.values())) == 1
    with pytest.raises(ValueError, match=r"name the one to judge with metric='NAME' \(eval_loss, score\)"):
        bench(engine_tasks.loss_by_steps, methods="baseline", budgets="none", batch_budgets="none")


def test_a_loader_that_drops_its_last_batch_trains_its_budgets() -> None:
    report = bench(
        engine_tasks.drops_last, methods="baseline", seeds=[0], budgets="0.5,0.7,1", batch_budgets="0.5"
    )
    assert report["failed"] == []
    steps = {r["method"]: r["steps"] for r in report["runs"]}
    full = steps["baseline"]
    assert full == engine_tasks.EPOCHS * (384 // 40)  # the loader's own steps: 9 an epoch, not 10
    for share in (0.5, 0.7):
        assert steps[f"baseline[budget={share}]"] == math.floor(share * full + 0.5)
    assert steps["baseline[batch=0.5]"] == full  # the full run's steps on batches of 20 (19 an epoch)
    for run in report["runs"]:
        assert run["epochs"][-1]["values"]["progress"] == 1.0  # the schedule reaches its end
        assert run["counts"]["dropped"] > 0  # the partial batches were served, not trained


def test_a_loop_in_a_helper_module_runs_its_selecting_arms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    helper = HERE / "engine_task_helper.py"
    args = ["--methods", "baseline,sb[scale_factor=1],obs", "--budgets", "none", "--batch-budgets", "none"]
    code = cli.main(["bench", "--task", f"{helper}:train", *QUIET, *args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert {r["method"]: r["backward_fraction"] < 1.0 for r in runs} == {
        "baseline": False,
        "sb[scale_factor=1]": True,
        "obs": True,
    }


def test_a_task_without_the_hook_stops_a_selecting_arm_at_its_first_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_tasks.TRAINED.clear()
    args = ["--methods", "sb,baseline", "--budgets", "none", "--batch-budgets", "none", "--seeds", "0,1"]
    code = cli.main(
        [
            "bench",
            "--task",
            f"{TASKS}:misnamed_metric",
            *QUIET,
            *args,
            "--metric",
            "accuracy",
            "--out",
            str(tmp_path),
        ]
    )
    _, err = capsys.readouterr()
    assert (
        code == 2
        and err.count("\n") == 1
        and "sb seed 0: it selects rows of each batch, but the task trained a step without run.select" in err
    ), err
    trained = _loaded(TASKS).TRAINED  # sb stopped at its first step, the baseline in its first epoch
    assert trained["sb"] == [0] and len(trained["baseline"]) == 1 and not (tmp_path / "results.json").exists()


def test_parts_of_two_tasks_of_one_name_do_not_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kw = {"seeds": [0], "budgets": "none", "batch_budgets": "none"}
    a = bench(engine_tasks.train, methods="baseline", out=tmp_path / "a", plots=False, **kw)
    b = bench(engine_task_helper.train, methods="random", out=tmp_path / "b", plots=False, **kw)
    code = cli.main(
        ["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m"), "--no-plots"]
    )
    _, err = capsys.readouterr()
    assert (
        code == 2
        and "trained different tasks (engine_task_helper:train" in err
        and "engine_tasks:train" in err
    ), err
    assert a["config"]["task"] == b["config"]["task"] == "train"  # one name: the identity tells them apart
    assert (a["config"]["task_id"]["module"], b["config"]["task_id"]["module"]) == (
        "engine_tasks",
        "engine_task_helper",
    )
    same = bench(engine_tasks.train, methods="random", out=tmp_path / "c", plots=False, **kw)
    assert same["config"]["task_id"] == a["config"]["task_id"] and len(a["config"]["task_id"]["sha256"]) == 64
    assert (
        cli.main(
            ["report", str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "n"), "--no-plots"]
        )
        == 0
    )
