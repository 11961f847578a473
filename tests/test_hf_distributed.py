"""Two processes on CPU (gloo), launched as users launch them (``torchrun``), real Trainer and accelerate.

accelerate gives process ``r`` the batches ``r, r + 2, ...`` of one global order and pads the
last round from the start of the epoch. Every process must serve the same plan (from scores
merged across processes), count the epoch alike, and normalise by the tokens of both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun_on(nproc: int, out: Path, *options: str, timeout: float = 400) -> list[dict]:
    """``hf_ddp_worker.py OUT *options`` on ``nproc`` processes; what each saved."""
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    run = subprocess.run(
        [*cmd, os.path.join(HERE, "hf_ddp_worker.py"), str(out), *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def torchrun(out: Path, *options: str) -> tuple[dict, dict]:
    """``hf_ddp_worker.py OUT *options`` on 2 processes; what each saved."""
    a, b = torchrun_on(2, out, *options, timeout=300)
    return a, b


def test_two_processes_share_plans_scores_and_epochs(tmp_path):
    a, b = torchrun(tmp_path)
    assert a["world"] == b["world"] == 2
    assert a["carried"] is None and b["carried"] is None  # carry_scores is off: each step's all-gather
    # one global plan, identical on both processes, pruned in the pruning epoch only
    assert a["plans"] == b["plans"] and a["epoch_stats"] == b["epoch_stats"]
    assert [s["pruning"] for s in a["epoch_stats"]] == [False, True, False]
    assert a["epoch_stats"][1]["kept"] < 30
    for e, (kept, _) in a["plans"].items():
        kept = list(range(30)) if kept is None else kept
        mine = [m["indices"] for m in a["micro"] if m["epoch"] == e]
        theirs = [m["indices"] for m in b["micro"] if m["epoch"] == e]
        assert len(mine) == len(theirs)  # even batches: both processes take the same number of steps
        order = [i for pair in zip(mine, theirs, strict=True) for batch in pair for i in batch]
        n = len(kept)
        assert sorted(order[:n]) == sorted(kept)  # batches r, r + 2, ... of one global order
        assert order[n:] == order[: len(order) - n]  # the last round is padded from the epoch's start
    # both processes normalise by the labelled tokens trained on both, in each accumulation group
    tokens: dict[int, int] = {}
    for m in a["micro"] + b["micro"]:
        tokens[m["step"]] = tokens.get(m["step"], 0) + m["labels_kept"]
    assert all(m["num_items"] == tokens[m["step"]] for m in a["micro"] + b["micro"])
    assert a["selected_batches"] == b["selected_batches"] > 0
    # merged scores identical on both processes (the trainer merges them: the worker does not); each
    # epoch counted once, to the end
    torch.testing.assert_close(a["scores"], b["scores"], rtol=0, atol=0, equal_nan=True)
    assert int(torch.isnan(a["scores"]).sum()) == 1  # the example without a labelled token
    assert a["epoch"] == b["epoch"] == 3.0 and a["progress"] == b["progress"] == 1.0
    assert a["global_step"] == b["global_step"]
    assert torch.equal(a["params"], b["params"])


def same_run(x: dict, y: dict, from_epoch: int = 0) -> None:
    assert x["epoch_stats"] == y["epoch_stats"]
    assert {e: p for e, p in x["plans"].items() if e >= from_epoch} == y["plans"]
    torch.testing.assert_close(x["scores"], y["scores"], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(x["params"], y["params"]) and x["global_step"] == y["global_step"]


def test_checkpoints_change_nothing_and_a_mid_epoch_resume_equals_the_uninterrupted_run(tmp_path):
    """Saving every step merges the processes' scores at every step; padding (accelerate's last
    round, here the sampler's own whole rounds) trains but does not score, so no merge order can
    change a score. A resume inside a pruned epoch whose kept count is not a whole number of
    rounds then trains the same padding rows as the uninterrupted run."""
    plain = torchrun(tmp_path / "plain")
    saving = torchrun(tmp_path / "saving", "1")
    for x, y in zip(plain, saving, strict=True):
        same_run(x, y)
    stats = plain[0]["epoch_stats"]
    assert stats[1]["pruning"] and stats[1]["kept"] % 8 != 0  # 2 processes x batches of 4
    pruned = [m["step"] for m in plain[0]["micro"] if m["epoch"] == 1]
    step = pruned[len(pruned) // 2]  # inside the pruned epoch
    resumed = torchrun(tmp_path / "resumed", "1", str(tmp_path / "saving" / "run" / f"checkpoint-{step}"))
    for x, y in zip(plain, resumed, strict=True):
        same_run(x, y, from_epoch=1)
        assert y["micro"] == [m for m in x["micro"] if m["step"] >= step]


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_two_process_checkpoint_resumes_on_another_number_of_processes(tmp_path, nproc):
    """accelerate's rounds change size with the number of processes; the position is a place in the
    epoch's global order, so the resumed run trains what was left, with the same plans."""
    full = torchrun_on(2, tmp_path / "full", "1")
    stats = full[0]["epoch_stats"]
    pruned = [m["step"] for m in full[0]["micro"] if m["epoch"] == 1]
    step = pruned[len(pruned) // 2]
    ckpt = tmp_path / "full" / "run" / f"checkpoint-{step}"
    resumed = torchrun_on(nproc, tmp_path / "resumed", "1", str(ckpt))

    def plans(s: list[dict]) -> list[tuple]:
        return [(x["epoch"], x["kept"], x["pruned"], x["threshold"]) for x in s]

    assert all(plans(r["epoch_stats"]) == plans(stats) for r in resumed)
    for r in resumed:
        assert r["epoch"] == 3.0 and r["progress"] == 1.0
    before = [
        i for r in full for m in r["micro"] if m["epoch"] == 1 and m["step"] < step for i in m["indices"]
    ]
    after = [i for r in resumed for m in r["micro"] if m["epoch"] == 1 for i in m["indices"]]
    kept = stats[1]["kept"]
    assert set(before) | set(after) == set(full[0]["plans"][1][0])  # the epoch's plan, all of it
    assert len(before) + len(after) - kept < 4 * nproc  # repeats: the new world's last-round padding only


def test_accelerate_launch_trains_exactly_as_torchrun_and_its_fsdp_is_not_on_the_cpu(tmp_path):
    """``accelerate launch`` (its multi-process launcher, on the CPU) gives the torchrun run, with the
    scores carried in DDP's gradient all-reduce (``carry_scores=True``) as with the all-gather. Asked
    for FSDP on the CPU, accelerate ignores its FSDP plugin (its FSDP needs GPUs) and trains DDP:
    checked here so that the day it shards on the CPU this test says to test it for real
    (``benchmarks/gpu_fsdp.py --hf`` checks it on GPUs)."""
    plain = torchrun(tmp_path / "plain")
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    accelerate += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    run = subprocess.run(
        [*accelerate, os.path.join(HERE, "hf_ddp_worker.py"), str(tmp_path / "accelerate"), "--carry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    launched = [torch.load(tmp_path / "accelerate" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert launched[0]["world"] == 2
    for x, y in zip(plain, launched, strict=True):
        same_run(x, y)
        # the scores rode accelerate's DDP all-reduce; accumulation's no_sync micro-batches sent
        # theirs by an all-gather; the run is the all-gather's bit for bit
        assert x["carried"] is None and min(y["carried"]) > 0
    asked = torchrun(tmp_path / "fsdp", "--fsdp")
    for x, y in zip(plain, asked, strict=True):
        assert x["wrapper"] == "DistributedDataParallel" and not x["fsdp"]
        assert (y["wrapper"], y["fsdp"]) == ("DistributedDataParallel", False)  # not sharded: DDP
        same_run(x, y)


def test_packed_batches_on_two_processes_train_the_padded_runs_plans_scores_and_weights(tmp_path):
    """``DataCollatorWithFlattening`` on 2 processes: each process packs the samples its batches
    serve, so every packed sequence keeps its dataset index and its score lands on its sample. The
    packed run trains what the padded 2-process run trains (one launch trains both): the same
    global plans, batches on each process, weights and token counts, the scores to float precision."""
    for packed in torchrun(tmp_path, "--packed"):
        padded = packed["padded"]
        assert packed["world"] == 2 and packed["carried"] is None  # carry_scores is opt-in: the all-gather
        assert [s["pruning"] for s in packed["epoch_stats"]] == [False, True, False]
        assert packed["plans"] == padded["plans"]  # kept samples and their weights, every epoch
        for a, b in zip(packed["epoch_stats"], padded["epoch_stats"], strict=True):
            assert {**a, "threshold": None} == {**b, "threshold": None}
        for key in ("indices", "kept", "weights", "num_items", "labels_kept", "step", "epoch"):
            assert [m[key] for m in packed["micro"]] == [m[key] for m in padded["micro"]], key
        assert {w for m in packed["micro"] for w in m["weights"]} == {1.0, 2.5}
        # every sample's score (merged from both processes) is its padded score: none landed on another
        torch.testing.assert_close(packed["scores"], padded["scores"], rtol=1e-5, atol=1e-6, equal_nan=True)
        assert int(torch.isnan(packed["scores"]).sum()) == 1  # the example without a labelled token
        torch.testing.assert_close(
            [m["loss"] for m in packed["micro"]], [m["loss"] for m in padded["micro"]], rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(packed["params"], padded["params"], rtol=0, atol=1e-3)  # Adam, lr 1e-2
