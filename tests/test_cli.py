"""The ``leanbatch`` command end to end on tiny configurations (seconds, scikit-learn digits)."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from leanbatch import cli
from leanbatch.bench import train as train_mod
from leanbatch.bench.train import budget_steps

METHODS = ["baseline", "random", "infobatch", "sb", "infobatch+sb"]
BUDGETS = ["baseline[budget=0.5]", "baseline[budget=0.75]"]
ROWS = ["baseline", *BUDGETS, *METHODS[1:]]
# 3 epochs: epoch 1 prunes (floor(0.875 * 3) = 2 pruning epochs, epoch 0 is unscored),
# and Selective Backprop's window 0.5..0.9 of training covers epochs 1 and 2.
TINY = [
    "bench",
    "--data", "digits",
    "--limit-train", "320",
    "--limit-test", "120",
    "--epochs", "3",
    "--batch-size", "32",
    "--widths", "8,16",
    "--seeds", "0",
    "--no-progress",
    "--threads", "1",  # tiny ops: one thread is faster, and immune to a busy machine
    "--budgets", "none",  # the tests of the frontier say otherwise
    "--batch-budgets", "none",  # the tests of the envelope say otherwise
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
    """One full five-method run with two budget baselines, shared by the tests that read its outputs."""
    import contextlib
    import io

    out_dir = tmp_path_factory.mktemp("bench")
    buf = io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(buf):
            code = cli.main([*TINY, "--seeds", "0,1", "--budgets", "0.5,0.75,1", "--out", str(out_dir)])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    return code, buf.getvalue(), out_dir


def test_bench_prints_a_row_per_method(tiny_run: tuple[int, str, Path]) -> None:
    code, out, _ = tiny_run
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    heads = [k for k, line in enumerate(lines) if line.split("|")[1].strip() == "method"]
    assert len(heads) == 3  # the main table, the equal-time table, the envelope table (no controls asked)
    table, equal, envelope = lines[: heads[1]], lines[heads[1] : heads[2]], lines[heads[2] :]
    assert "vs envelope" in envelope[0] and envelope[-1].split("|")[1].strip() == METHODS[-1]
    assert [row.split("|")[1].strip() for row in table[1:]] == ROWS
    assert "achieved" in table[0] and "t->target" in table[0]
    assert "frontier %" in equal[0] and "verdict" in equal[0]
    assert [row.split("|")[1].strip() for row in equal[1:]] == [*BUDGETS, "baseline", *METHODS[1:]]
    assert all(row.split("|")[-2].strip() == "frontier" for row in equal[1:4])
    base = table[1].split("|")
    assert base[4].strip() == "+0.0%" and base[8].strip() == "1.00"  # vs base, actual x


def test_results_json_schema(tiny_run: tuple[int, str, Path]) -> None:
    _, _, out_dir = tiny_run
    payload = json.loads((out_dir / "results.json").read_text())
    assert payload["schema"] == "leanbatch.bench/2"
    assert payload["interrupted"] is False
    assert set(payload) >= {
        "config", "versions", "data", "summary", "equal_time", "equal_time_cpu", "runs", "command",
        "tolerance_points",
    }  # fmt: skip
    assert payload["equal_time"]["clock"] == "wall" and payload["equal_time_cpu"]["clock"] == "cpu"
    assert payload["config"]["clock"] == "wall"
    assert payload["config"]["epochs"] == 3 and payload["config"]["seeds"] == [0, 1]
    assert payload["config"]["budgets"] == [0.5, 0.75, 1.0]
    assert [m["label"] for m in payload["config"]["methods"]] == ROWS
    assert payload["versions"]["torch"] and payload["versions"]["leanbatch"]
    assert payload["data"]["num_train"] == 320 and payload["data"]["num_test"] == 120
    rows = {r["method"]: r for r in payload["summary"]}
    assert list(rows) == ROWS
    for r in rows.values():
        assert isinstance(r["acc_mean"], float) and 0.0 <= r["acc_mean"] <= 100.0
        assert isinstance(r["train_time_s_mean"], float) and r["train_time_s_mean"] > 0
        assert r["seeds"] == [0, 1]
        for key in (
            "forward_fraction",
            "backward_fraction",
            "work_fraction",
            "ideal_speedup",
            "actual_speedup",
        ):
            assert isinstance(r[key], float) and r[key] > 0, key
    assert rows["baseline"]["time_ratio_vs_baseline"] == pytest.approx(1.0)
    assert rows["baseline"]["forward_fraction"] == rows["baseline"]["backward_fraction"] == 1.0
    assert rows["infobatch"]["loaded_fraction"] < 1.0  # epoch 1 pruned
    assert rows["random"]["loaded_fraction"] < 1.0
    assert rows["sb"]["loaded_fraction"] == 1.0
    assert rows["sb"]["backward_fraction"] < 1.0 < rows["sb"]["forward_fraction"]
    assert rows["infobatch+sb"]["backward_fraction"] < rows["infobatch"]["backward_fraction"]
    assert rows["baseline[budget=0.5]"]["budget"] == 0.5 and rows["infobatch"]["budget"] == 1.0
    assert len(payload["runs"]) == 14
    run = payload["runs"][0]
    assert set(run) >= {"method", "seed", "final_test_acc", "train_time_s", "epochs", "loss_histograms"}
    assert len(run["epochs"]) == 3
    epoch = run["epochs"][0]
    for key in (
        "train_time",
        "test_acc",
        "test_loss",
        "loaded",
        "forwarded",
        "backpropagated",
        "lr",
        "steps",
    ):
        assert key in epoch
    times = [e["train_time"] for e in run["epochs"]]
    assert times == sorted(times)
    assert run["epochs"][-1]["lr"] < 0.01 * payload["config"]["lr"]  # the schedule ends at the end
    ib = next(r for r in payload["runs"] if r["method"] == "infobatch")
    assert ib["loss_histograms"] and ib["loss_histograms"][0]["threshold"] > 0
    assert sum(ib["loss_histograms"][0]["counts"]) == 320


def test_budget_runs_and_equal_time_in_results(tiny_run: tuple[int, str, Path]) -> None:
    payload = json.loads((tiny_run[2] / "results.json").read_text())
    lr = payload["config"]["lr"]
    runs = payload["runs"]
    full = {r["seed"]: r for r in runs if r["method"] == "baseline"}
    for r in (r for r in runs if r["kind"] == "baseline"):
        total = budget_steps(r["budget"], 3, 10)  # 320 samples / batch 32 = 10 steps per epoch
        assert r["steps"] == total == sum(e["steps"] for e in r["epochs"])
        assert len(r["epochs"]) == math.ceil(total / 10)
        assert r["loaded_fraction"] == pytest.approx(total / 30)
        assert r["epochs"][-1]["lr"] < 0.05 * lr  # the schedule ended at the run's own end
        if r["budget"] < 1:  # ... so it decays faster than the full baseline's from the start
            assert r["epochs"][0]["lr"] < full[r["seed"]]["epochs"][0]["lr"]
    section = payload["equal_time"]
    assert [p["budget"] for p in section["frontier"]] == [0.5, 0.75, 1.0]
    assert [row["method"] for row in section["rows"]] == METHODS[1:]
    for row in section["rows"]:
        assert row["seeds"] == [0, 1]
        for s in row["per_seed"]:
            points = sorted(
                (r["train_time_s"], r["final_test_acc"])
                for r in runs
                if r["kind"] == "baseline" and r["seed"] == s["seed"]
            )
            times = [p[0] for p in points]
            inside = times[0] <= s["train_time_s"] <= times[-1]
            assert s["range"] == (
                "inside" if inside else "faster" if s["train_time_s"] < times[0] else "slower"
            )
            if inside:  # numpy as the independent oracle
                f = float(np.interp(s["train_time_s"], times, [p[1] for p in points]))
                assert s["frontier_acc"] == pytest.approx(f) and s["diff"] == pytest.approx(s["acc"] - f)
            else:
                assert s["frontier_acc"] is None and s["diff"] is None
        outside = any(s["range"] != "inside" for s in row["per_seed"])
        assert (row["verdict"] == "out of range") == outside
        if row["verdict"] in ("above", "below"):
            assert row["ci_low"] * row["ci_high"] > 0


def test_plots_written(tiny_run: tuple[int, str, Path]) -> None:
    _, out, out_dir = tiny_run
    for name in ("accuracy_vs_time.png", "kept_per_epoch.png", "loss_histograms.png", "equal_time.png"):
        png = out_dir / name
        assert png.is_file() and png.stat().st_size > 5000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in out


def test_report_recomputes_from_the_runs(
    tiny_run: tuple[int, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = json.loads((tiny_run[2] / "results.json").read_text())
    # an older results.json: schema 1, no budgets, no equal-time sections
    old = {k: v for k, v in original.items() if k not in ("equal_time", "equal_time_cpu")}
    old["schema"] = "leanbatch.bench/1"
    old["summary"] = []
    old["runs"] = [{k: v for k, v in r.items() if k not in ("budget", "steps")} for r in original["runs"]]
    src = tmp_path / "old.json"
    src.write_text(json.dumps(old))
    code, out, err = _run(["report", str(src), "--out", str(tmp_path / "new"), "--clock", "cpu"], capsys)
    assert code == 0, err
    new = json.loads((tmp_path / "new" / "results.json").read_text())
    assert new["schema"] == "leanbatch.bench/2" and new["versions"] == original["versions"]
    assert new["summary"] == [
        {**row, "budget": 1.0} for row in original["summary"]
    ]  # budgets unknown to schema 1
    assert new["runs"][0]["final_test_acc"] == original["runs"][0]["final_test_acc"]
    heads = [line for line in out.splitlines() if line.startswith("| method")]
    assert len(heads) == 3 and "cpu s" in heads[1] and "cpu s" in heads[2] and "time s" in heads[0]
    assert (tmp_path / "new" / "kept_per_epoch.png").is_file()
    # from the current schema, the same figures come back
    code, out, _ = _run(["report", str(tiny_run[2]), "--out", str(tmp_path / "again"), "--no-plots"], capsys)
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert code == 0 and again["summary"] == original["summary"]
    assert again["equal_time"] == original["equal_time"]
    assert not (tmp_path / "again" / "equal_time.png").exists()


def test_report_merges_the_seeds_of_one_bench_run_in_parts(
    tiny_run: tuple[int, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bench split by seed (one invocation per core or machine) reports as the whole; parts that
    are not one bench, or that hold a seed twice, are refused naming the files."""
    whole = json.loads((tiny_run[2] / "results.json").read_text())
    parts = []
    for seed in (1, 0):
        part = {**whole, "config": {**whole["config"], "seeds": [seed]}}
        part["runs"] = [r for r in whole["runs"] if r["seed"] == seed]
        parts.append(tmp_path / f"seed{seed}.json")
        parts[-1].write_text(json.dumps(part))
    code, _, err = _run(["report", *map(str, parts), "--out", str(tmp_path / "merged"), "--no-plots"], capsys)
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert code == 0, err
    for key in ("summary", "equal_time", "envelope", "controls"):
        assert merged[key] == whole[key], key
    assert merged["config"]["seeds"] == [0, 1] and [m["seeds"] for m in merged["merged_from"]] == [[1], [0]]
    code, _, err = _run(["report", *map(str, parts)], capsys)
    assert code == 2 and "--out" in err
    code, _, err = _run(["report", str(parts[0]), str(parts[0]), "--out", str(tmp_path / "twice")], capsys)
    assert code == 2 and "seed 1" in err and "seed1.json" in err
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({**json.loads(parts[1].read_text()), "config": {**whole["config"], "epochs": 9}})
    )
    code, _, err = _run(["report", str(parts[0]), str(other), "--out", str(tmp_path / "other")], capsys)
    assert code == 2 and "epochs differ" in err and "other.json" in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{oops", "cannot read as JSON"),
        ('{"a": 1}', "not a leanbatch bench results.json"),
    ],
)
def test_report_bad_input_is_one_line(
    content: str | None, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 2 and not out
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_same_seed_same_result(
    tmp_path: Path, tiny_run: tuple[int, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = _run([*TINY, "--methods", "infobatch", "--out", str(tmp_path), "--no-plots"], capsys)
    assert code == 0
    again = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    first = json.loads((tiny_run[2] / "results.json").read_text())["runs"]
    ref = next(r for r in first if r["method"] == "infobatch" and r["seed"] == 0)
    assert [e["loaded"] for e in again["epochs"]] == [e["loaded"] for e in ref["epochs"]]
    assert again["final_test_acc"] == ref["final_test_acc"]


def test_method_overrides_make_their_own_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    methods = "baseline,infobatch+sb[sb_start=0.0,sb_keep=0.25,stack_scores=trained]"
    code, out, _ = _run(
        [*TINY, "--epochs", "2", "--methods", methods, "--out", str(tmp_path), "--no-plots"], capsys
    )
    assert code == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    labels = [r["method"] for r in payload["summary"]]
    assert labels == ["baseline", "infobatch+sb[sb_start=0.0,sb_keep=0.25,stack_scores=trained]"]
    cfg = payload["config"]["methods"][1]
    assert cfg["sb_start"] == 0.0 and cfg["sb_keep"] == 0.25 and cfg["stack_scores"] == "trained"
    assert payload["summary"][1]["backward_fraction"] < 0.7


def test_npz_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(
        path,
        x_train=rng.integers(0, 256, (64, 12, 12), dtype=np.uint8),
        y_train=rng.integers(0, 3, 64),
        x_test=rng.integers(0, 256, (16, 12, 12), dtype=np.uint8),
        y_test=rng.integers(0, 3, 16),
    )
    args = ["bench", "--data", str(path), "--epochs", "1", "--batch-size", "16", "--methods", "baseline,sb"]
    code, out, _ = _run([*args, "--widths", "4", "--out", str(tmp_path / "o"), "--no-plots"], capsys)
    assert code == 0, out
    assert "tiny.npz (64 train / 16 test" in out


# ---------------------------------------------------------------------------- bad input
def _cifar_like(root: Path) -> Path:
    root.mkdir()
    (root / "data_batch_1").write_bytes(b"not a pickle")
    (root / "test_batch").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})
    )
    return root


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--methods", "baseline,fancy"], "unknown method 'fancy'"),
        (["--methods", "infobatch[prune_ratio=2]"], "prune_ratio must be in [0, 1)"),
        (["--methods", "sb[nope=1]"], "unknown setting"),
        (["--data", "imagenet"], "unknown dataset 'imagenet'"),
        (["--data", "/does/not/exist.npz"], "data path does not exist"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--epochs", "-3"], "--epochs must be >= 1"),
        (["--epochs", "two"], "argument --epochs: expected an integer, got 'two'"),
        (["--batch-size", "5000"], "larger than the training set (320 samples)"),
        (["--seeds", "a,b"], "--seeds must be comma-separated integers"),
        (["--seeds", "1,1"], "--seeds lists a seed twice"),
        (["--widths", "16.5,32"], "--widths must be comma-separated integers"),
        (["--widths", "8,0"], "--widths must be positive integers"),
        (["--device", "tpu"], "device"),
        (["--budgets", "half"], "--budgets must be comma-separated fractions"),
        (["--budgets", "0,1"], "--budgets must be fractions in (0, 4]"),
        (["--budgets", "0.5,nan"], "--budgets must be fractions in (0, 4]"),
        (["--budgets", "0.5,0.5"], "--budgets lists a budget twice"),
        (["--methods", "infobatch[budget=0.5]"], "budget applies to baseline only"),
        (["--methods", "baseline[budget=-1]"], "budget must be a finite number in (0, 4]"),
        (["--preset", "cifar10", "--quick"], "--quick and --preset cifar10 conflict"),
        (["--preset", "imagenet"], "argument --preset: invalid choice"),
    ],
)
def test_bad_input_is_one_line(
    extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([*TINY, *extra, "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_cifar10_preset_needs_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["bench", "--preset", "cifar10", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and not out
    assert err.count("\n") == 1 and "--preset cifar10 needs --data PATH" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("layout", ["npz-missing", "txt-file", "empty-dir", "broken-cifar", "bad-npz"])
def test_wrong_layout_is_one_line(layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if layout == "npz-missing":
        path = tmp_path / "d.npz"
        np.savez(path, x_train=np.zeros((4, 8, 8)), y_train=np.zeros(4, dtype=int))
        needle = "missing array(s) x_test, y_test"
    elif layout == "txt-file":
        path = tmp_path / "d.txt"
        path.write_text("hello")
        needle = "expected an .npz file or a folder"
    elif layout == "empty-dir":
        path = tmp_path / "empty"
        path.mkdir()
        needle = "not a recognised layout"
    elif layout == "broken-cifar":
        path = _cifar_like(tmp_path / "cifar")
        needle = "not a CIFAR-10 python batch"
    else:
        path = tmp_path / "bad.npz"
        path.write_bytes(b"PK garbage")
        needle = "cannot read as .npz"
    code, _, err = _run(["bench", "--data", str(path), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("interleave", ["epoch", "run"])
def test_ctrl_c_keeps_finished_runs(
    interleave: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = train_mod.Trainer.run_epoch
    calls = {"n": 0}

    def flaky(self: train_mod.Trainer, *args: object, **kwargs: object) -> train_mod.EpochRecord:
        calls["n"] += 1
        if calls["n"] == 4:  # the first epoch of seed 1 (interleaved), or the third run (one by one)
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(train_mod.Trainer, "run_epoch", flaky)
    methods = "baseline,infobatch,sb"
    args = [*TINY, "--epochs", "1", "--seeds", "0,1", "--methods", methods, "--interleave", interleave]
    code, out, err = _run([*args, "--out", str(tmp_path)], capsys)
    assert code == 130
    assert "Traceback" not in err
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["interrupted"] is True
    kept = [(r["method"], r["seed"]) for r in payload["runs"]]
    assert kept == [("baseline", 0), ("infobatch", 0), ("sb", 0)]
    assert err.strip().splitlines()[-1].startswith("leanbatch: interrupted; kept the 3 finished run(s)")
    assert "| infobatch" in out and (tmp_path / "accuracy_vs_time.png").stat().st_size > 0


def test_python_dash_m_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "leanbatch", "bench", "--methods", "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "leanbatch: error: unknown method 'nope'; choose from baseline, random, infobatch, sb, infobatch+sb, "
        "rs2, epsilon-greedy, ucb, seta, obs, sb-proxy, obs-epoch, rho-loss, uniform, infobatch+uniform"
    )
    assert proc.stdout == ""


def test_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "bench" in out and "micro" in out
    assert cli.main([]) == 2


@pytest.mark.parametrize(("sizes", "needle"), [("0", "positive"), ("x,2", "comma-separated integers")])
def test_micro_plan_bad_sizes_are_one_line(
    sizes: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["micro", "plan", "--sizes", sizes], capsys)
    assert code == 2 and err.count("\n") == 1 and f"--sizes must be {needle}" in err and not out


def test_bench_help_lists_every_method_kind_in_one_line_and_every_setting_with_its_old_spellings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanbatch.bench.registry import REGISTRY

    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for kind in REGISTRY.values():
        assert [ln.split()[:2] for ln in lines if ln.split()[:2] == [kind.name, kind.family]], kind.name
        assert any(ln.split()[:1] == [kind.name] and kind.description in ln for ln in lines), kind.name
        for s in kind.settings:
            assert s.describe() in " ".join(out.split()), s.describe()  # name=default (old spellings)
    assert "(sb_keep)" in out and "(prune_fraction)" in out and "(ib_max_weight)" in out
    twins = [ln.split()[:3] for ln in lines if "->" in ln.split()[1:2]]
    assert twins == [[k.name, "->", f"{k.name}~{k.twin.name}"] for k in REGISTRY.values() if k.twin]
    assert {"obs-epoch", "rho-loss", "uniform", "infobatch+uniform"} <= {
        ln.split()[0] for ln in lines if ln.strip()
    }
