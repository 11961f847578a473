"""A/B: ``InfoBatch.update()`` per step (or planning an epoch), this checkout against an older
commit, in one process.

Shared machines are noisy, so two separate ``leanbatch micro update`` runs cannot tell a 10%
change from load. This script loads the package of another commit side by side (its source
copied from git under the name ``leanbatch_ref``), runs both in alternating blocks of steps in
the same process, and reports the best block of each and their ratio.

    python benchmarks/ab_update.py --ref HEAD~1            # batch 128, 60,000 samples
    python benchmarks/ab_update.py --ref main --rounds 30
    python benchmarks/ab_update.py --ref main --plan 10000000   # planning one epoch of 10M samples
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

NOFLUSH = bool(int(__import__("os").environ.get("NOFLUSH", "0")))
ROOT = Path(__file__).resolve().parents[1]


def load_ref(ref: str, into: Path) -> Any:
    """Import the ``leanbatch`` package of commit ``ref`` as ``leanbatch_ref``."""
    blob = subprocess.run(
        ["git", "archive", ref, "src/leanbatch"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    pkg = into / "leanbatch_ref"
    (into / "src" / "leanbatch").rename(pkg)
    for f in pkg.rglob("*.py"):
        f.write_text(re.sub(r"\bleanbatch\b", "leanbatch_ref", f.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module("leanbatch_ref")


def make(pkg: Any, n: int) -> Any:
    """A wrapper in a pruning epoch whose whole epoch has been served, as a loader would."""
    ds = pkg.InfoBatch(torch.utils.data.TensorDataset(torch.zeros(n)), 1000, prune_ratio=0.5, delta=1.0)
    ds.scores.update(torch.arange(n), torch.rand(n, generator=torch.Generator().manual_seed(0)))
    if NOFLUSH:
        ds.scores.flush_every = 10**9
    return ds


def epoch_batches(ds: Any, epoch: int, bs: int, steps: int) -> list[torch.Tensor]:
    ds.set_epoch(epoch)
    order = torch.tensor(list(ds.sampler), dtype=torch.int64)
    k = min(steps, order.numel() // bs)
    return [order[i * bs : (i + 1) * bs] for i in range(k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--num-samples", type=int, default=60000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=20, help="alternating rounds (best block kept)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: no spinning on a busy machine)"
    )
    ap.add_argument("--plan", type=int, default=0, help="time planning an epoch of this many samples instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.plan:
        plan_ab(args)
        return
    import leanbatch

    with tempfile.TemporaryDirectory() as tmp:
        ref = load_ref(args.ref, Path(tmp))
        losses = [torch.rand(args.batch_size, generator=torch.Generator().manual_seed(i)) for i in range(8)]
        best: dict[str, float] = {}
        ratios: dict[str, list[float]] = {"update(loss, indices)": [], "update(loss)": []}
        for r in range(args.rounds):
            for path in ("update(loss, indices)", "update(loss)"):
                this_round = {}
                # the two versions back to back, in alternating order: load hits both alike
                pair = (("this checkout", leanbatch), (f"ref {args.ref}", ref))
                for name, pkg in pair if r % 2 else pair[::-1]:
                    ds = make(pkg, args.num_samples)
                    batches = epoch_batches(ds, 1, args.batch_size, args.steps)
                    t0 = time.perf_counter()
                    for i, idx in enumerate(batches):
                        if path == "update(loss)":
                            ds.update(losses[i % 8])
                        else:
                            ds.update(losses[i % 8], idx)
                    this_round[name] = (time.perf_counter() - t0) / len(batches) * 1e6
                if r:  # the first round warms up
                    for name, us in this_round.items():
                        key = f"{path} | {name}"
                        best[key] = min(best.get(key, float("inf")), us)
                    ratios[path].append(this_round["this checkout"] / this_round[f"ref {args.ref}"])
        print(f"| per step (batch of {args.batch_size}), best block of {args.rounds - 1} | µs |")
        print("|---|---:|")
        for key, us in best.items():
            print(f"| {key} | {us:.1f} |")
        for path, rs in ratios.items():
            new, old = best[f"{path} | this checkout"], best[f"{path} | ref {args.ref}"]
            med = sorted(rs)[len(rs) // 2]
            print(
                f"{path}: this checkout / ref = {new / old:.3f} (best blocks), {med:.3f} (median of paired rounds)"
            )


def plan_ab(args: argparse.Namespace) -> None:
    """Best time to plan one pruning epoch of ``args.plan`` samples, both versions alternating."""
    import leanbatch

    scores = torch.empty(args.plan).exponential_(generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        ref = load_ref(args.ref, Path(tmp))
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for name, pkg in (("this checkout", leanbatch), (f"ref {args.ref}", ref)):
                pol = pkg.InfoBatchPolicy(0.5, num_epochs=4, delta=1.0)
                t0 = time.perf_counter()
                pol(scores, 0, torch.Generator().manual_seed(r))
                ms = (time.perf_counter() - t0) * 1e3
                if r:
                    best[name] = min(best.get(name, float("inf")), ms)
        for name, ms in best.items():
            print(f"plan {args.plan:,} samples | {name} | {ms:.1f} ms")
        print(f"this checkout / ref = {best['this checkout'] / best[f'ref {args.ref}']:.3f}")


if __name__ == "__main__":
    main()
