"""A training loop kept in a module of its own, as a user's helper: it calls ``run.select``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def loop(run, data: TensorDataset, epochs: int) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(run.seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    indexed = TensorDataset(*data.tensors, torch.arange(len(data)))
    ds = run.wrap(indexed, epochs)
    loader = DataLoader(ds, batch_size=run.batch_size(32), sampler=ds.sampler)
    for epoch in range(ds.epoch, ds.num_epochs):
        ds.set_epoch(epoch)
        for x, y, idx in loader:
            pick = run.select((x, y), model, F.cross_entropy, indices=idx)
            xs, ys = pick.batch
            loss = pick.update(ds, F.cross_entropy(model(xs), ys, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
        run.log(epoch=epoch, metric=_score(model, data))
    return _score(model, data)


@torch.no_grad()
def _score(model: torch.nn.Module, data: TensorDataset) -> float:
    return -float(F.cross_entropy(model(data.tensors[0]), data.tensors[1]))
