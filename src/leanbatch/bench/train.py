"""The measured training loop: one model, one seed, one method.

Read top to bottom, it is a plain PyTorch loop with three method hooks:

1. the epoch's order of samples: a seeded permutation (``baseline``, ``sb``) or the plan of an
   :class:`~leanbatch.InfoBatch` wrapper (``random``, ``infobatch``, ``infobatch+sb``), so pruned
   epochs simply have fewer batches;
2. per batch, Selective Backprop (``sb``, ``infobatch+sb``) may pick the examples that get a
   training pass, from a no-grad pass on a downsampled copy of the batch;
3. the loss: a plain mean, or InfoBatch's rescaled mean (``ds.update``).

Fairness rules every method obeys: the same model initialisation per seed, the same optimiser,
and a learning rate set on every step from the fraction of training done,
``progress = (epoch + i / batches_this_epoch) / epochs``, so every schedule ends exactly at the
end of training however many steps an epoch has. A baseline with a ``budget`` (a fraction of the
baseline's steps, for the equal-time frontier) counts its progress in steps instead,
``progress = steps_done / budget_steps``, and cuts its last epoch short where the steps run out, so
its schedule, too, ends exactly at its own end. The clock runs only around training (planning
an epoch included); evaluation on the test split after every epoch is not timed.

:func:`train_interleaved` runs the methods of one seed side by side, an epoch of each in turn,
so that a busy spell of a shared machine slows all of them alike.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.bench.data import DataSplit, IndexDataset
from leanbatch.bench.methods import MethodSpec
from leanbatch.bench.models import build_model, default_model_name
from leanbatch.bench.records import EpochRecord, RunResult
from leanbatch.bench.selecting import Selection

__all__ = [
    "TrainConfig",
    "EpochRecord",
    "RunResult",
    "Trainer",
    "train_run",
    "train_interleaved",
    "evaluate",
    "warm_up",
    "budget_steps",
]


@dataclass
class TrainConfig:
    """Everything that is the same for every method of a comparison."""

    epochs: int = 8
    batch_size: int = 128
    lr: float = 0.1  # peak learning rate, reached after the warm-up
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    warmup: float = 0.03  # fraction of training with a linear LR warm-up, then cosine to zero
    label_smoothing: float = 0.0
    device: str = "cpu"
    model: str | None = None  # None: "cnn" for small or grayscale images, "resnet" for 32x32 RGB
    widths: tuple[int, ...] | None = None
    channels_last: bool = True
    augment: bool | None = None  # None: random crop + flip for RGB images, nothing for grayscale
    eval_batch_size: int = 1000
    # Flush denormal floats to zero on CPU (process-wide). Real data drives some activations and
    # gradients of this CNN into the denormal range, where x86 arithmetic is ~10x slower: without
    # it a step on MNIST took 110 ms instead of 12 ms here. It changes no result that matters.
    flush_denormal: bool = True
    histogram_epochs: int = 3  # how many pruning epochs get a loss-histogram snapshot

    def resolved_model(self, data: DataSplit) -> str:
        return self.model or default_model_name(data.in_channels, data.image_size)

    def resolved_augment(self, data: DataSplit) -> bool:
        return data.in_channels == 3 if self.augment is None else self.augment

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["widths"] = None if self.widths is None else list(self.widths)
        return d


# ---------------------------------------------------------------------------- helpers
def budget_steps(budget: float, epochs: int, steps_per_epoch: int) -> int:
    """Steps of a run trained for ``budget`` of the baseline's ``epochs * steps_per_epoch``.

    Rounded to the nearest step (halves up), at least one.

    Example:
        >>> budget_steps(0.7, 8, 32), budget_steps(0.75, 3, 10), budget_steps(0.001, 2, 3)
        (179, 23, 1)
    """
    return max(1, math.floor(budget * epochs * steps_per_epoch + 0.5))


def _lr_factor(progress: float, warmup: float) -> float:
    """Linear warm-up over the first ``warmup`` of training, then cosine to zero at progress 1."""
    progress = min(max(progress, 0.0), 1.0)
    if progress < warmup:
        return (progress + 1e-3) / warmup
    u = (progress - warmup) / (1.0 - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * u))


def _augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """Random crop (pad 4, reflect) and horizontal flip, per sample, on the batch's device."""
    b, _, h, w = x.shape
    flip = torch.rand(b, generator=generator) < 0.5
    dy = torch.randint(0, 9, (b,), generator=generator)
    dx = torch.randint(0, 9, (b,), generator=generator)
    dev = x.device
    x = torch.where(flip.to(dev)[:, None, None, None], x.flip(3), x)
    xp = F.pad(x, (4, 4, 4, 4), mode="reflect")
    rows = (dy[:, None] + torch.arange(h)).to(dev)  # (b, h)
    cols = (dx[:, None] + torch.arange(w)).to(dev)  # (b, w)
    bi = torch.arange(b, device=dev)[:, None, None]
    out = xp.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
    return out.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


def _histogram(values: Tensor, threshold: float | None, epoch: int, bins: int = 60) -> dict[str, Any]:
    """Log-spaced histogram of the finite scores, for the loss-histogram plot."""
    v = values.detach().float().cpu()
    v = v[torch.isfinite(v)]
    lo = max(float(v.min()) if v.numel() else 1e-6, 1e-6)
    hi = max(float(v.max()) if v.numel() else 1.0, lo * 10)
    edges = torch.logspace(math.log10(lo), math.log10(hi), bins + 1)
    counts = torch.histc(v.clamp(lo, hi).log10(), bins=bins, min=math.log10(lo), max=math.log10(hi))
    return {
        "epoch": epoch,
        "threshold": threshold,
        "num_scored": int(v.numel()),
        "below_threshold": None if threshold is None else int((v < threshold).sum()),
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, batch_size: int, channels_last: bool
) -> tuple[float, float]:
    """Test accuracy (percent) and mean cross-entropy over ``x``/``y``."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    total_loss = torch.zeros((), dtype=torch.float64, device=x.device)
    for i in range(0, x.shape[0], batch_size):
        xb = x[i : i + batch_size]
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        out = model(xb)
        yb = y[i : i + batch_size]
        correct += (out.argmax(1) == yb).sum()
        total_loss += F.cross_entropy(out, yb, reduction="sum").double()
    model.train(was_training)
    n = x.shape[0]
    return 100.0 * int(correct) / n, float(total_loss) / n


def warm_up(data: DataSplit, cfg: TrainConfig) -> None:
    """A few untimed steps (full and half resolution) so one-off kernel set-up is not charged to the first run."""
    if cfg.flush_denormal:
        torch.set_flush_denormal(True)
    torch.manual_seed(12345)
    model = _make_model(data, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    n = min(cfg.batch_size, data.num_train)
    x = data.x_train[:n].to(cfg.device)
    y = data.y_train[:n].to(cfg.device)
    for scale in (1.0, 0.5, 1.0):
        xb = x if scale == 1.0 else F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
        if cfg.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        for k in (n, max(1, n // 2)):
            loss = F.cross_entropy(model(xb[:k]), y[:k])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _make_model(data: DataSplit, cfg: TrainConfig) -> nn.Module:
    model = build_model(cfg.resolved_model(data), data.in_channels, data.num_classes, cfg.widths)
    model = model.to(cfg.device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


# ---------------------------------------------------------------------------- the run
class Trainer:
    """One run (a method, a seed) that trains an epoch at a time, so runs can be interleaved.

    ``run_epoch()`` trains and then evaluates one epoch and returns its record; ``result()``
    gathers the finished run. The run's randomness is private (model initialisation is drawn
    in ``__init__``; shuffling, pruning, selection and augmentation use their own seeded
    generators), so interleaving runs epoch by epoch changes no result, only which runs share
    a slow spell of a busy machine.
    """

    def __init__(self, data: DataSplit, spec: MethodSpec, seed: int, cfg: TrainConfig):
        from leanbatch import InfoBatch

        self.data, self.spec, self.seed, self.cfg = data, spec, seed, cfg
        self.device = torch.device(cfg.device)
        self.cuda = self.device.type == "cuda"
        if cfg.flush_denormal:
            torch.set_flush_denormal(True)
        torch.manual_seed(seed)  # same initial weights for every method at this seed
        self.model = _make_model(data, cfg)
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=cfg.lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
        )
        self.augment = cfg.resolved_augment(data)
        self.aug_gen = torch.Generator().manual_seed(seed + 1_000_003)
        self.shuffle_gen = torch.Generator().manual_seed(seed)
        self.x_train = data.x_train.to(self.device)
        self.y_train = data.y_train.to(self.device)
        self.x_test = data.x_test.to(self.device)
        self.y_test = data.y_test.to(self.device)
        self.ds: Any = None
        if spec.prunes:
            # The wrapper only needs the length: batches come from the in-memory tensors by index.
            self.ds = InfoBatch(
                IndexDataset(data.num_train),
                cfg.epochs,
                prune_ratio=spec.prune_ratio,
                delta=spec.delta,
                seed=seed,
                policy=spec.make_policy(cfg.epochs, seed),
            )
        self.select = Selection(spec, seed, data, cfg) if spec.selects else None
        # A budget run stops after its own number of steps; the others train every epoch in full.
        self.budget = spec.budget
        steps_per_epoch = math.ceil(data.num_train / cfg.batch_size)
        self.total_steps: int | None = None
        self.num_epochs = cfg.epochs
        if spec.budget != 1.0:
            self.total_steps = budget_steps(spec.budget, cfg.epochs, steps_per_epoch)
            self.num_epochs = math.ceil(self.total_steps / steps_per_epoch)
        self.steps_done = 0
        self.records: list[EpochRecord] = []
        self.histograms: list[dict[str, Any]] = []
        self._snapshot_epochs = _snapshot_epochs(spec, cfg.epochs, cfg.histogram_epochs)
        self._pending_snapshot: Tensor | None = None
        self.train_time = 0.0
        self.train_cpu = 0.0
        self.eval_time = 0.0
        self.load_avg = [_load_avg()]

    @property
    def done(self) -> bool:
        return len(self.records) == self.num_epochs

    @property
    def next_midpoint(self) -> float:
        """The middle of the next epoch, as a fraction of this run's length (for interleaving)."""
        if self.total_steps is None:
            return (len(self.records) + 0.5) / self.num_epochs
        steps_per_epoch = math.ceil(self.data.num_train / self.cfg.batch_size)
        next_steps = min(steps_per_epoch, self.total_steps - self.steps_done)
        return (self.steps_done + next_steps / 2) / self.total_steps

    def run_epoch(self, on_step: Callable[[float], Any] | None = None) -> EpochRecord:
        """Train the next epoch (timed), then evaluate on the test split (not timed)."""
        cfg, spec, ds, model, opt = self.cfg, self.spec, self.ds, self.model, self.opt
        device, epochs, bs = self.device, cfg.epochs, cfg.batch_size
        epoch = len(self.records)
        model.train()
        t0 = time.perf_counter()
        c0 = time.process_time()
        if ds is not None:
            ds.set_epoch(epoch)
            order = torch.tensor(list(ds.sampler), dtype=torch.int64)  # plans the epoch
        else:
            order = torch.randperm(self.data.num_train, generator=self.shuffle_gen)
        nb = math.ceil(order.numel() / bs)
        if self.total_steps is not None:  # a budget run: its last epoch may stop early
            nb = min(nb, self.total_steps - self.steps_done)
            order = order[: nb * bs]
        loss_sum = torch.zeros((), device=device)
        fwd = sel_fwd = bwd = 0
        lr = cfg.lr
        for i in range(nb):
            # The LR follows the fraction of training done, so it reaches zero exactly at the
            # end of training however many batches pruning left in each epoch.
            progress = (
                (epoch + i / nb) / epochs
                if self.total_steps is None
                else (self.steps_done + i) / self.total_steps
            )
            lr = cfg.lr * _lr_factor(progress, cfg.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            idx = order[i * bs : (i + 1) * bs]
            idx_dev = idx.to(device, non_blocking=True) if self.cuda else idx
            x = self.x_train[idx_dev]
            y = self.y_train[idx_dev]
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            # Selection first (on the raw batch), then augmentation of what was selected.
            picked = self.select(model, x, y, progress, i, idx_dev) if self.select is not None else None
            if picked is not None:
                sel_fwd += x.shape[0] if self.select.forwards else 0  # type: ignore[union-attr]
                x, y, positions, sel_losses = picked
            if self.augment:
                x = _augment(x, self.aug_gen)
            elif cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out = model(x)
            per_sample = F.cross_entropy(out, y, reduction="none", label_smoothing=cfg.label_smoothing)
            if picked is not None and not self.select.forwards:  # type: ignore[union-attr]
                self.select.record(idx_dev[positions], per_sample)  # type: ignore[union-attr]
            if ds is None:
                loss = per_sample.mean()
            elif picked is None:
                loss = ds.update(per_sample, idx_dev)  # stores the scores, returns the rescaled mean
            elif spec.stack_scores == "selection":
                w = ds.weights(idx_dev[positions])  # the selected examples' weights in this batch's plan
                ds.update(sel_losses, idx_dev)  # scores of every example of the batch
                loss = (per_sample * w).mean()
            else:  # "trained": only the selected examples' full-resolution losses become scores
                loss = ds.update(per_sample, idx_dev, positions=positions)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            fwd += x.shape[0]
            bwd += x.shape[0]
            if on_step is not None:
                on_step(1.0 / nb)
        self.steps_done += nb
        if self.cuda:
            torch.cuda.synchronize(device)
        self.train_time += time.perf_counter() - t0
        self.train_cpu += time.process_time() - c0

        t1 = time.perf_counter()
        stats = ds.epoch_stats[-1] if ds is not None else None
        if self._pending_snapshot is not None and stats is not None:
            self.histograms.append(_histogram(self._pending_snapshot, stats["threshold"], epoch))
            self._pending_snapshot = None
        acc, test_loss = evaluate(model, self.x_test, self.y_test, cfg.eval_batch_size, cfg.channels_last)
        record = EpochRecord(
            epoch=epoch,
            train_time=self.train_time,
            train_cpu_time=self.train_cpu,
            test_acc=acc,
            test_loss=test_loss,
            train_loss=float(loss_sum) / max(nb, 1),
            steps=nb,
            loaded=int(order.numel()),
            forwarded=fwd,
            select_forwarded=sel_fwd,
            backpropagated=bwd,
            lr=lr,
            threshold=None if stats is None else stats["threshold"],
            pruning=None if stats is None else bool(stats["pruning"]),
        )
        self.records.append(record)
        if ds is not None and epoch + 1 in self._snapshot_epochs:
            self._pending_snapshot = ds.scores.values.detach().clone()  # what epoch + 1 is planned from
        self.eval_time += time.perf_counter() - t1
        if self.done:
            self.load_avg.append(_load_avg())
        return record

    def result(self) -> RunResult:
        """The finished run."""
        return RunResult(
            label=self.spec.label,
            kind=self.spec.kind,
            seed=self.seed,
            num_train=self.data.num_train,
            epochs=list(self.records),
            histograms=list(self.histograms),
            eval_time=self.eval_time,
            sb_scale=self.spec.sb_scale if self.spec.selects else 1.0,
            load_avg=list(self.load_avg),
            budget=self.budget,
            full_epochs=self.cfg.epochs,
        )


def _bar_step(bar: Any) -> Callable[[float], Any] | None:
    return None if bar is None else bar.update


def train_run(
    data: DataSplit,
    spec: MethodSpec,
    seed: int,
    cfg: TrainConfig,
    progress_bar: Callable[..., Any] | None = None,
) -> RunResult:
    """Train one fresh model with ``spec`` and ``seed``; evaluate after every epoch.

    ``progress_bar(total=..., desc=...)`` makes a tqdm-like bar (``update``, ``set_postfix_str``,
    ``close``); None shows nothing. A ``KeyboardInterrupt`` propagates: the run is discarded.
    """
    return train_interleaved(data, [spec], seed, cfg, progress_bar)[0]


def train_interleaved(
    data: DataSplit,
    specs: list[MethodSpec],
    seed: int,
    cfg: TrainConfig,
    progress_bar: Callable[..., Any] | None = None,
) -> list[RunResult]:
    """Train one run per method at ``seed``, alternating between them epoch by epoch.

    On a machine that also runs other work, a slow spell then slows every method alike instead
    of the one that happened to be running. Results are those of separate runs.

    Runs of different lengths (budget baselines) are spread over the same span: the next epoch
    always goes to the run whose next epoch is the least far along its own training (by the
    middle of that epoch, as a fraction of the run's length), so a run half as long trains about
    every other round, from the start of the seed to its end, instead of all of its epochs
    first; with equal lengths this is plain round-robin in the given order.
    """
    trainers = [Trainer(data, spec, seed, cfg) for spec in specs]
    bars = [
        progress_bar(total=t.num_epochs, desc=f"{t.spec.label} seed {seed}", position=k)
        if progress_bar
        else None
        for k, t in enumerate(trainers)
    ]
    try:
        while not all(t.done for t in trainers):
            k = min(
                (k for k, t in enumerate(trainers) if not t.done), key=lambda k: trainers[k].next_midpoint
            )
            bar = bars[k]
            rec = trainers[k].run_epoch(_bar_step(bar))
            if bar is not None:
                bar.set_postfix_str(f"acc {rec.test_acc:.2f}%")
    finally:
        for bar in bars:
            if bar is not None:
                bar.close()
    return [t.result() for t in trainers]


def _load_avg() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return -1.0


def _snapshot_epochs(spec: MethodSpec, epochs: int, count: int) -> set[int]:
    """Pruning epochs (first, middle, last) whose planning scores are kept for the histogram plot."""
    if not spec.prunes or count <= 0:
        return set()
    last = min(int(math.floor(spec.delta * epochs)), epochs) - 1
    if last < 1:
        return set()
    if count == 1:
        return {last}
    picks = {1 + (k * (last - 1)) // (count - 1) for k in range(count)}
    return {p for p in picks if 1 <= p <= last}
