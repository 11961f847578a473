"""Outgrowing one machine: a distributed task (``examples/distributed_task.py``, DDP over gloo), one
``torchrun`` job per arm, each into its own folder, merged by ``leanbatch report`` into one study:
the envelope from one job judges the method of the other. Real processes, each under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TASK = Path(__file__).resolve().parents[1] / "examples" / "distributed_task.py"


def _job(out: Path, *arms: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "leanbatch",
        "bench", "--task", f"{TASK}:train", "--metric", "accuracy", "--seeds", "0,1", "--no-plots", "--no-progress",
        *arms, "--out", str(out),
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_one_torchrun_job_per_arm_merged_into_one_study(tmp_path: Path) -> None:
    base = _job(
        tmp_path / "baselines", "--methods", "baseline", "--budgets", "0.5,1", "--batch-budgets", "0.5"
    )
    method = _job(
        tmp_path / "infobatch", "--methods", "infobatch", "--budgets", "none", "--batch-budgets", "none"
    )
    for job in (base, method):
        assert job.returncode == 0, job.stderr[-3000:]
        assert (
            job.stdout.count("leanbatch bench: task") == 1
        )  # the first process prints; the other trains beside it
    merged = subprocess.run(
        [sys.executable, "-m", "leanbatch", "report", str(tmp_path / "baselines"), str(tmp_path / "infobatch"),
         "--out", str(tmp_path / "study"), "--no-plots"],
        env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    payload = json.loads((tmp_path / "study" / "results.json").read_text())
    assert payload["config"]["world_size"] == 2 and [m["methods"] for m in payload["merged_from"]] == [
        ["baseline", "baseline[budget=0.5]", "baseline[batch=0.5]"], ["infobatch"],
    ]  # fmt: skip
    runs = {(r["method"], r["seed"]): r for r in payload["runs"]}
    assert len(runs) == 8 and runs["baseline", 0]["num_samples"] == 1000  # each process trains half of 2,000
    assert (
        runs["baseline", 0]["steps"] == 4 * 32 and runs["baseline[budget=0.5]", 1]["steps"] == 64
    )  # 1000 / 32 a step
    assert runs["infobatch", 0]["loaded_fraction"] < 1.0
    (row,) = payload["envelope"]["rows"]
    assert row["method"] == "infobatch" and row["seeds"] == [0, 1] and row["verdict"] != "no envelope"
    assert "  infobatch: " in merged.stdout and "vs the envelope" in merged.stdout
