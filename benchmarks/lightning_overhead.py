"""The Lightning adapter's overhead against a plain loop like the built-in image task's.

    python benchmarks/lightning_overhead.py [--epochs 8] [--threads 1]

Same data (4,000 bundled MNIST digits), model (the benchmark's small CNN, channels-last),
batch size (128), optimiser and per-step cosine schedule in both. The plain loop is the image
task's (batches gathered straight from the in-memory tensors, :func:`plain_epochs`); the Lightning runs are
``examples/lightning_mnist.py``'s module in a stock ``Trainer`` (a DataLoader collating items,
the callback for InfoBatch). Each Lightning epoch is followed by one epoch of the matching
plain run, so a busy spell of a shared machine slows both alike. Epoch 0 trains every sample
in every run, so its times compare the per-step costs directly; the mean over epochs also
counts InfoBatch's shorter pruned epochs. The ratios compare the runs of a pair; the
adapter's own share divides the InfoBatch pair's ratio by the baseline pair's, which takes
out what Lightning and its DataLoader cost over the plain loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from leanbatch import InfoBatch, ProgressLR, cosine
from leanbatch.lightning import LeanBatchCallback
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import DataSplit, load_data
from leanbatch.tasks.images.loop import evaluate, warm_up

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lightning_mnist.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("lightning_mnist", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_epochs(data: DataSplit, cfg: TrainConfig, prune: bool) -> Iterator[tuple[float, int, float]]:
    """The plain loop, an epoch per ``next()``: its training time, its samples, the test accuracy."""
    torch.manual_seed(0)
    net, ds = cfg.make_model(data), InfoBatch(range(data.num_train), cfg.epochs, seed=0) if prune else None
    opt = cfg.optimizer(net)
    step, gen, steps = (
        [0],
        torch.Generator().manual_seed(0),
        cfg.epochs * -(-data.num_train // cfg.batch_size),
    )
    sched = ProgressLR(
        opt, ds if ds is not None else (lambda: min(1.0, step[0] / steps)), cosine(warmup=cfg.warmup)
    )
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        if ds is not None:
            ds.set_epoch(epoch)
            order = torch.tensor(list(ds.sampler))
        else:
            order = torch.randperm(data.num_train, generator=gen)
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            x = data.x_train[idx].contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(net(x), data.y_train[idx], reduction="none")
            loss = loss.mean() if ds is None else ds.update(loss, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step[0] += 1
            sched.step()
        elapsed = time.perf_counter() - t0
        yield elapsed, len(order), evaluate(net, data.x_test, data.y_test, cfg.eval_batch_size, True)[0]


class Interleave(pl.Callback):
    """Times each Lightning epoch, then trains one epoch of the paired plain-loop run."""

    def __init__(self, plain: Iterator[tuple[float, int, float]]):
        self.plain = plain
        self.records: list[tuple[float, int, float]] = []
        self.times: list[float] = []
        self.samples: list[int] = []
        self._t0 = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        if len(self.samples) < trainer.current_epoch + 1:
            self.samples.append(0)
        self.samples[-1] += len(batch[0])

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self.records.append(next(self.plain))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    example = load_example()
    example.EPOCHS = args.epochs
    example.quiet()
    data = load_data("mnist-5k")
    cfg = TrainConfig(epochs=args.epochs, batch_size=128)
    warm_up(data, cfg)  # also flushes denormals, as the example does
    train_set = torch.utils.data.TensorDataset(data.x_train, data.y_train)
    rows = []
    for method in ("baseline", "infobatch"):
        plain = plain_epochs(data, cfg, prune=method == "infobatch")
        lb = None
        if method == "infobatch":
            lb = LeanBatchCallback(InfoBatch(train_set, args.epochs, prune_ratio=0.5, delta=0.875, seed=0))
        pl.seed_everything(0, verbose=False)
        timer = Interleave(plain)
        module = example.LitMNIST(train_set, lb)
        pl.Trainer(
            max_epochs=args.epochs,
            accelerator="cpu",
            callbacks=[timer],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        ).fit(module)
        rows.append(
            (
                f"plain loop, {method}",
                [t for t, _, _ in timer.records],
                [n for _, n, _ in timer.records],
                timer.records[-1][2],
            )
        )
        acc = 100 * example.accuracy(module, data.x_test, data.y_test)
        rows.append((f"Lightning, {method}", timer.times, timer.samples, acc))
    print(f"{args.epochs} epochs, {data.num_train} digits, {torch.get_num_threads()} thread(s)")
    print(f"{'run':<22} {'epoch 0 s':>9} {'mean s/epoch':>12} {'µs/sample':>9} {'test acc':>8}")
    for name, times, samples, acc in rows:
        per_sample = 1e6 * sum(times) / sum(samples)
        print(f"{name:<22} {times[0]:>9.3f} {statistics.mean(times):>12.3f} {per_sample:>9.1f} {acc:>7.2f}%")
    (_, pb, _, _), (_, lb_, _, _), (_, pi, _, _), (_, li, _, _) = rows
    base, ib = statistics.mean(lb_) / statistics.mean(pb), statistics.mean(li) / statistics.mean(pi)
    print(
        f"Lightning / plain loop, time per epoch (each pair interleaved): baseline {base:.3f}, infobatch {ib:.3f}"
    )
    print(f"the adapter's own share, (infobatch ratio) / (baseline ratio): {ib / base:.3f}")


if __name__ == "__main__":
    main()
