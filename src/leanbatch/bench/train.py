"""The measured training loop: one model, one seed, one method row.

Read top to bottom, it is a plain PyTorch loop with three method hooks:

1. the epoch's order of samples: a seeded permutation (``baseline``, ``sb``, ``obs``...) or the
   plan of an :class:`~leanbatch.InfoBatch` wrapper (every pruning row), served batch by batch,
   so pruned epochs simply have fewer batches;
2. per batch, a selecting row (:class:`~leanbatch.bench.selecting.Selection`) may pick the
   examples that get a training pass;
3. the loss: a plain mean, or InfoBatch's rescaled mean (``ds.update``).

Fairness rules every method obeys: the same model initialisation per seed, the same optimiser,
and a learning rate set on every step by the library's schedule, ``ProgressLR(opt, trainer,
cosine(warmup=cfg.warmup))``, from the loop's own progress,
``training_progress(epoch=, batch_idx=, batches_per_epoch=)``, so every schedule ends exactly at
the end of training however many steps an epoch has. (Earlier versions warmed up from
``(progress + 1e-3) / warmup``; the library's warm-up starts at 0, so the first step trains at
learning rate 0.) A baseline with a ``budget`` (a fraction of the baseline's steps, for the
equal-time frontier) counts its progress in steps, ``training_progress(step=, total_steps=)``, and
cuts its last epoch short where the steps run out, so its schedule, too, ends at its own end. A
baseline with a ``batch`` budget trains as many steps as the full baseline on batches of
``round(batch * batch_size)`` rows, counted the same way. ``cfg.lr_rule`` ``scaled`` multiplies
the LR of a step by the rows it trains over the batch size: a batch budget's every step, and a
selecting row's steps that train a selection (``same``: no change). A holdout model that a
row trains before its first epoch (``rho-loss``) is charged to its clocks.
With BatchNorm in the model, an epoch's last batch of one sample is left out (counted in
``EpochRecord.dropped``). The clock runs only around training (planning an epoch included);
evaluation on the test split after every epoch is not timed.

:func:`~leanbatch.bench.interleave.train_interleaved` runs the methods of one seed side by side,
an epoch of each in turn, so that a busy spell of a shared machine slows all of them alike.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch.bench.config import TrainConfig, budget_steps, has_batchnorm
from leanbatch.bench.data import DataSplit
from leanbatch.bench.loop_parts import augment as augment_batch
from leanbatch.bench.loop_parts import evaluate, histogram, load_avg, probe_step, snapshot_epochs, warm_up
from leanbatch.bench.methods import MethodRow
from leanbatch.bench.records import EpochRecord, RunResult
from leanbatch.bench.selecting import Picked, Selection
from leanbatch.bench.world import ALONE, World
from leanbatch.carrier import CARRIED_ROW_BYTES
from leanbatch.infobatch import InfoBatch
from leanbatch.progress import training_progress
from leanbatch.rng import STEP_ROW_BYTES
from leanbatch.schedule import ProgressLR, cosine

__all__ = [
    "TrainConfig",
    "EpochRecord",
    "RunResult",
    "Trainer",
    "evaluate",
    "warm_up",
    "budget_steps",
]


@dataclass
class _Tally:
    """What an epoch's steps add up: the summed loss, the samples of each kind of pass, the last LR,
    the host time in ``InfoBatch.update`` and the bytes its score gathers return (pruning rows)."""

    loss_sum: Tensor
    forwarded: int = 0
    select_forwarded: int = 0
    backpropagated: int = 0
    lr: float = 0.0
    update_time: float = 0.0
    gathered: int = 0


class Trainer:
    """One run (a method row, a seed) that trains an epoch at a time, so runs can be interleaved.

    ``run_epoch()`` trains and then evaluates one epoch and returns its record; ``result()``
    gathers the finished run; ``progress`` is the fraction of the run trained, which the
    learning-rate schedule and selection read. The run's randomness is private (model
    initialisation is drawn in ``__init__``; shuffling, pruning, selection and augmentation use
    their own seeded generators), so interleaving runs epoch by epoch changes no result.

    Example:
        >>> from leanbatch.bench.data import load_data
        >>> from leanbatch.bench.methods import parse_methods
        >>> data = load_data("digits", 64, 16)
        >>> t = Trainer(data, parse_methods("infobatch")[0], 0, TrainConfig(epochs=2, batch_size=16, widths=(4,)))
        >>> [t.run_epoch().steps for _ in range(2)], t.done, t.progress
        ([4, 4], True, 1.0)
        >>> torch.set_flush_denormal(False)
        True
    """

    def __init__(self, data: DataSplit, row: MethodRow, seed: int, cfg: TrainConfig, world: World = ALONE):
        share = world.share(data.num_train)  # the samples of a full epoch each rank trains
        full_steps = world.local(cfg).batches(share, cfg.batchnorm(data))  # the full baseline's per epoch
        if row.batch != 1.0:
            cfg = cfg.at_batch(row.batch)  # a batch-budget baseline: smaller batches, LR by the rule
        self.data, self.row, self.seed, self.cfg, self.world = data, row, seed, cfg, world
        self.local = world.local(cfg)  # a rank's share of a step (the whole of it in one process)
        self.device = torch.device(cfg.device)
        if cfg.flush_denormal:
            torch.set_flush_denormal(True)
        torch.manual_seed(seed)  # same initial weights for every method at this seed
        self.net = cfg.make_model(data)  # selection and evaluation read it; training goes through
        self.model = world.wrap(self.net)  # ``model`` (DistributedDataParallel under torchrun)
        self.batchnorm = has_batchnorm(self.net)
        self.opt = cfg.optimizer(self.net)
        self.progress = 0.0  # the fraction of this run trained, set by the loop before each step
        self.schedule = ProgressLR(self.opt, self, cosine(warmup=cfg.warmup))
        self.augment = cfg.resolved_augment(data)
        self.aug_gen = torch.Generator().manual_seed(seed + 1_000_003)
        self.shuffle_gen = torch.Generator().manual_seed(seed)
        self.x_train, self.y_train = data.x_train.to(self.device), data.y_train.to(self.device)
        self.x_test, self.y_test = data.x_test.to(self.device), data.y_test.to(self.device)
        policy = row.make_policy(cfg.epochs, seed) if row.prunes else None
        # InfoBatch only needs the dataset's length: batches come from the in-memory tensors by index.
        self.ds = (
            None if policy is None else InfoBatch(range(data.num_train), cfg.epochs, seed=seed, policy=policy)
        )
        # Under torchrun a step's score rows ride DDP's gradient all-reduce: no collective of their own.
        self.carrier = None if self.ds is None or world.size == 1 else self.ds.carry_scores(self.model)
        self.select = Selection(row, seed, data, cfg, self.batchnorm) if row.selects else None
        # A budget run stops after its own number of steps (a share of the full baseline's; a batch
        # budget: all of them, on its smaller batches); the others train every epoch in full.
        self.steps_per_epoch = self.local.batches(share, self.batchnorm)
        self.total_steps: int | None = None
        self.num_epochs = cfg.epochs
        if row.budget != 1.0 or row.batch != 1.0:
            self.total_steps = budget_steps(row.budget, cfg.epochs, full_steps)
            self.num_epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.steps_done = 0
        self.records: list[EpochRecord] = []
        self.histograms: list[dict[str, Any]] = []
        self._snapshot_epochs = snapshot_epochs(policy, cfg.epochs, cfg.histogram_epochs)
        self._pending_snapshot: Tensor | None = None
        # A holdout model trained before the first epoch (rho-loss) is charged to the run's clocks.
        setup = None if self.select is None else self.select.setup
        self.train_time = 0.0 if setup is None else setup["time_s"]
        self.train_cpu = 0.0 if setup is None else setup["cpu_time_s"]
        self.eval_time = 0.0
        self.gather_time = self.overlap_time = self.gather_overlap_time = 0.0
        self.load_avg = [load_avg()]

    @property
    def done(self) -> bool:
        """Every epoch of the run is trained."""
        return len(self.records) == self.num_epochs

    @property
    def next_midpoint(self) -> float:
        """The middle of the next epoch, as a fraction of this run's length (for interleaving)."""
        if self.total_steps is None:
            return (len(self.records) + 0.5) / self.num_epochs
        next_steps = min(self.steps_per_epoch, self.total_steps - self.steps_done)
        return (self.steps_done + next_steps / 2) / self.total_steps

    # ------------------------------------------------------------------------ an epoch
    def run_epoch(self, on_step: Callable[[float], Any] | None = None) -> EpochRecord:
        """Train the next epoch (timed), then evaluate on the test split (not timed)."""
        epoch = len(self.records)
        self.model.train()
        t0, c0 = time.perf_counter(), time.process_time()
        batches, num_batches, served = self._epoch(epoch)
        tally = _Tally(torch.zeros((), device=self.device), lr=self.opt.param_groups[0]["lr"])
        for i, idx in enumerate(batches):
            self._set_progress(epoch, i, num_batches)  # this batch's place in training
            self._train_batch(idx, i, tally)
            self._set_progress(epoch, i + 1, num_batches)  # the next batch's: the LR it trains with
            self.schedule.step()
            if on_step is not None:
                on_step(1.0 / num_batches)
        self.steps_done += num_batches
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.train_time += time.perf_counter() - t0
        self.train_cpu += time.process_time() - c0
        return self._finish_epoch(epoch, num_batches, served, tally)

    def _epoch(self, epoch: int) -> tuple[Iterator[Tensor], int, int]:
        """The epoch's batches of dataset indices (int64, CPU), how many, and the samples served.

        A pruning row serves its plan: the sampler is read batch by batch (never listed whole);
        the other rows shuffle with their own generator. A budget run's last epoch stops where
        its steps run out.
        """
        bs, local = self.local.batch_size, self.local
        if self.ds is not None:
            self.ds.set_epoch(epoch)
            served_order = iter(self.ds.sampler)  # plans the epoch
            served = len(self.ds.sampler)  # this rank's shard of the plan
            num = local.batches(served, self.batchnorm)
            chunks = (
                torch.tensor(list(itertools.islice(served_order, bs)), dtype=torch.int64) for _ in range(num)
            )
            return chunks, num, served
        order = self.world.shard(torch.randperm(self.data.num_train, generator=self.shuffle_gen))
        num = local.batches(order.numel(), self.batchnorm)
        if self.total_steps is not None and self.total_steps - self.steps_done < num:
            num = self.total_steps - self.steps_done  # a budget run's last epoch stops early
            order = order[: num * bs]
        return (order[i * bs : (i + 1) * bs] for i in range(num)), num, int(order.numel())

    def _set_progress(self, epoch: int, batch_idx: int, num_batches: int) -> None:
        """The fraction of the run trained before batch ``batch_idx`` of ``epoch`` (by steps for a budget run)."""
        if self.total_steps is None:
            self.progress = training_progress(
                epoch=epoch, num_epochs=self.num_epochs, batch_idx=batch_idx, batches_per_epoch=num_batches
            )
        else:
            self.progress = training_progress(step=self.steps_done + batch_idx, total_steps=self.total_steps)

    def _train_batch(self, idx: Tensor, i: int, tally: _Tally) -> None:
        """One step on the samples ``idx``: gather, select, augment, forward, the method's loss, update."""
        cfg = self.cfg
        idx = idx.to(self.device, non_blocking=True) if self.device.type == "cuda" else idx
        x, y = self.x_train[idx], self.y_train[idx]
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        # Selection first (on the raw batch), then augmentation of what was selected.
        picked = None
        if self.select is not None:
            picked = self.select(self.net, x, y, self.progress, i, idx, self.opt.param_groups[0]["lr"])
        if picked is not None:
            tally.select_forwarded += x.shape[0] if self.select.forwards else 0  # type: ignore[union-attr]
            if cfg.lr_rule == "scaled":  # this step's LR times the share of the batch it trains
                for group in self.opt.param_groups:  # (the schedule sets it afresh for the next step)
                    group["lr"] *= picked.x.shape[0] / x.shape[0]
            x, y = picked.x, picked.y
        if self.augment:
            x = augment_batch(x, self.aug_gen)
        elif cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        per_sample = F.cross_entropy(self.model(x), y, reduction="none", label_smoothing=cfg.label_smoothing)
        if picked is not None and self.select.memory:  # type: ignore[union-attr]  # obs: ranks by these
            self.select.record(idx[picked.positions], per_sample)  # type: ignore[union-attr]
        t_update = time.perf_counter()
        loss = self._loss(per_sample, idx, picked)
        if self.ds is not None:  # the update; under torchrun its rows ride the backward's all-reduce
            tally.update_time += time.perf_counter() - t_update
            # every rank receives each rank's batch rows (an index and a loss: 20 bytes a row carried)
            row = STEP_ROW_BYTES if self.carrier is None else CARRIED_ROW_BYTES
            tally.gathered += 0 if self.world.size == 1 else self.world.size * idx.numel() * row
        tally.lr = self.opt.param_groups[0]["lr"]
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        tally.loss_sum += loss.detach()
        tally.forwarded += x.shape[0]
        tally.backpropagated += x.shape[0]

    def _loss(self, per_sample: Tensor, idx: Tensor, picked: Picked | None) -> Tensor:
        """The loss to backpropagate: the mean, or InfoBatch's rescaled mean (which stores the scores)."""
        ds = self.ds
        if ds is None:
            return per_sample.mean()
        if picked is None:
            return ds.update(per_sample, idx)  # stores the scores, returns the rescaled mean
        if picked.losses is not None and self.row.settings.get("stack_scores") == "selection":
            w = ds.weights(idx[picked.positions])  # the selected examples' weights in this batch's plan
            ds.update(picked.losses, idx)  # type: ignore[arg-type]  # scores of every example of the batch
            return (per_sample * w).mean()
        # "trained" (or a uniform choice, which scores none): only the trained rows' losses become scores
        return ds.update(per_sample, idx, positions=picked.positions)

    def _finish_epoch(self, epoch: int, num_batches: int, served: int, tally: _Tally) -> EpochRecord:
        """Evaluate (not timed), record the epoch, and keep the scores a histogram snapshot plans from."""
        t1 = time.perf_counter()
        stats = self.ds.epoch_stats[-1] if self.ds is not None else None
        if self._pending_snapshot is not None and stats is not None:
            self.histograms.append(histogram(self._pending_snapshot, stats["threshold"], epoch))
            self._pending_snapshot = None
        self.world.check_same(self.net, f"{self.row.label} seed {self.seed} epoch {epoch}")
        acc, test_loss = self._evaluate()
        trained = min(served, num_batches * self.local.batch_size)
        w = self.world  # the counts summed over the ranks, the time the slowest rank's
        counts = [served, trained, tally.forwarded, tally.select_forwarded, tally.backpropagated]
        loaded, kept, fwd, sel, bwd, loss_sum, update_time, cpu = w.sum(
            [*counts, float(tally.loss_sum), tally.update_time, self.train_cpu]
        )
        (wall,) = w.max([self.train_time])
        record = EpochRecord(
            epoch=epoch,
            train_time=wall,
            train_cpu_time=cpu,
            test_acc=acc,
            test_loss=test_loss,
            train_loss=loss_sum / w.size / max(num_batches, 1),
            steps=num_batches,
            loaded=int(loaded),
            forwarded=int(fwd),
            select_forwarded=int(sel),
            backpropagated=int(bwd),
            lr=tally.lr,
            threshold=None if stats is None else stats["threshold"],
            pruning=None if stats is None else bool(stats["pruning"]),
            dropped=int(loaded - kept),
            update_time=update_time / w.size,
            gathered_bytes=tally.gathered,
        )
        self.records.append(record)
        if self.ds is not None and epoch + 1 in self._snapshot_epochs:
            self._pending_snapshot = self.ds.scores.values.detach().clone()  # what epoch + 1 is planned from
        self.eval_time += time.perf_counter() - t1
        if self.done:
            self.load_avg.append(load_avg())
            if self.ds is not None:  # what a step's score rows cost (untimed; 0 in one process)
                bs, x, y = self.local.batch_size, self.x_train, self.y_train
                self.gather_time = self.world.time_gather(bs)
                probe = partial(probe_step, self.model, x[:bs], y[:bs], self.cfg.channels_last)
                self.overlap_time = self.world.time_overlap(probe, bs, self.carrier)  # as trained
                self.gather_overlap_time = self.world.time_overlap(probe, bs, None)  # by an all-gather
        return record

    def _carried_share(self) -> float:
        """The share of this run's score rows that rode the gradient all-reduce (0 without a carrier)."""
        c = self.carrier
        if c is None or c.carried_rows + c.gathered_rows == 0:
            return 0.0
        return c.carried_rows / (c.carried_rows + c.gathered_rows)

    def _evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss: under torchrun each rank evaluates a slice, summed over the ranks."""
        cfg, w = self.cfg, self.world
        x, y = self.x_test[w.rank :: w.size], self.y_test[w.rank :: w.size]
        acc, loss = evaluate(self.net, x, y, cfg.eval_batch_size, cfg.channels_last)
        if w.size == 1:
            return acc, loss
        correct, loss_sum, total = w.sum([acc * x.shape[0] / 100, loss * x.shape[0], x.shape[0]])
        return 100.0 * round(correct) / total, loss_sum / total

    def result(self) -> RunResult:
        """The finished run."""
        return RunResult(
            label=self.row.label,
            kind=self.row.kind,
            seed=self.seed,
            num_train=self.data.num_train,
            epochs=list(self.records),
            histograms=list(self.histograms),
            eval_time=self.eval_time,
            sb_scale=self.row.selection_scale if self.row.selects else 1.0,
            load_avg=list(self.load_avg),
            budget=self.row.budget,
            full_epochs=self.cfg.epochs,
            batch=self.row.batch,
            setup=None if self.select is None else self.select.setup,
            gather_time=self.gather_time,
            overlap_time=self.overlap_time,
            gather_overlap_time=self.gather_overlap_time,
            carried_share=self._carried_share(),
        )
