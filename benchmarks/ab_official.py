"""A/B: ``InfoBatch.update()`` per step, leanbatch against the official InfoBatch, in one process.

The official implementation (NUS-HPC-AI-Lab/InfoBatch) is not part of this repository: pass the
folder that holds its ``infobatch`` package (never commit it)::

    mkdir -p /tmp/official && git --git-dir=<mirror>/.git archive HEAD infobatch | tar -x -C /tmp/official
    python benchmarks/ab_official.py /tmp/official                 # batch 128, 60,000 samples
    python benchmarks/ab_official.py /tmp/official --rounds 40 --json

Both get the same batches of dataset indices (an epoch of leanbatch's plan, in serving order) and
the same per-sample losses, fresh tensors for every step (the official ``update`` multiplies its
input in place), with one torch thread. Three paths run in alternating blocks of ``--steps``
steps, the order rotated every round, so load hits them alike; each path's best block and the
median of the per-round ratios are reported:

- ``official``: ``ds.set_active_indices(idx); ds.update(loss)`` (what its patched DataLoader and
  a training step do; the patch is installed when the module is imported, and no DataLoader runs
  here);
- ``update(loss)``: leanbatch's plain loop, the batch served by ``ds.sampler`` and fetched through
  the dataset beforehand (as a DataLoader does), then ``ds.update(loss)``;
- ``update(loss, indices)``: the indices passed with the losses.

Both wrappers are in a pruning epoch, so every step gathers loss weights.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

PATHS = ("official", "update(loss)", "update(loss, indices)")


def load_official(folder: str) -> Any:
    """The official ``InfoBatch`` class from ``folder``/infobatch (patches DataLoader on import)."""
    path = Path(folder).resolve()
    if not (path / "infobatch" / "__init__.py").is_file():
        raise SystemExit(
            f"{path} holds no infobatch/ package: pass the folder the official code was extracted to"
        )
    sys.path.insert(0, str(path))
    return importlib.import_module("infobatch").InfoBatch


def ours(n: int) -> Any:
    """A leanbatch wrapper in a pruning epoch (epoch 1, every sample scored in epoch 0)."""
    from leanbatch import InfoBatch

    ds = InfoBatch(TensorDataset(torch.zeros(n)), 1000, prune_ratio=0.5, delta=1.0)
    ds.scores.update(torch.arange(n), torch.rand(n, generator=torch.Generator().manual_seed(0)))
    return ds


def epoch_batches(ds: Any, epoch: int, bs: int, steps: int) -> list[torch.Tensor]:
    """Serve epoch ``epoch`` of ``ds`` to its end and fetch its first ``steps`` batches through the
    dataset, as a DataLoader does; the batches' dataset indices."""
    ds.set_epoch(epoch)
    order = torch.tensor(list(ds.sampler), dtype=torch.int64)
    k = min(steps, order.numel() // bs)
    batches = [order[i * bs : (i + 1) * bs] for i in range(k)]
    for b in batches:
        ds.__getitems__(b.tolist())
    return batches


def block(path: str, official: Any, n: int, bs: int, steps: int, epoch: int) -> float:
    """Microseconds per step of one block of ``path``."""
    ds = ours(n)
    batches = epoch_batches(ds, epoch, bs, steps)
    g = torch.Generator().manual_seed(epoch)
    losses = [torch.rand(bs, generator=g) for _ in batches]
    if path == "official":
        ref = official(TensorDataset(torch.zeros(n)), 1000, prune_ratio=0.5, delta=1.0)
        ref.weights[::2] = 2.0  # a pruned epoch's rescaled weights (the gather costs the same)
        t0 = time.perf_counter()
        for idx, loss in zip(batches, losses, strict=True):
            ref.set_active_indices(idx)
            ref.update(loss)
    elif path == "update(loss)":
        t0 = time.perf_counter()
        for loss in losses:
            ds.update(loss)
    else:
        t0 = time.perf_counter()
        for idx, loss in zip(batches, losses, strict=True):
            ds.update(loss, idx)
    return (time.perf_counter() - t0) / len(batches) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("official", help="the folder holding the official infobatch/ package")
    ap.add_argument("--num-samples", type=int, default=60000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=20, help="alternating rounds (the first warms up)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    official = load_official(args.official)
    best = dict.fromkeys(PATHS, float("inf"))
    ratios: dict[str, list[float]] = {p: [] for p in PATHS[1:]}
    for r in range(args.rounds):
        order = PATHS[r % 3 :] + PATHS[: r % 3]  # each path first, second and third in turn
        this = {p: block(p, official, args.num_samples, args.batch_size, args.steps, r + 1) for p in order}
        if r:  # the first round warms up
            for p, us in this.items():
                best[p] = min(best[p], us)
            for p in ratios:
                ratios[p].append(this[p] / this["official"])
    result = {
        "batch_size": args.batch_size,
        "num_samples": args.num_samples,
        "steps_per_block": args.steps,
        "blocks": args.rounds - 1,
        "threads": args.threads,
        "best_us": {p: round(us, 2) for p, us in best.items()},
        "ratio_best": {p: round(best[p] / best["official"], 3) for p in ratios},
        "ratio_median": {p: round(statistics.median(rs), 3) for p, rs in ratios.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"per step, batch of {args.batch_size}, {args.threads} torch thread(s), best of {args.rounds - 1} blocks"
    )
    print(f"of {args.steps} steps each (paths alternating); ratio = leanbatch / official\n")
    print("| path | best µs/step | ratio (best blocks) | ratio (median of rounds) |")
    print("|---|---:|---:|---:|")
    for p in PATHS:
        tail = (
            "1.000 | 1.000"
            if p == "official"
            else f"{result['ratio_best'][p]:.3f} | {result['ratio_median'][p]:.3f}"
        )
        print(f"| {p} | {best[p]:.1f} | {tail} |")


if __name__ == "__main__":
    main()
