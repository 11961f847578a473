"""The run contract through ``leanbatch bench --task`` and the Python call: the arms train what their
budgets say (read from the records), the engine refuses a task that ignores them, the metric has a
name and a direction, the arms take turns epoch by epoch with their own global random state, the
clock leaves ``run.untimed()`` out, and every bad input is one line, exit status 2, nothing
finished lost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from leanbatch import cli
from leanbatch.engine.judging.parts import rebuild
from leanbatch.engine.study import bench

TASKS = Path(__file__).resolve().parent / "engine_tasks.py"
QUIET = ["--no-plots", "--no-progress", "--threads", "1"]
SNIPPET = """
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

def train(run):
    torch.manual_seed(run.seed)
    model = torch.nn.Linear(4, 2)
    ds = run.wrap(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), 2)
    loader = DataLoader(ds, batch_size=run.batch_size(16), sampler=ds.sampler)
    for epoch in range(ds.epoch, 2):
        ds.set_epoch(epoch)
        for x, y in loader:
            ds.update(F.cross_entropy(model(x), y, reduction="none")).backward()
        run.log(epoch=epoch, metric=1.0)
    return 1.0
"""


def _bench(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str, dict]:  # type: ignore[type-arg]
    code = cli.main(["bench", "--task", f"{TASKS}:{name}", *QUIET, "--out", str(tmp_path), *extra])
    out, err = capsys.readouterr()
    path = tmp_path / "results.json"
    return code, out, err, json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture(autouse=True)
def _threads() -> object:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_task_file_gets_the_envelope_and_the_controls_and_its_budgets_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err, payload = _bench(
        "train", tmp_path, capsys, "--methods", "baseline,infobatch,random", "--controls", "--seeds", "0,1"
    )
    assert code == 0, err
    runs = {(r["method"], r["seed"]): r for r in payload["runs"]}
    full = runs["baseline", 0]
    assert [e["steps"] for e in full["epochs"]] == [12, 12, 12] and full["num_samples"] == 384  # 384 / 32
    for b in (0.5, 0.7, 0.85):  # round(b x 36) steps of 32 rows, the schedule over them
        steps = [e["steps"] for e in runs[f"baseline[budget={b:g}]", 0]["epochs"]]
        assert sum(steps) == math.floor(b * 36 + 0.5) and max(steps) == 12, (b, steps)
    for c, rows in (
        (0.5, 16),
        (0.7, 22),
    ):  # the full run's 36 steps on round(c x 32) rows: fewer epochs of data
        run = runs[f"baseline[batch={c:g}]", 0]
        assert sum(e["steps"] for e in run["epochs"]) == 36 and run["loaded_fraction"] == pytest.approx(
            36 * rows / (3 * 384), abs=0.03
        )
    assert (
        runs["infobatch", 0]["loaded_fraction"] < 0.95
        and runs["infobatch", 0]["epochs"][1]["pruning"] is True
    )
    env = {r["method"]: r for r in payload["envelope"]["rows"]}
    assert set(env) == {"infobatch", "random"} and all(r["verdict"] != "no envelope" for r in env.values())
    (control,) = payload["controls"]["rows"]
    assert (control["method"], control["control"], control["seeds"]) == ("infobatch", "random", [0, 1])
    assert payload["config"]["goal"] == "max" and payload["config"]["metric"] == "metric"
    answer = out.strip().split("\n\n")[-1]  # the last block: the answer, no tables printed
    assert answer.startswith("the answer (metric") and "| " not in out
    assert "  infobatch: " in answer and "vs the envelope" in answer and "vs its twin random" in answer


@pytest.mark.parametrize(
    ("metric", "goal", "verdict"),
    [("eval_loss", None, "better"), ("eval_loss", "max", "worse"), ("score", None, "better")],
)
def test_a_lower_is_better_metric_gets_its_verdict_the_right_way_up(
    metric: str, goal: str | None, verdict: str
) -> None:
    report = bench(
        _task("loss_by_steps"), methods="baseline,infobatch[delta=1]", seeds=[0, 1, 2], budgets=[0.25, 1.0],
        batch_budgets=[0.5], metric=metric, goal=goal,
    )  # fmt: skip
    assert report["config"]["goal"] == (goal or ("min" if metric == "eval_loss" else "max"))
    payload = json.loads(json.dumps(dict(report)))
    for run in payload[
        "runs"
    ]:  # a clock of steps (0.9 s a pruned epoch's step): the verdict by the metric alone
        run["train_time_s"] = run["train_cpu_time_s"] = run["steps"] * (
            1.0 if run["kind"] == "baseline" else 0.9
        )
    (row,) = rebuild(payload)["envelope"]["rows"]
    assert row["verdict"] == verdict and all(s["range"] == "inside" for s in row["per_seed"]), row
    assert ("lower is better" if report["config"]["goal"] == "min" else "higher is better") in report.text


def _task(name: str):  # type: ignore[no-untyped-def]
    return _task_at(TASKS, name)


def _task_at(path: Path, name: str = "train"):  # type: ignore[no-untyped-def]
    from leanbatch.engine.running.contract import load_task

    return load_task(f"{path}:{name}")


def test_the_python_call_returns_what_results_json_holds(tmp_path: Path) -> None:
    report = bench(
        _task("train"),
        methods="baseline,random",
        seeds=[0],
        budgets="0.5,1",
        batch_budgets="none",
        out=tmp_path,
    )
    stored = json.loads((tmp_path / "results.json").read_text())
    assert set(stored) == set(report) and stored["summary"] == json.loads(json.dumps(report["summary"]))
    assert stored["runs"] == json.loads(json.dumps(report["runs"]))
    assert {p.name for p in tmp_path.iterdir()} >= {
        "results.json",
        "report.html",
        "metric_vs_time.png",
        "equal_time.png",
    }
    html = (tmp_path / "report.html").read_text()
    assert (
        html.count("<table>") >= 3 and html.count("data:image/png;base64,") >= 2 and 'src="http' not in html
    )


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        (
            "ignores_batch_size",
            "baseline[batch=0.5] seed 0: trained a batch of 32 rows where run.batch_size(32) gave 16",
        ),
        ("no_batch_size", "baseline[batch=0.5] seed 0: its budget needs the loader's batch size"),
        (
            "fixed_loop",
            "baseline[batch=0.5] seed 0: trained 16 samples but its data served 0: pass sampler=ds.sampler",
        ),
    ],
)
def test_a_task_that_ignores_its_budget_stops_the_study(
    name: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err, payload = _bench(
        name, tmp_path, capsys, "--methods", "baseline", "--budgets", "none", "--batch-budgets", "0.5"
    )
    assert code == 2 and err.count("\n") == 1 and needle in err and "the study stopped" in err, err
    assert "Traceback" not in err and payload == {}  # nothing half-judged is written


def test_a_module_and_function_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_tasks.py").write_text(SNIPPET)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["bench", "--task", "my_tasks:train", *QUIET, "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = json.loads((tmp_path / "o" / "results.json").read_text())
    runs = payload["runs"]
    assert all(r["num_samples"] == 64 for r in runs)
    # the default methods that select are left out at their first step: the task never calls run.select
    assert payload["config"]["left_out"] == ["sb", "infobatch+sb"] and "sb, infobatch+sb left out" in out
    budgets = {f"baseline[budget={b}]" for b in (0.5, 0.7, 0.85)} | {
        "baseline[batch=0.5]",
        "baseline[batch=0.7]",
    }
    assert {r["method"] for r in runs} == {"baseline", "random", "infobatch"} | budgets


def test_an_arm_that_raises_is_reported_and_the_others_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err, payload = _bench(
        "raises_in_infobatch",
        tmp_path,
        capsys,
        "--methods",
        "baseline,infobatch,random",
        "--budgets",
        "none",
        "--batch-budgets",
        "none",
        "--seeds",
        "0,1",
    )
    assert code == 2 and err.count("\n") == 1
    assert "infobatch seed 0: the task raised ZeroDivisionError: the user's bug (and 1 more arm(s)" in err
    assert sorted((r["method"], r["seed"]) for r in payload["runs"]) == [
        ("baseline", 0),
        ("baseline", 1),
        ("random", 0),
        ("random", 1),
    ]
    assert [(f["method"], f["seed"]) for f in payload["failed"]] == [("infobatch", 0), ("infobatch", 1)]


@pytest.mark.parametrize(
    ("task", "extra", "needle"),
    [
        ("no/such/task.py:train", [], "--task no/such/task.py: no such file"),
        (f"{TASKS}:nothing", [], "has no 'nothing'"),
        (f"{TASKS}:NOT_CALLABLE", [], "is a int, not a function"),
        (f"{TASKS}:two_args", [], "takes (run, extra): a task takes one argument, the run"),
        (f"{TASKS}:train", ["--lr", "0.1"], "--lr is an option of the built-in image task"),
        (
            f"{TASKS}:train",
            ["--seeds", "12345678901234567890123"],
            "--seeds must be integers from 0 to 2147483647",
        ),
        ("math:pow", [], "math:pow takes (x, y, /): a task takes one argument, the run"),
    ],
)
def test_bad_tasks_are_one_line_before_anything_trains(
    task: str, extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if task == "SNIPPET":  # a task file that never mentions run.select
        (tmp_path / "snippet.py").write_text(SNIPPET)
        task = f"{tmp_path / 'snippet.py'}:train"
    code = cli.main(["bench", "--task", task, *QUIET, "--out", str(tmp_path / "o"), *extra])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("name", "extra", "needle"),
    [
        ("returns_none", [], "baseline seed 0: the task returned no number"),
        (
            "loss_by_steps",
            ["--metric", "accuracy"],
            "the task returned {eval_loss, score} but not the metric 'accuracy': name the one to judge with "
            "--metric NAME (eval_loss, score)",
        ),
    ],
)
def test_a_task_that_returns_no_metric_stops_the_study(
    name: str, extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--methods", "baseline", "--budgets", "none", "--batch-budgets", "none", "--seeds", "0,1", *extra)
    code, out, err, payload = _bench(name, tmp_path, capsys, *args)
    assert code == 2 and err.count("\n") == 1 and needle in err and "the study stopped" in err, err
    assert payload == {}


def test_an_arm_that_returns_nan_fails_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err, payload = _bench(
        "returns_nan",
        tmp_path,
        capsys,
        "--methods",
        "baseline",
        "--budgets",
        "none",
        "--batch-budgets",
        "none",
    )
    assert (
        code == 2
        and err.count("\n") == 1
        and "the task returned nan as its metric: a finite number is needed" in err
    )
    assert payload["runs"] == [] and len(payload["failed"]) == 1


def test_arms_take_turns_epoch_by_epoch_and_a_task_without_run_log_runs_whole() -> None:
    task = _task("logged")
    order = __import__(task.__module__).ORDER
    bench(task, methods="baseline,random", seeds=[0], budgets="0.5,1", batch_budgets="none")
    full, half, rnd = "baseline", "baseline[budget=0.5]", "random"  # 36 steps; 18: an epoch and a half
    assert order == [  # the budget arm first: the strictest contract shows its breach at once
        (half, 0),
        (full, 0),
        (rnd, 0),
        (full, 1),
        (rnd, 1),
        (full, 2),
        (rnd, 2),
        (half, 1),
        (half, 2),
    ]
    # (its third epoch serves nothing: the arm has ended)
    report = bench(
        _task("whole"), methods="baseline,random", seeds=[0, 1], budgets="none", batch_budgets="none"
    )
    assert [(r["method"], r["seed"], r["epochs"]) for r in report["runs"]] == [
        ("baseline", 0, []),
        ("random", 0, []),
        ("random", 1, []),
        ("baseline", 1, []),
    ]  # fmt: skip (whole runs, the order rotated per seed)


def test_the_clock_counts_training_only_and_turns_keep_each_arms_global_random_state() -> None:
    task = _task("clocked")
    epoch = bench(
        task, methods="baseline,random", seeds=[0], budgets="0.5,1", batch_budgets="none", clock="cpu"
    )
    whole = bench(
        task, methods="baseline,random", seeds=[0], budgets="0.5,1", batch_budgets="none", interleave="run"
    )
    for a, b in zip(
        epoch["runs"],
        sorted(whole["runs"], key=lambda r: [x["method"] for x in epoch["runs"]].index(r["method"])),
        strict=True,
    ):
        assert (
            a["method"] == b["method"] and a["metric"] == b["metric"]
        )  # torch.rand per step: the same numbers
        assert a["untimed_s"] >= 3 * 0.15 and a["train_time_s"] < 0.15, a  # the sleeps are off the clock


def test_the_tabular_example_runs_every_kind_of_arm_through_the_selection_hook() -> None:
    """``examples/tabular_task.py``, cut to 1,200 rows and 3 epochs: pruning, batch-level selection and
    its twin, a budget, all through one loop."""
    task = _task_at(TASKS.parent.parent / "examples" / "tabular_task.py")
    example = __import__("sys").modules[task.__module__]
    example.EPOCHS, example.X_TRAIN, example.Y_TRAIN = 3, example.X_TRAIN[:1200], example.Y_TRAIN[:1200]
    report = bench(task, methods="baseline,infobatch,obs[keep=0.5],sb[scale_factor=1,start=0]", seeds=[0], controls=True,
                   budgets="0.5,1", batch_budgets="none", metric="accuracy")  # fmt: skip
    runs = {r["method"]: r for r in report["runs"]}
    assert report["failed"] == [] and set(runs) == {"baseline", "baseline[budget=0.5]", "infobatch", "infobatch~random", "obs[keep=0.5]",
                                                   "obs[keep=0.5]~uniform", "sb[scale_factor=1,start=0]", "sb[scale_factor=1,start=0]~uniform"}  # fmt: skip
    assert runs["obs[keep=0.5]"]["backward_fraction"] == pytest.approx(0.5, abs=0.03)  # half of every batch
    sb, twin = runs["sb[scale_factor=1,start=0]"], runs["sb[scale_factor=1,start=0]~uniform"]
    assert (
        sb["forward_fraction"] > 1.1 > 1.0 > twin["forward_fraction"] == twin["backward_fraction"]
    )  # its scoring pass
    assert all(r["metric"] > 40 for r in runs.values()), {
        k: r["metric"] for k, r in runs.items()
    }  # chance: 25%
