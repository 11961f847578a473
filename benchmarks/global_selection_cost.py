"""What global selection (``scope="global"``) costs over local selection, on CPU with 2 gloo ranks.

Read top to bottom. Two processes (gloo, one torch thread each: the machine has 2 cores) run the
same steps with a local and a global selector, interleaved round by round (the order alternates)
so machine noise hits both alike. Before every timed block the ranks meet at a barrier, so a
block starts together on both; a step's time is the slower rank's (the job waits for it).

  select   ``SelectiveBackprop(rule="rank", keep=0.5)`` on a batch of ``n`` rows per rank, scored
           by a precomputed column (a scorer: no model), so what is timed is the selection
           machinery alone: local draws the rank's own ``n / 2`` rows; global gathers the 2n
           scores, draws over them, reads the per-rank counts once and keeps its rows.
  step     a training step of a small CNN (conv 16 -> pool -> conv 32 -> global pool -> linear,
           28x28 inputs) under DDP: the selection forward at ``scale_factor=0.5``, then forward,
           backward and SGD on the kept rows (``step_loss``, which is the mean for local). Under
           global selection the ranks train different numbers of rows and the slower one sets the
           pace: ``max rows`` is the mean over rounds of the larger rank's count (local: n / 2).

Medians over rounds, per batch size ``n`` (per rank), and the ratio global / local.

    python benchmarks/global_selection_cost.py                      # n = 128 and 512
    python benchmarks/global_selection_cost.py --sizes 128 --rounds 100 --train-rounds 10
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from leanbatch import SelectiveBackprop

WORLD, SEED, KEEP = 2, 0, 0.5
SCOPES = ("local", "global")


def column(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The scorer of the select-only part: the scores are the input's first column."""
    return x[:, 0]


def small_cnn() -> nn.Module:
    torch.manual_seed(SEED)  # the same initial weights on both ranks (DDP broadcasts them anyway)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def timed(block: Callable[[], int]) -> tuple[float, int]:
    """Seconds ``block`` takes on this rank, started together with the other rank; its row count."""
    dist.barrier()
    t0 = time.perf_counter()
    rows = block()
    return time.perf_counter() - t0, rows


def interleaved(
    steps: Mapping[str, Callable[[Any, int], int]], batches: Callable[[], Any], rounds: int, warmup: int
) -> dict[str, list[tuple[float, int]]]:
    """``(seconds, rows)`` of ``steps[scope](batch, t)`` per round, the scopes' order alternating."""
    out: dict[str, list[tuple[float, int]]] = {s: [] for s in SCOPES}
    for r in range(-warmup, rounds):
        batch = batches()
        for s in SCOPES if r % 2 else SCOPES[::-1]:
            t = timed(functools.partial(steps[s], batch, max(r, 0)))
            if r >= 0:
                out[s].append(t)
    return out


def select_step(sel: SelectiveBackprop, batch: Any, t: int) -> int:
    return int(sel.select(batch, progress=0.5, batch_idx=t).batch[0].shape[0])


def train_step(model: Any, opt: torch.optim.Optimizer, sel: SelectiveBackprop, batch: Any, t: int) -> int:
    (x, y), _, _ = sel.select(batch, model.module, progress=0.5, batch_idx=t)
    loss = sel.step_loss(F.cross_entropy(model(x), y, reduction="none"))  # the mean for local
    opt.zero_grad()
    loss.backward()
    opt.step()
    return int(y.shape[0])


def select_only(n: int, rounds: int, rank: int) -> dict[str, list[tuple[float, int]]]:
    steps = {
        s: functools.partial(
            select_step, SelectiveBackprop(0.0, 1.0, KEEP, 1.0, 0, scorer=column, seed=SEED, scope=s)
        )
        for s in SCOPES
    }
    gen = torch.Generator().manual_seed(1000 * n + rank)
    return interleaved(steps, lambda: (torch.rand(n, 1, generator=gen), torch.arange(n)), rounds, 5)


def train_steps(n: int, rounds: int, rank: int) -> dict[str, list[tuple[float, int]]]:
    steps = {}
    for s in SCOPES:
        model = nn.parallel.DistributedDataParallel(small_cnn())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sel = SelectiveBackprop(0.0, 1.0, KEEP, 0.5, 0, loss_fn=F.cross_entropy, seed=SEED, scope=s)
        steps[s] = functools.partial(train_step, model, opt, sel)
    gen = torch.Generator().manual_seed(2000 * n + rank)

    def batches() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    return interleaved(steps, batches, rounds, 2)


def worker(rank: int, init_file: str, out_dir: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=300),
    )  # fmt: skip
    try:
        result = {}
        for n in args.sizes:
            result[f"select/{n}"] = select_only(n, args.rounds, rank)
            result[f"step/{n}"] = train_steps(n, args.train_rounds, rank)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def summarise(runs: list[dict[str, Any]], key: str, scope: str) -> tuple[float, float]:
    """Median over rounds of the slower rank's time (ms), and the mean of the larger row count."""
    per_rank = [run[key][scope] for run in runs]
    slowest = [max(t for t, _ in rounds) for rounds in zip(*per_rank, strict=True)]
    largest = [max(k for _, k in rounds) for rounds in zip(*per_rank, strict=True)]
    return 1000 * statistics.median(slowest), statistics.mean(largest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="128,512", help="rows per rank, comma-separated")
    parser.add_argument("--rounds", type=int, default=300, help="select-only rounds per size")
    parser.add_argument("--train-rounds", type=int, default=30, help="training-step rounds per size")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(os.path.join(tmp, "init"), tmp, args), nprocs=WORLD, join=True)
        runs = []
        for r in range(WORLD):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                runs.append(json.load(f))
    print(f"{WORLD} gloo ranks, 1 thread each, keep={KEEP}, torch {torch.__version__}")
    print("| n per rank | part | local ms | global ms | global / local | max rows local | max rows global |")
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for part in ("select", "step"):
            (lt, lk), (gt, gk) = (summarise(runs, f"{part}/{n}", s) for s in SCOPES)
            print(f"| {n} | {part} | {lt:.3f} | {gt:.3f} | {gt / lt:.2f} | {lk:.1f} | {gk:.1f} |")


if __name__ == "__main__":
    main()
