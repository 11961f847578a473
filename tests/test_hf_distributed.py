"""Two processes on CPU (gloo), launched as users launch them (``torchrun``), real Trainer and accelerate.

accelerate gives process ``r`` the batches ``r, r + 2, ...`` of one global order and pads the
last round from the start of the epoch. Every process must serve the same plan (from scores
merged across processes), count the epoch alike, and normalise by the tokens of both.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_processes_share_plans_scores_and_epochs(tmp_path):
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    run = subprocess.run(
        [*cmd, os.path.join(HERE, "hf_ddp_worker.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert a["world"] == b["world"] == 2
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
    # merged scores identical on both processes; each epoch counted once, to the end
    torch.testing.assert_close(a["scores"], b["scores"], rtol=0, atol=0, equal_nan=True)
    assert int(torch.isnan(a["scores"]).sum()) == 1  # the example without a labelled token
    assert a["epoch"] == b["epoch"] == 3.0 and a["progress"] == b["progress"] == 1.0
    assert a["global_step"] == b["global_step"]
    assert torch.equal(a["params"], b["params"])
