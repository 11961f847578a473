"""The built-in task: a small CNN or compact ResNet on in-memory images, written against the run contract.

Read top to bottom, :meth:`ImageTask.__call__` is a plain PyTorch loop with the four calls every
task makes (``run.wrap``, ``run.batch_size``, ``run.untimed``, ``run.log``) and the selection hook
(``run.select``). Fairness rules every arm obeys: the same model initialisation per seed
(``torch.manual_seed(run.seed)``), the same optimizer (SGD, Nesterov), and a learning rate set on
every step by the library's ``ProgressLR`` from the loop's own progress: by batches of each epoch
(``training_progress(epoch=, num_epochs=, batch_idx=, batches_per_epoch=)``), so a pruned epoch
counts one epoch however few its batches, or, for an arm whose length is fixed in steps (a budget:
``run.total_steps``), by steps, so its schedule ends at its own end. ``lr_rule="scaled"`` multiplies
the LR of a step by the rows it trains over the batch size (a batch budget's every step, a selected
batch's). Batches are cut from the in-memory tensors by the served indices (the arm's sampler); a
last batch of one sample is left out with BatchNorm in the model (``run.wrap(..., min_batch=2)``).
Augmentation (random crop and flip, RGB) follows selection, from the arm's own generator.
Evaluation on the test split after every epoch is off the clock (``run.untimed()``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch import ProgressLR, cosine, training_progress
from leanbatch.arms.methods import Arm
from leanbatch.engine.running.data import Budget
from leanbatch.engine.running.selecting import smallest_trained
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import DataError, DataSplit, check_image_size
from leanbatch.tasks.images.irreducible import holdout_split, train_irreducible
from leanbatch.tasks.images.loop import augment, evaluate, warm_up

__all__ = ["ImageTask", "check_batches"]

_AUGMENT_SEED = 1_000_003  # the augmentation generator's offset from the run's seed


class ImageTask:
    """The image task over ``data`` with the training configuration ``cfg``; call it with a run.

    Example:
        >>> from leanbatch.engine.study import bench
        >>> from leanbatch.tasks.images.data import load_data
        >>> task = ImageTask(load_data("digits", 64, 16), TrainConfig(epochs=2, batch_size=16, widths=(4,)))
        >>> report = bench(task, methods="baseline,sb[start=0]", metric="accuracy", budgets="none", batch_budgets="none")
        >>> [(r["method"], r["steps"]) for r in report["runs"]], report["runs"][1]["backward_fraction"] < 1
        ([('baseline', 8), ('sb[start=0]', 8)], True)
        >>> torch.set_flush_denormal(False)
        True
    """

    def __init__(self, data: DataSplit, cfg: TrainConfig):
        self.data, self.cfg = data, cfg
        self._warm = False

    def __call__(self, run: Any) -> float:
        data, cfg = self.data, self.cfg
        with run.untimed():
            if not self._warm:  # one-off kernel set-up, charged to no arm
                warm_up(data, cfg)
                self._warm = True
            arm = _Arm(self, run)
        ds = run.wrap(range(data.num_train), cfg.epochs, min_batch=arm.min_batch)
        total, steps_done, acc = run.total_steps, 0, float("nan")

        def place(epoch: int, i: int, num: int) -> float:  # the fraction of the arm trained before batch i
            if total is not None:
                return training_progress(step=steps_done + i, total_steps=total)
            return training_progress(epoch=epoch, num_epochs=cfg.epochs, batch_idx=i, batches_per_epoch=num)

        for epoch in range(ds.num_epochs):
            arm.net.train()
            ds.set_epoch(epoch)
            order = iter(ds.sampler)
            served = len(ds.sampler)
            num = Budget(min_batch=arm.min_batch).steps_per_epoch(served, arm.rows) if served else 0
            loss_sum = torch.zeros((), device=arm.x_train.device)
            for i in range(num):
                idx = torch.tensor(list(itertools.islice(order, arm.rows)), dtype=torch.int64)
                arm.progress = place(epoch, i, num)
                loss_sum += arm.step(run, ds, idx, i)
                arm.progress = place(epoch, i + 1, num)  # the next batch's: the LR it trains with
                arm.schedule.step()
            steps_done += num
            with run.untimed():
                acc, test_loss = evaluate(
                    arm.net, arm.x_test, arm.y_test, cfg.eval_batch_size, cfg.channels_last
                )
                train_loss = float(loss_sum) / max(num, 1)
            run.log(epoch=epoch, accuracy=acc, test_loss=test_loss, train_loss=train_loss, lr=arm.lr)
        return acc


class _Arm:
    """One run's model, optimizer, schedule, generators and data on the device (built off the clock)."""

    def __init__(self, task: ImageTask, run: Any):
        data, cfg = task.data, task.cfg
        self.cfg, self.data = cfg, data
        device = torch.device(cfg.device)
        if cfg.flush_denormal:
            torch.set_flush_denormal(True)
        torch.manual_seed(run.seed)  # the same initial weights for every arm at this seed
        self.net = cfg.make_model(data)
        self.min_batch = 2 if cfg.batchnorm(data) else 1  # BatchNorm cannot normalise one sample
        self.rows = run.batch_size(cfg.batch_size)
        lr = cfg.lr * self.rows / cfg.batch_size if cfg.lr_rule == "scaled" else cfg.lr
        self.opt = cfg.optimizer(self.net)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.progress = 0.0  # the fraction of the arm trained, set by the loop before each step
        self.lr = lr  # the learning rate of the last step
        self.schedule = ProgressLR(self.opt, self, cosine(warmup=cfg.warmup))
        self.augment = cfg.resolved_augment(data)
        self.aug_gen = torch.Generator().manual_seed(run.seed + _AUGMENT_SEED)
        self.x_train, self.y_train = data.x_train.to(device), data.y_train.to(device)
        self.x_test, self.y_test = data.x_test.to(device), data.y_test.to(device)
        self.hooks = {"proxy": self._proxy, "irreducible": lambda: self._irreducible(run)}

    def _proxy(self, width: float) -> tuple[Any, Any]:
        """``sb-proxy``'s proxy: the model at ``width`` of its stage widths, the run's optimizer settings."""
        model = self.cfg.make_model(self.data, self.cfg.scaled_widths(self.data, width))
        return model, self.cfg.optimizer(model)

    def _irreducible(self, run: Any) -> Tensor:
        """``rho-loss``'s holdout losses, the holdout model's work charged to the run."""
        losses, cost = train_irreducible(self.data, self.cfg, run.seed, run.settings)
        run.charge(cost["forwarded"], cost["backpropagated"], cost["cost"])
        run.note(holdout=cost["holdout"])
        return losses

    def step(self, run: Any, ds: Any, idx: Tensor, i: int) -> Tensor:
        """One step on the samples ``idx``: gather, select, augment, forward, the arm's loss, update."""
        cfg, opt = self.cfg, self.opt
        idx = idx.to(self.x_train.device, non_blocking=True) if self.x_train.device.type == "cuda" else idx
        x, y = self.x_train[idx], self.y_train[idx]
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        lr = opt.param_groups[0]["lr"]
        pick = run.select(
            (x, y),
            self.net,
            F.cross_entropy,
            indices=idx,
            progress=self.progress,
            batch_idx=i,
            lr=lr,
            **self.hooks,
        )
        if pick.positions is not None:
            if cfg.lr_rule == "scaled":  # this step's LR times the share of the batch it trains
                for group in opt.param_groups:  # (the schedule sets it afresh for the next step)
                    group["lr"] *= pick.batch[0].shape[0] / x.shape[0]
            x, y = pick.batch
        if self.augment:
            x = augment(x, self.aug_gen)
        elif cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        self.lr = opt.param_groups[0]["lr"]
        per_sample = F.cross_entropy(self.net(x), y, reduction="none", label_smoothing=cfg.label_smoothing)
        loss = pick.update(ds, per_sample)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()


def check_batches(data: DataSplit, arms: list[Arm], cfg: TrainConfig) -> bool:
    """Refuse, before anything trains, batches the model cannot train under every arm (BatchNorm's two
    rows, a selection's smallest batch), budgets that do not fit the training set and images too
    small: a :class:`~leanbatch.tasks.images.data.DataError` naming the option and the fix. Returns
    whether a full epoch's last batch of one is left out (with BatchNorm in the model, which cannot
    normalise a single sample), said on the terminal.
    """
    bs = cfg.batch_size
    if bs > data.num_train:
        raise DataError(f"--batch-size {bs} is larger than the training set ({data.num_train} samples)")
    scales = [a.settings["scale_factor"] for a in arms if "scale_factor" in a.settings]
    check_image_size(data, cfg.resolved_augment(data), scales)
    for arm in arms:
        rows = Budget(batch=arm.batch).rows(bs)
        if arm.batch != 1.0 and not 2 <= rows <= data.num_train:
            raise DataError(
                f"{arm.label}: a batch of round({arm.batch:g} x {bs}) = {rows} rows; a batch budget needs 2 rows "
                f"or more and at most the training set's {data.num_train} (change it or --batch-size)"
            )
        if arm.kind == "rho-loss" and holdout_split(data.y_train, arm.settings["holdout"], 0).numel() < 2:
            raise DataError(
                f"{arm.label}: holdout={arm.settings['holdout']:g} of {data.num_train} samples leaves fewer than 2 "
                "for the holdout model to train on"
            )
    if not cfg.batchnorm(data):
        return False
    if bs == 1:
        raise DataError(
            f"--batch-size {bs}: the model normalises by batch statistics (BatchNorm), which needs 2 rows or more"
        )
    for arm in arms:
        if arm.selects and smallest_trained(arm.probe_selector(), bs) < 2:
            raise DataError(
                f"{arm.label} trains one row of a batch of {bs}, and the model's BatchNorm cannot normalise one: "
                "use a larger --batch-size or keep"
            )
    if data.num_train % bs != 1:
        return False
    print(
        f"leanbatch: note: {data.num_train} training samples in batches of {bs} leave a last batch of one, which "
        "BatchNorm cannot normalise: it is left out of each epoch (results.json: runs[].epochs[].dropped)",
        flush=True,
    )
    return True
