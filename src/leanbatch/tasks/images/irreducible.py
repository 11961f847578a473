"""RHO-LOSS's irreducible losses in the image task: a small model trained on a holdout split, its cost counted.

Mindermann et al. (2022) train the irreducible-loss (IL) model on a holdout set separate from the
training set. The benchmark has no extra data, and every row must train on the same data as the
baseline it is compared with, so:

- the **main model trains on the whole training set**, like every other row;
- the **IL model** (the run's model at ``il_width`` of its stage widths, the run's optimiser,
  cosine schedule and augmentation) trains on a **holdout split of that training set**:
  ``holdout`` of each class, drawn with a generator seeded by the run's seed (stratified), for
  ``il_epochs`` epochs (``None``: the run's);
- one no-grad forward of the IL model (eval mode) over the whole training set gives each
  sample's irreducible loss (plain cross-entropy, as the selection forward scores). The
  holdout's own samples are scored by a model that trained on them, so their irreducible loss
  is lower and their reducible loss higher than the paper's setting would give: a 10% share of
  samples slightly favoured, the price of using no data the baseline does not have.

**The cost is the method's**: :func:`train_irreducible` measures the wall-clock and CPU time of
training and scoring (the run adds them to its clocks before its first epoch, so the equal-time
comparison charges them) and counts the samples forwarded and backpropagated, with ``cost``, one
IL sample pass's FLOPs as a share of the main model's (counted by
:class:`torch.utils.flop_counter.FlopCounterMode` on the meta device), so the work fraction
charges them too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch import ProgressLR, cosine
from leanbatch.engine.running.data import Budget
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import DataSplit
from leanbatch.tasks.images.loop import augment
from leanbatch.tasks.images.models import build_model

__all__ = ["data_rows", "flop_share", "holdout_split", "train_irreducible"]

_SEED_OFFSET = 7_919  # the IL model's initialisation, shuffles and augmentation: private, from the run's seed


def holdout_split(targets: Tensor, share: float, seed: int) -> Tensor:
    """The dataset indices of a stratified holdout: ``round(share * n_c)`` samples of each class ``c``
    (halves up), drawn with a generator seeded by ``seed``; sorted.

    Example:
        >>> import torch
        >>> idx = holdout_split(torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 2, 2]), 0.5, seed=3)
        >>> idx.numel(), torch.bincount(torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 2, 2])[idx]).tolist()
        (5, [2, 2, 1])
    """
    gen = torch.Generator().manual_seed(seed + _SEED_OFFSET)
    chosen = []
    for c in torch.unique(targets.cpu()).tolist():
        members = (targets.cpu() == c).nonzero().flatten()
        take = int(share * members.numel() + 0.5)
        chosen.append(members[torch.randperm(members.numel(), generator=gen)[:take]])
    return torch.cat(chosen).sort().values


def flop_share(data: DataSplit, cfg: TrainConfig, widths: tuple[int, ...]) -> float:
    """The FLOPs of one sample's forward through the run's model at ``widths``, as a share of the
    run's own model (counted on the meta device: no memory, no random draw).

    Example:
        >>> from leanbatch.tasks.images.data import load_data
        >>> round(flop_share(load_data("digits", 64, 16), TrainConfig(widths=(16, 32)), (4, 8)), 3) < 0.1
        True
    """
    from torch.utils.flop_counter import FlopCounterMode

    flops = []
    with torch.device("meta"):
        x = torch.empty((1, data.in_channels, data.image_size, data.image_size))
        for w in (widths, cfg.widths):
            # eval mode: one sample's FLOPs are the same, and BatchNorm accepts a batch of one there
            model = build_model(cfg.resolved_model(data), data.in_channels, data.num_classes, w).eval()
            with FlopCounterMode(display=False) as counter:
                model(x)
            flops.append(counter.get_total_flops())
    return flops[0] / flops[1]


def train_irreducible(
    data: DataSplit, cfg: TrainConfig, seed: int, settings: Mapping[str, Any]
) -> tuple[Tensor, dict[str, float]]:
    """Train the IL model of a ``rho-loss`` row (``settings``: ``holdout``, ``il_width``, ``il_epochs``)
    and score the training set; the losses ``(N,)`` on the run's device and the cost (module docstring):
    ``time_s``, ``cpu_time_s``, ``forwarded``, ``backpropagated``, ``cost``, ``holdout`` (samples).

    Example:
        >>> from leanbatch.tasks.images.data import load_data
        >>> data = load_data("digits", 64, 16)
        >>> il, cost = train_irreducible(data, TrainConfig(epochs=2, batch_size=8, widths=(8,)), 0,
        ...     {"holdout": 0.25, "il_width": 0.5, "il_epochs": None})
        >>> il.shape, cost["holdout"], cost["forwarded"], cost["backpropagated"]
        (torch.Size([64]), 17.0, 96.0, 32.0)
        >>> torch.set_flush_denormal(False)
        True
    """
    widths = cfg.scaled_widths(data, float(settings["il_width"]))
    epochs = cfg.epochs if settings["il_epochs"] is None else int(settings["il_epochs"])
    held = holdout_split(data.y_train, float(settings["holdout"]), seed)
    if held.numel() < 2:
        raise ValueError(
            f"rho-loss: holdout={settings['holdout']:g} leaves {held.numel()} samples to train on"
        )
    devices = [torch.device(cfg.device)] if torch.device(cfg.device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the run's global generator is left as it was
        torch.manual_seed(seed + _SEED_OFFSET)
        model = cfg.make_model(data, widths)
    t0, c0 = time.perf_counter(), time.process_time()
    steps = _train(model, data, cfg, held.to(cfg.device), epochs, seed)
    losses = _score(model, data, cfg)
    if torch.device(cfg.device).type == "cuda":
        torch.cuda.synchronize(cfg.device)
    cost = {
        "time_s": time.perf_counter() - t0,
        "cpu_time_s": time.process_time() - c0,
        "forwarded": float(steps + data.num_train),
        "backpropagated": float(steps),
        "cost": flop_share(data, cfg, widths),
        "holdout": float(held.numel()),
    }
    return losses, cost


def _train(model: nn.Module, data: DataSplit, cfg: TrainConfig, held: Tensor, epochs: int, seed: int) -> int:
    """Train ``model`` on the samples ``held`` for ``epochs`` epochs; the samples trained."""
    opt = cfg.optimizer(model)
    state = {"progress": 0.0}
    schedule = ProgressLR(opt, lambda: state["progress"], cosine(warmup=cfg.warmup))
    gen = torch.Generator().manual_seed(seed + _SEED_OFFSET)
    bs = min(cfg.batch_size, held.numel())
    per_epoch = Budget(min_batch=2).steps_per_epoch(held.numel(), bs) if bs == cfg.batch_size else 1
    total, trained = epochs * per_epoch, 0
    model.train()
    for epoch in range(epochs):
        order = held[torch.randperm(held.numel(), generator=gen).to(held.device)]
        for i in range(per_epoch):
            idx = order[i * bs : (i + 1) * bs]
            x, y = data_rows(data, cfg, idx)
            if cfg.resolved_augment(data):
                x = augment(x, gen)
            loss = F.cross_entropy(model(x), y, label_smoothing=cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            trained += idx.numel()
            state["progress"] = (epoch * per_epoch + i + 1) / total
            schedule.step()
    return trained


def data_rows(data: DataSplit, cfg: TrainConfig, idx: Tensor) -> tuple[Tensor, Tensor]:
    """The training rows ``idx`` on the run's device, in its memory format.

    Example:
        >>> from leanbatch.tasks.images.data import load_data
        >>> x, y = data_rows(load_data("digits", 64, 16), TrainConfig(), torch.tensor([0, 5]))
        >>> tuple(x.shape), y.shape[0]
        ((2, 1, 8, 8), 2)
    """
    x = data.x_train[idx.cpu()].to(cfg.device)
    if cfg.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, data.y_train[idx.cpu()].to(cfg.device)


@torch.no_grad()
def _score(model: nn.Module, data: DataSplit, cfg: TrainConfig) -> Tensor:
    """Each training sample's cross-entropy under ``model`` in eval mode, float32 ``(N,)`` on the device."""
    model.eval()
    out = []
    for start in range(0, data.num_train, cfg.eval_batch_size):
        x, y = data_rows(data, cfg, torch.arange(start, min(start + cfg.eval_batch_size, data.num_train)))
        out.append(F.cross_entropy(model(x), y, reduction="none").float())
    return torch.cat(out)
