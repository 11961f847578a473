"""The ``leanbatch`` command end to end: the built-in image task on tiny configurations (seconds,
scikit-learn digits), ``leanbatch report`` (recomputing, merging parts, any malformed file in one
line), a base install's ``--help`` without numpy, ``--version``, and the one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from leanbatch import cli

SRC = str(Path(__file__).resolve().parents[1] / "src")
TASKS = Path(__file__).resolve().parent / "engine_tasks.py"
METHODS = ["baseline", "random", "infobatch", "sb", "infobatch+sb"]
BUDGETS = ["baseline[budget=0.5]", "baseline[budget=0.75]"]
ARMS = ["baseline", *BUDGETS, *METHODS[1:]]
# 3 epochs: epoch 1 prunes (floor(0.875 * 3) = 2 pruning epochs, epoch 0 is unscored), and
# Selective Backprop's window 0.5..0.9 of training covers epochs 1 and 2.
TINY = [
    "bench", "--data", "digits", "--limit-train", "320", "--limit-test", "120", "--epochs", "3",
    "--batch-size", "32", "--widths", "8,16", "--seeds", "0", "--no-progress", "--threads", "1",
    "--budgets", "none", "--batch-budgets", "none",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    """The command sets torch's thread count and denormal flushing for its process: undo both."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    torch.set_flush_denormal(False)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """One full five-method study with two budget baselines, shared by the tests that read its outputs."""
    import contextlib
    import io

    out_dir = tmp_path_factory.mktemp("bench")
    buf = io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(buf):
            code = cli.main(
                [*TINY, "--seeds", "0,1", "--budgets", "0.5,0.75,1", "--out", str(out_dir), "--tables"]
            )
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    return code, buf.getvalue(), out_dir


def test_the_tables_then_the_answer_last(tiny_run: tuple[int, str, Path]) -> None:
    code, out, _ = tiny_run
    assert code == 0 and out.strip().split("\n\n")[-1].startswith("the answer (accuracy, higher is better;")
    answer, rest = out[out.index("the answer: accuracy (higher is better)") :].split("\n\n", 2)[1:]
    rows = [ln.split("|")[1].strip() for ln in answer.splitlines()[2:]]
    assert (
        rows == METHODS[1:] and "work saved" in answer and "vs envelope" in answer and "vs its twin" in answer
    )
    lines = [ln for ln in rest.splitlines() if ln.startswith("| ")]
    heads = [k for k, ln in enumerate(lines) if ln.split("|")[1].strip() == "method"]
    assert len(heads) == 4  # the wall clock's realisation, the summary, the envelope, infobatch vs random
    realised, summary = lines[: heads[1]], lines[heads[1] : heads[2]]
    assert (
        "actual x" in realised[0]
        and "achieved" in realised[0]
        and realised[1].split("|")[4].strip() == "1.00 ± 0.00"
    )
    assert [ln.split("|")[1].strip() for ln in summary[1:]] == ARMS
    assert "accuracy (max)" in summary[0] and "t->target" in summary[0] and "vs envelope" in lines[heads[2]]
    base = summary[1].split("|")
    assert (
        base[3].strip() == "1.000" and base[4].strip() == "0.0%" and base[7].strip() == "1.00"
    )  # work, work saved, ideal x


def test_results_json_is_the_documented_schema(tiny_run: tuple[int, str, Path]) -> None:
    payload = json.loads((tiny_run[2] / "results.json").read_text())
    keys = {
        "schema",
        "command",
        "interrupted",
        "failed",
        "config",
        "versions",
        "data",
        "tolerance",
        "summary",
    }
    assert set(payload) == keys | {"timing", "envelope", "controls", "runs"}
    assert (
        payload["schema"] == "leanbatch.bench/4"
        and payload["interrupted"] is False
        and payload["failed"] == []
    )
    cfg = payload["config"]
    assert (cfg["task"], cfg["metric"], cfg["goal"], cfg["seeds"], cfg["budgets"], cfg["clock"]) == (
        "images",
        "accuracy",
        "max",
        [0, 1],
        [0.5, 0.75, 1.0],
        "work",
    )
    assert (
        cfg["task_id"]["module"] == "leanbatch.tasks.images.task"
        and cfg["task_id"]["function"] == "ImageTask"
    )
    assert cfg["task_config"]["epochs"] == 3 and [m["label"] for m in cfg["methods"]] == ARMS
    assert payload["data"]["num_train"] == 320 and payload["versions"]["torch"]
    rows = {r["method"]: r for r in payload["summary"]}
    assert rows["baseline"]["time_ratio_vs_baseline"] == pytest.approx(1.0)
    assert rows["baseline"]["forward_fraction"] == rows["baseline"]["backward_fraction"] == 1.0
    assert rows["infobatch"]["loaded_fraction"] < 1.0 and rows["sb"]["loaded_fraction"] == 1.0
    assert rows["sb"]["backward_fraction"] < 1.0 < rows["sb"]["forward_fraction"]  # the selection pass
    assert rows["infobatch+sb"]["backward_fraction"] < rows["infobatch"]["backward_fraction"]
    run = next(r for r in payload["runs"] if r["method"] == "baseline")
    assert len(payload["runs"]) == 14 and len(run["epochs"]) == 3 and run["num_samples"] == 320
    assert (
        set(run["epochs"][0]["values"]) == {"test_loss", "train_loss", "lr"}
        and run["metric"] == run["epochs"][-1]["metric"]
    )
    times = [e["train_time_s"] for e in run["epochs"]]
    assert times == sorted(times) and run["untimed_s"] > 0  # evaluation was off the clock
    ib = next(r for r in payload["runs"] if r["method"] == "infobatch")
    assert (
        ib["histograms"]
        and ib["histograms"][0]["threshold"] > 0
        and sum(ib["histograms"][0]["counts"]) == 320
    )


def test_budget_arms_train_their_steps_and_are_compared_at_equal_work(
    tiny_run: tuple[int, str, Path],
) -> None:
    payload = json.loads((tiny_run[2] / "results.json").read_text())
    runs = payload["runs"]
    full = np.mean([r["work_fraction"] for r in runs if r["method"] == "baseline"])
    for r in (r for r in runs if r["kind"] == "baseline"):
        total = math.floor(r["budget"] * 30 + 0.5)  # 320 samples / batch 32 = 10 steps an epoch
        assert r["steps"] == total == sum(e["steps"] for e in r["epochs"][: math.ceil(total / 10)])
        assert r["loaded_fraction"] == pytest.approx(total / 30)
    for row in payload["envelope"]["rows"]:
        assert row["seeds"] == [0, 1]
        for s in row["per_seed"]:
            points = sorted(
                (r["work_fraction"] / full, r["metric"])
                for r in runs
                if r["kind"] == "baseline" and r["seed"] == s["seed"]
            )
            times = [p[0] for p in points]
            if s["range"] == "inside":  # numpy as the independent oracle (one family: the step budgets)
                f = float(np.interp(s["cost"], times, [p[1] for p in points]))
                assert s["reference"] == pytest.approx(f) and s["diff"] == pytest.approx(s["metric"] - f)
            else:
                assert s["range"] == ("faster" if s["cost"] < times[0] else "slower") and s["diff"] is None


def test_the_report_file_and_the_plots_are_written(tiny_run: tuple[int, str, Path]) -> None:
    _, out, out_dir = tiny_run
    for name in ("metric_vs_time.png", "kept_per_epoch.png", "loss_histograms.png", "equal_time.png"):
        png = out_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    page = (out_dir / "report.html").read_text()
    assert (
        page.count("<table>")
        == 7  # the answer, envelope, summary, realisation, twins, every run, environment
        and page.count("data:image/png;base64,") == 4
        and "leanbatch bench --data digits" in page
    )


def test_report_recomputes_and_merges_parts(
    tiny_run: tuple[int, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = json.loads((tiny_run[2] / "results.json").read_text())
    code, out, err = _run(
        ["report", str(tiny_run[2]), "--out", str(tmp_path / "again"), "--no-plots"], capsys
    )
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert code == 0 and again["summary"] == whole["summary"] and again["envelope"] == whole["envelope"], err
    assert not (tmp_path / "again" / "equal_time.png").exists()
    code, out, err = _run(
        ["report", str(tiny_run[2]), "--out", str(tmp_path / "cpu"), "--clock", "cpu", "--no-plots"], capsys
    )
    cpu = json.loads((tmp_path / "cpu" / "results.json").read_text())
    assert code == 0 and cpu["config"]["clock"] == cpu["envelope"]["clock"] == "cpu" and "cpu clock" in out, (
        err
    )
    assert cpu["envelope"]["families"]["steps"][0]["cost_mean"] == pytest.approx(
        np.mean([r["train_cpu_time_s"] for r in whole["runs"] if r["method"] == "baseline[budget=0.5]"])
    )
    parts = []  # by seed, and by arm: one part holds the methods, the other the baselines
    for name, keep in (("seed1", lambda r: r["seed"] == 1), ("seed0-methods", lambda r: r["seed"] == 0 and r["kind"] != "baseline"),
                       ("seed0-baselines", lambda r: r["seed"] == 0 and r["kind"] == "baseline")):  # fmt: skip
        runs = [r for r in whole["runs"] if keep(r)]
        methods = [m for m in whole["config"]["methods"] if any(r["method"] == m["label"] for r in runs)]
        seeds = sorted({r["seed"] for r in runs})
        parts.append(tmp_path / f"{name}.json")
        parts[-1].write_text(
            json.dumps(
                {**whole, "config": {**whole["config"], "seeds": seeds, "methods": methods}, "runs": runs}
            )
        )
    code, _, err = _run(["report", *map(str, parts), "--out", str(tmp_path / "merged"), "--no-plots"], capsys)
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert code == 0, err
    for key in ("summary", "envelope", "controls"):
        assert merged[key] == whole[key], key
    assert merged["config"]["seeds"] == [0, 1] and [m["seeds"] for m in merged["merged_from"]] == [
        [1],
        [0],
        [0],
    ]
    assert _run(["report", *map(str, parts)], capsys)[0] == 2  # several parts need --out
    code, _, err = _run(["report", str(parts[0]), str(parts[0]), "--out", str(tmp_path / "twice")], capsys)
    assert code == 2 and "seed 1" in err and "seed1.json" in err
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {
                **json.loads(parts[1].read_text()),
                "config": {**json.loads(parts[1].read_text())["config"], "metric": "loss"},
            }
        )
    )
    code, _, err = _run(["report", str(parts[0]), str(other), "--out", str(tmp_path / "other")], capsys)
    assert code == 2 and "metric differ" in err and "other.json" in err


def _malformed(tiny: dict, case: str) -> object:  # type: ignore[type-arg]
    p = json.loads(json.dumps(tiny))
    if case == "config-null":
        p["config"] = None
    elif case == "config-string":
        p["config"] = "x"
    elif case == "run-without-epochs":
        del p["runs"][0]["epochs"]
    elif case == "num-samples-0":
        p["runs"][0]["num_samples"] = 0
    elif case == "epochs-string":
        p["runs"][0]["epochs"] = "3"
    elif case == "tolerance-null":
        p["tolerance"] = None
    elif case == "seed-string":
        p["runs"][1]["seed"] = "0"
    elif case == "metric-nan":
        p["runs"][0]["metric"] = float("nan")
    elif case == "methods-string":
        p["config"]["methods"] = "baseline"
    elif case == "old-schema":
        p["schema"] = "leanbatch.bench/2"
    elif case == "epoch-not-dict":
        p["runs"][0]["epochs"][0] = [1, 2]
    elif case == "budget-zero":
        p["runs"][0]["budget"] = 0
    return p


@pytest.mark.parametrize(
    "case",
    ["config-null", "config-string", "nested", "run-without-epochs", "num-samples-0", "epochs-string", "tolerance-null",
     "seed-string", "metric-nan", "methods-string", "old-schema", "epoch-not-dict", "budget-zero"],
)  # fmt: skip
def test_report_on_any_malformed_results_json_is_one_line(
    case: str, tiny_run: tuple[int, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    if case == "nested":  # lists a hundred thousand deep
        path.write_text('{"schema": "leanbatch.bench/3", "runs": ' + "[" * 100000 + "]" * 100000 + "}")
    else:
        path.write_text(json.dumps(_malformed(json.loads((tiny_run[2] / "results.json").read_text()), case)))
    code, out, err = _run(["report", str(path), "--no-plots"], capsys)
    assert code == 2 and not out and err.count("\n") == 1 and "Traceback" not in err, (case, err)
    assert not (tmp_path / "results.report").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{oops", "cannot read as JSON"),
        ('{"a": 1}', "not a leanbatch bench results.json"),
    ],
)
def test_report_of_what_is_no_results_json_is_one_line(
    content: str | None, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 2 and not out and err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_same_seed_same_result(
    tmp_path: Path, tiny_run: tuple[int, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = _run([*TINY, "--methods", "infobatch", "--out", str(tmp_path), "--no-plots"], capsys)
    again = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    ref = next(
        r
        for r in json.loads((tiny_run[2] / "results.json").read_text())["runs"]
        if r["method"] == "infobatch" and r["seed"] == 0
    )
    assert code == 0 and [e["loaded"] for e in again["epochs"]] == [e["loaded"] for e in ref["epochs"]]
    assert [e["metric"] for e in again["epochs"]] == [
        e["metric"] for e in ref["epochs"]
    ]  # alone or among 7 arms


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--methods", "baseline,fancy"], "unknown method 'fancy'"),
        (["--methods", "infobatch[prune_ratio=2]"], "prune_ratio must be in [0, 1)"),
        (["--data", "imagenet"], "unknown dataset 'imagenet'"),
        (["--data", "/does/not/exist.npz"], "data path does not exist"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--epochs", "two"], "argument --epochs: expected an integer, got 'two'"),
        (["--batch-size", "5000"], "larger than the training set (320 samples)"),
        (["--seeds", "a,b"], "--seeds must be comma-separated integers"),
        (["--seeds", "1,1"], "--seeds must be distinct integers"),
        (["--seeds", "12345678901234567890123"], "--seeds must be integers from 0 to 2147483647"),
        (["--seeds", "-1"], "--seeds must be integers from 0 to 2147483647"),
        (["--widths", "8,0"], "--widths must be positive integers"),
        (["--device", "tpu"], "device"),
        (["--budgets", "0,1"], "--budgets must be fractions in (0, 4]"),
        (["--methods", "infobatch[budget=0.5]"], "budget applies to baseline only"),
        (["--preset", "cifar10", "--quick"], "--quick and --preset cifar10 conflict"),
        (["--metric", "loss"], "the image task's metric is accuracy"),
        (["--controls", "--methods", "baseline,rs2"], "--controls: none of baseline, rs2 has a uniform twin"),
        (["--batch-budgets", "0.03"], "= 1 rows; a batch budget needs 2 rows"),
    ],
)
def test_bad_input_is_one_line(
    extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([*TINY, *extra, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_the_cifar10_preset_needs_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["bench", "--preset", "cifar10", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and not out and err.count("\n") == 1 and "--preset cifar10 needs --data PATH" in err


def test_a_label_of_ten_billion_is_refused_before_a_model_is_sized_by_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.npz"
    y = np.arange(40) % 3
    y[5] = 10**10
    np.savez(
        path, x_train=np.zeros((40, 8, 8)), y_train=y, x_test=np.zeros((8, 8, 8)), y_test=np.arange(8) % 3
    )
    code, out, err = _run(
        ["bench", "--data", str(path), "--methods", "baseline", "--no-plots", "--out", str(tmp_path / "o")],
        capsys,
    )
    assert (
        code == 2
        and err.count("\n") == 1
        and "labels go up to 10000000000" in err
        and "100,000 classes" in err
    )


@pytest.mark.parametrize("interleave", ["epoch", "run"])
def test_ctrl_c_keeps_the_finished_runs(
    interleave: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "bench",
        "--task",
        f"{TASKS}:interrupted_at_the_fourth_epoch",
        "--seeds",
        "0,1",
        "--methods",
        "baseline,random,infobatch",
    ]
    code, out, err = _run(
        [
            *args,
            "--budgets",
            "none",
            "--batch-budgets",
            "none",
            "--interleave",
            interleave,
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 130 and "Traceback" not in err
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["interrupted"] is True and {(r["method"], r["seed"]) for r in payload["runs"]} == {
        ("baseline", 0),
        ("random", 0),
        ("infobatch", 0),
    }
    assert err.strip().splitlines()[-1].startswith("leanbatch: interrupted; kept the 3 finished run(s)")
    assert "  infobatch: " in out and (tmp_path / "report.html").is_file()


def test_python_dash_m_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "leanbatch", "bench", "--methods", "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "leanbatch: error: unknown method 'nope'; choose from baseline, random, infobatch, sb, infobatch+sb, "
        "rs2, epsilon-greedy, ucb, seta, obs, sb-proxy, obs-epoch, rho-loss, uniform, infobatch+uniform, "
        "token-selection"
    )


_NO_EXTRA = """
import runpy, sys
class NoExtra:  # the bench extra is not installed: numpy and the rest cannot be imported
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"numpy", "mlxtend", "sklearn", "matplotlib", "tqdm", "PIL"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoExtra())
sys.argv = ["leanbatch", *sys.argv[1:]]
runpy.run_module("leanbatch", run_name="__main__", alter_sys=True)  # python -m leanbatch
"""


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["report", "--help"], ["--version"]])
def test_a_base_install_starts_and_shows_its_help(argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _NO_EXTRA, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": SRC, "PATH": ""},
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert ("leanbatch 0.1.0" if argv == ["--version"] else "usage: leanbatch") in proc.stdout


def test_a_base_install_names_the_extra_a_subcommand_needs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _NO_EXTRA, "bench", "--quick", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": SRC, "PATH": ""},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        'needs the bench extra: pip install "leanbatch[bench]"' in proc.stderr
        and not (tmp_path / "o").exists()
    )


def test_help_lists_the_subcommands_and_every_method_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from leanbatch.arms.registry import REGISTRY

    assert cli.main(["--help"]) == 0 and "bench" in capsys.readouterr().out and cli.main([]) == 2
    capsys.readouterr()
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for kind in REGISTRY.values():
        assert any(ln.split()[:1] == [kind.name] for ln in lines), kind.name
        assert " ".join(kind.description.split()) in " ".join(out.split()), kind.name
        for s in kind.settings:
            assert s.describe() in " ".join(out.split()), s.describe()
    twins = [ln.split()[:3] for ln in lines if "->" in ln.split()[1:2]]
    assert twins == [[k.name, "->", f"{k.name}~{k.twin.name}"] for k in REGISTRY.values() if k.twin]


@pytest.mark.parametrize(("sizes", "needle"), [("0", "positive"), ("x,2", "comma-separated integers")])
def test_micro_plan_bad_sizes_are_one_line(
    sizes: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["micro", "plan", "--sizes", sizes], capsys)
    assert code == 2 and err.count("\n") == 1 and f"--sizes must be {needle}" in err and not out
