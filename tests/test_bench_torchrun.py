"""``torchrun --nproc_per_node=2 -m leanbatch bench``: real processes (gloo on CPU), the same tables and
results.json as one process, every step one global batch split between the ranks.

The sizes are chosen to be awkward: 251 training samples (the last round of the shards is padded),
a last batch shorter than the others on every rank, and 101 test samples (unequal evaluation
slices). Each command runs under a timeout that fails the test rather than hang it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.data import load_data
from leanbatch.bench.methods import parse_methods
from leanbatch.bench.world import World
from leanbatch.carrier import CARRIED_ROW_BYTES
from leanbatch.cli_args import CLIError
from leanbatch.cli_checks import check_batches

HERE = Path(__file__).resolve().parent
BENCH = [
    "bench", "--data", "digits", "--limit-train", "251", "--limit-test", "101", "--epochs", "3",
    "--batch-size", "32", "--widths", "8", "--methods", "baseline,infobatch,sb", "--budgets", "0.5,1",
    "--batch-budgets", "0.5", "--seeds", "0", "--no-plots", "--no-progress",
]  # fmt: skip


def _env() -> dict[str, str]:
    src = str(HERE.parent / "src")
    return dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", "")
    )


def _bench(out: Path, nproc: int | None) -> tuple[dict[str, Any], str]:
    """The bench on ``nproc`` torchrun processes (None: plain ``python -m leanbatch``); results.json, stdout."""
    launch = (
        []
        if nproc is None
        else ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    )
    cmd = [sys.executable, *launch, "-m", "leanbatch", *BENCH, "--out", str(out)]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), run.stdout


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], str]:
    root = tmp_path_factory.mktemp("torchrun")
    one, _ = _bench(root / "one", None)
    two, stdout = _bench(root / "two", 2)
    return one, two, stdout


def _runs(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["method"]: r for r in payload["runs"]}


def test_the_same_results_json_and_tables_written_once(
    both: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    one, two, stdout = both
    assert set(two) == set(one)
    assert (one["config"]["world_size"], two["config"]["world_size"]) == (1, 2)
    assert [r["method"] for r in two["summary"]] == [r["method"] for r in one["summary"]]
    assert [r["method"] for r in two["envelope"]["rows"]] == [r["method"] for r in one["envelope"]["rows"]]
    assert stdout.count("leanbatch bench: digits") == 1  # rank 0 prints; rank 1 is silent
    assert stdout.count("| method ") == 4  # summary, equal time, envelope, the synchronisation cost
    assert "2 processes (torchrun)" in stdout


def test_every_step_is_one_global_batch_split_between_the_ranks(
    both: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    """The same steps as one process; each epoch's samples are the dataset once, padded to equal shards."""
    one, two = _runs(both[0]), _runs(both[1])
    for label, run in two.items():
        assert [e["steps"] for e in run["epochs"]] == [e["steps"] for e in one[label]["epochs"]], label
    for label in ("baseline", "sb"):
        assert [e["loaded"] for e in two[label]["epochs"]] == [252] * 3, label  # 251 + 1 padding
        assert [e["loaded"] for e in one[label]["epochs"]] == [251] * 3, label
    assert [e["forwarded"] for e in two["baseline"]["epochs"]] == [252] * 3
    assert sum(e["steps"] for e in two["baseline[budget=0.5]"]["epochs"]) == 12  # half of 3 x 8 steps
    assert [e["loaded"] for e in two["baseline[batch=0.5]"]["epochs"]] == [252, 128]  # 24 steps of 16 rows
    pruned = two["infobatch"]["epochs"]
    assert pruned[0]["loaded"] == 252 and pruned[1]["pruning"] and pruned[1]["loaded"] < 251
    for run in two.values():
        for e in run["epochs"]:
            assert abs(e["test_acc"] * 101 / 100 - round(e["test_acc"] * 101 / 100)) < 1e-9  # whole samples


def test_the_synchronisation_cost_is_reported(both: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    """Every rank gathers 16 bytes per trained row of every rank; timed alone after training."""
    one, two, stdout = both
    (row,) = two["sync"]["rows"]
    run = _runs(two)["infobatch"]
    steps = sum(e["steps"] for e in run["epochs"])
    trained = sum(e["loaded"] - e["dropped"] for e in run["epochs"])  # summed over both ranks
    assert row["method"] == "infobatch" and row["bytes_per_step"] * steps == pytest.approx(
        CARRIED_ROW_BYTES * trained
    )
    assert row["gather_ms"] > 0 and row["step_ms"] > 0  # the overlapped cost can come out below 0 in noise
    assert row["share"] == pytest.approx(row["overlap_ms"] / row["step_ms"]) and math.isfinite(row["share"])
    assert run["overlap_time_s"] == pytest.approx(row["overlap_ms"] / 1000)
    # the rows rode DDP's gradient all-reduce, and the all-gather they replace was measured beside them
    assert row["carried_share"] == run["carried_share"] == 1.0
    assert math.isfinite(row["gather_overlap_ms"]) and row["gather_overlap_ms"] != row["overlap_ms"]
    (alone,) = one["sync"]["rows"]
    assert (
        alone["bytes_per_step"] == 0
        and alone["gather_ms"]
        == alone["overlap_ms"]
        == alone["gather_overlap_ms"]
        == alone["carried_share"]
        == 0
        and alone["update_ms"] > 0
    )
    assert "per-step cost of InfoBatch.update (torchrun, 2 processes; the rows ride DDP's gradient" in stdout


def test_replicas_that_drift_apart_stop_the_bench(tmp_path: Path) -> None:
    """The epoch's check compares the ranks' parameters: different models are an error, not a result."""
    script = tmp_path / "drift.py"
    script.write_text(
        "import torch\nfrom leanbatch.bench.world import World\n"
        "w = World.from_env()\ntorch.manual_seed(0)\nm = torch.nn.Linear(2, 2)\n"
        "w.check_same(m, 'same')\n"
        "with torch.no_grad():\n    m.weight[0, 0] += w.rank\n"
        "try:\n    w.check_same(m, 'drifted')\nexcept RuntimeError as e:\n"
        f"    open(f'{tmp_path}/rank{{w.rank}}.txt', 'w').write(str(e))\n"
        "w.close()\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
    ]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(2):  # each rank refused, in its own file (two processes' stdout interleave)
        said = (tmp_path / f"rank{rank}.txt").read_text()
        assert said.startswith("drifted: the model's parameters differ between ranks"), said


def test_a_batch_that_does_not_split_between_the_processes_is_refused() -> None:
    data = load_data("digits", 64, 16)
    rows = parse_methods("baseline,sb")
    with pytest.raises(CLIError, match=r"--batch-size 32 does not split into 3 equal shares.*multiple of 3"):
        check_batches(data, rows, TrainConfig(batch_size=32, widths=(4,)), World(size=3, rank=0))
    with pytest.raises(CLIError, match=r"sb trains one row of a batch of 2 \(16 processes: 2 rows each\)"):
        check_batches(data, rows, TrainConfig(batch_size=32, widths=(4,)), World(size=16, rank=0))
    with pytest.raises(CLIError, match=r"32 processes: 1 rows each.*BatchNorm"):
        check_batches(data, rows, TrainConfig(batch_size=32, widths=(4,)), World(size=32, rank=0))
    assert check_batches(data, rows, TrainConfig(batch_size=32, widths=(4,)), World(size=2, rank=0)) is False
