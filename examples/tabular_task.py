"""A task that is not images: an MLP on a tabular classification problem from scikit-learn (no download).

Judge every method on it, against the baseline trained shorter and on smaller batches (the envelope)
and each choosing method's uniform twin::

    leanbatch bench --task examples/tabular_task.py:train --seeds 0,1,2 --controls --methods baseline,random,infobatch,obs

The loop is a plain PyTorch loop; the lines that involve ``run`` are the whole change from the loop
you would write without leanbatch (``ds = InfoBatch(train_set, EPOCHS)`` becomes ``run.wrap``, the batch
size goes through ``run.batch_size``, evaluation through ``run.untimed``, each epoch's metric through
``run.log``); ``run.select`` is the hook the batch-level methods (``obs``, ``sb[scale_factor=1]``,
``uniform``) choose rows with, and returns the whole batch for every other method.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import ProgressLR, cosine

EPOCHS = 10

# 6,000 rows of 20 features, 4 classes: made once (fixed seed), shared by every arm
_x, _y = make_classification(
    6000, 20, n_informative=12, n_classes=4, class_sep=0.8, flip_y=0.05, random_state=0
)
_x_tr, _x_te, _y_tr, _y_te = train_test_split(_x, _y, test_size=0.25, random_state=0, stratify=_y)
_mean, _std = _x_tr.mean(0), _x_tr.std(0)
X_TRAIN = torch.tensor((_x_tr - _mean) / _std, dtype=torch.float32)
X_TEST = torch.tensor((_x_te - _mean) / _std, dtype=torch.float32)
Y_TRAIN, Y_TEST = torch.tensor(_y_tr), torch.tensor(_y_te)


class Indexed(TensorDataset):
    """The training rows with their dataset index last: the batch-level methods need it."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return (*super().__getitem__(i), torch.tensor(i))


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(20, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 4),
    )


@torch.no_grad()
def accuracy(model: torch.nn.Module) -> float:
    model.eval()
    acc = (model(X_TEST).argmax(1) == Y_TEST).float().mean().item() * 100
    model.train()
    return acc


def train(run) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(run.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    ds = run.wrap(Indexed(X_TRAIN, Y_TRAIN), EPOCHS)
    loader = DataLoader(ds, batch_size=run.batch_size(64), sampler=ds.sampler)
    sched = ProgressLR(opt, ds, cosine(warmup=0.05))
    acc = 0.0
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, y, idx in loader:
            pick = run.select((x, y), model, F.cross_entropy, indices=idx)
            xs, ys = pick.batch
            loss = pick.update(ds, F.cross_entropy(model(xs), ys, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        with run.untimed():
            acc = accuracy(model)
        run.log(epoch=epoch, accuracy=acc)
    return acc
