"""Tasks for the engine's tests, written as users write them (``--task tests/engine_tasks.py:NAME``).

``train`` is the issue's four-line change to a plain loop, on 384 rows of a 4-class problem with a
small MLP: seconds for a whole study. The others break the contract one way each.
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import ProgressLR, cosine

EPOCHS = 3
_g = torch.Generator().manual_seed(0)
X = torch.randn(480, 8, generator=_g)
Y = (X[:, :4].argmax(1) + (torch.rand(480, generator=_g) < 0.1).long()) % 4
TRAIN = TensorDataset(X[:384], Y[:384])
X_TEST, Y_TEST = X[384:], Y[384:]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@torch.no_grad()
def _accuracy(model: torch.nn.Module) -> float:
    return float((model(X_TEST).argmax(1) == Y_TEST).float().mean()) * 100


def train(run):  # type: ignore[no-untyped-def]
    torch.manual_seed(run.seed)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = run.wrap(TRAIN, EPOCHS)
    loader = DataLoader(ds, batch_size=run.batch_size(32), sampler=ds.sampler)
    sched = ProgressLR(opt, ds, cosine(warmup=0.03))
    acc = 0.0
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, y in loader:
            loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        with run.untimed():
            acc = _accuracy(model)
        run.log(epoch=epoch, metric=acc)
    return acc


def loss_by_steps(run):  # type: ignore[no-untyped-def]
    """A metric with a known answer: the loss is 10 / steps for a baseline and 1 / steps for a method
    (ten times better, whatever the time)."""
    ds = run.wrap(TRAIN, EPOCHS)
    loader = DataLoader(ds, batch_size=run.batch_size(32), sampler=ds.sampler)
    steps, gen = 0, torch.Generator().manual_seed(run.seed)
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in loader:
            ds.update(torch.rand(len(x), generator=gen))
            steps += 1
    loss = (1.0 if run.kind != "baseline" else 10.0) / steps
    return {"eval_loss": loss, "score": -loss}


def ignores_batch_size(run):  # type: ignore[no-untyped-def]
    ds = run.wrap(TRAIN, EPOCHS)
    run.batch_size(32)  # asked, and then not used
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in DataLoader(ds, batch_size=32, sampler=ds.sampler):
            ds.update(torch.ones(len(x)))
        run.log(epoch=epoch, metric=1.0)
    return 1.0


def no_batch_size(run):  # type: ignore[no-untyped-def]
    ds = run.wrap(TRAIN, EPOCHS)
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in DataLoader(ds, batch_size=32, sampler=ds.sampler):
            ds.update(torch.ones(len(x)))
    return 1.0


def fixed_loop(run):  # type: ignore[no-untyped-def]
    """Its own shuffled loop of the full length: the arm's sampler never used."""
    ds = run.wrap(TRAIN, EPOCHS)
    for _epoch in range(EPOCHS):
        for x, _ in DataLoader(TRAIN, batch_size=run.batch_size(32), shuffle=True):
            ds.update(torch.ones(len(x)))
    return 1.0


def raises_in_infobatch(run):  # type: ignore[no-untyped-def]
    if run.kind == "infobatch":
        raise ZeroDivisionError("the user's bug")
    return train(run)


def clocked(run):  # type: ignore[no-untyped-def]
    """Little training, a long evaluation off the clock; global-RNG noise in every step, seeded per arm."""
    torch.manual_seed(run.seed + len(run.label))
    ds = run.wrap(TRAIN, EPOCHS)
    total = torch.zeros(())
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in DataLoader(ds, batch_size=run.batch_size(128), sampler=ds.sampler):
            total += torch.rand(()) + ds.update(torch.ones(len(x))).detach()
        with run.untimed():
            time.sleep(0.15)
        run.log(epoch=epoch, metric=float(total))
    return float(total)


def whole(run):  # type: ignore[no-untyped-def]
    """Never logs: a whole run in one turn."""
    ds = run.wrap(TRAIN, EPOCHS)
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in DataLoader(ds, batch_size=run.batch_size(64), sampler=ds.sampler):
            ds.update(torch.ones(len(x)))
    return 1.0


def returns_none(run):  # type: ignore[no-untyped-def]
    return None


def returns_nan(run):  # type: ignore[no-untyped-def]
    return math.nan


def two_args(run, extra):  # type: ignore[no-untyped-def]
    return 1.0


NOT_CALLABLE = 3


ORDER: list[tuple[str, int]] = []  # (arm, epoch) of every run.log, in the order they ran


def logged(run):  # type: ignore[no-untyped-def]
    ds = run.wrap(TRAIN, EPOCHS)
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, _ in DataLoader(ds, batch_size=run.batch_size(32), sampler=ds.sampler):
            ds.update(torch.ones(len(x)))
        ORDER.append((run.label, epoch))
        run.log(epoch=epoch, metric=float(epoch))
    return 1.0


EPOCHS_RUN = [0]  # epochs begun by interrupted_at_the_fourth_epoch, over every arm


def interrupted_at_the_fourth_epoch(run):  # type: ignore[no-untyped-def]
    """``whole``, one epoch, with a Ctrl-C at the fourth epoch any arm begins."""
    ds = run.wrap(TRAIN, 1)
    EPOCHS_RUN[0] += 1
    if EPOCHS_RUN[0] == 4:
        raise KeyboardInterrupt
    for x, _ in DataLoader(ds, batch_size=run.batch_size(64), sampler=ds.sampler):
        ds.update(torch.ones(len(x)))
    run.log(epoch=0, metric=1.0)
    return 1.0


NOISE: dict[str, float] = {}  # label -> seconds slept in every training step (timing noise, no randomness)
TRAINED: dict[str, list[int]] = {}  # label -> the steps each of its epochs trained, as the task counts them


def _fit(run, batch_size, *, drop_last=False, every=1, name="metric", reduction="none"):  # type: ignore[no-untyped-def]
    """``train``'s loop over ``ds.num_epochs``, counting its own steps (``TRAINED``) and sleeping
    ``NOISE[run.label]`` in each: every ``every``-th batch trained, the accuracy logged as ``name``."""
    torch.manual_seed(run.seed)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = run.wrap(TRAIN, EPOCHS)
    loader = DataLoader(ds, batch_size=batch_size, sampler=ds.sampler, drop_last=drop_last)
    sched = ProgressLR(opt, ds, cosine(warmup=0.03))
    acc = 0.0
    for epoch in range(ds.epoch, ds.num_epochs):
        ds.set_epoch(epoch)
        TRAINED.setdefault(run.label, []).append(0)
        for i, (x, y) in enumerate(loader):
            if i % every:
                continue
            loss = ds.update(F.cross_entropy(model(x), y, reduction=reduction))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            TRAINED[run.label][-1] += 1
            time.sleep(NOISE.get(run.label, 0.0))
        with run.untimed():
            acc = _accuracy(model)
        run.log(epoch=epoch, **{name: acc}, **({"progress": ds.progress} if drop_last else {}))
    return acc


def noisy(run):  # type: ignore[no-untyped-def]
    """Sleeps ``NOISE[run.label]`` seconds in every training step: the same training, other times."""
    return _fit(run, run.batch_size(32))


def misnamed_metric(run):  # type: ignore[no-untyped-def]
    """Logs its metric as ``accuracy``: the study's metric (``metric``) is never there."""
    return _fit(run, run.batch_size(32), name="accuracy")


def hard_coded_batch(run):  # type: ignore[no-untyped-def]
    """Asks run.batch_size and trains on batches of 32 whatever it said."""
    run.batch_size(32)
    return _fit(run, 32)


def skips_batches(run):  # type: ignore[no-untyped-def]
    """Trains every other batch: no budget can be trained by its steps."""
    return _fit(run, run.batch_size(32), every=2)


def mean_loss(run):  # type: ignore[no-untyped-def]
    """Hands update() the batch's mean loss, not one loss per sample (the commonest slip)."""
    return _fit(run, run.batch_size(32), reduction="mean")


def drops_last(run):  # type: ignore[no-untyped-def]
    """A loader that drops its last partial batch (384 rows in batches of 40: 9 steps an epoch, not 10)."""
    return _fit(run, run.batch_size(40), drop_last=True)


def counted(run):  # type: ignore[no-untyped-def]
    """``train``, each finished training appended to the file ``LEANBATCH_TEST_COUNT`` names; while the
    file ``LEANBATCH_TEST_STALL`` names holds N and N runs are counted, an epoch stalls (it says so on
    stdout and in the file ``<that file>.stalled``, then sleeps)."""
    path, stall = os.environ["LEANBATCH_TEST_COUNT"], os.environ.get("LEANBATCH_TEST_STALL", "")

    def log(**values: float) -> None:
        if stall and os.path.exists(stall) and _lines(path) >= int(open(stall).read()):
            print(f"stalled in {run.label} seed {run.seed}", flush=True)
            open(stall + ".stalled", "w").close()
            time.sleep(600)
        run.log(**values)

    metric = train(_Logged(run, log))
    with open(path, "a") as fh:
        fh.write(f"{run.label} seed {run.seed}\n")
    return metric


def _lines(path: str) -> int:
    try:
        with open(path) as fh:
            return len(fh.readlines())
    except FileNotFoundError:
        return 0


class _Logged:
    """The run, its ``log`` replaced."""

    def __init__(self, run, log):  # type: ignore[no-untyped-def]
        self._run, self.log = run, log

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._run, name)
