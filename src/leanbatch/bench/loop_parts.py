"""What the measured loop calls besides a training step: augmentation, evaluation, the untimed
warm-up, and the loss-histogram snapshots of pruning epochs (each function has its example)."""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.data import CROP_PADDING, DataSplit
from leanbatch.policies import Policy

__all__ = ["augment", "evaluate", "histogram", "load_avg", "snapshot_epochs", "warm_up"]


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """Random crop (pad 4, reflect) and horizontal flip, per sample, on the batch's device.

    Example:
        >>> import torch
        >>> augment(torch.zeros(4, 3, 8, 8), torch.Generator().manual_seed(0)).shape
        torch.Size([4, 3, 8, 8])
    """
    b, _, h, w = x.shape
    pad = CROP_PADDING
    flip = torch.rand(b, generator=generator) < 0.5
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dev = x.device
    x = torch.where(flip.to(dev)[:, None, None, None], x.flip(3), x)
    xp = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    rows = (dy[:, None] + torch.arange(h)).to(dev)  # (b, h)
    cols = (dx[:, None] + torch.arange(w)).to(dev)  # (b, w)
    bi = torch.arange(b, device=dev)[:, None, None]
    out = xp.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
    return out.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


def histogram(values: Tensor, threshold: float | None, epoch: int, bins: int = 60) -> dict[str, Any]:
    """Log-spaced histogram of the finite scores, for the loss-histogram plot.

    Example:
        >>> import torch
        >>> h = histogram(torch.tensor([0.1, 1.0, float("nan")]), 0.5, epoch=2, bins=4)
        >>> h["num_scored"], h["below_threshold"], sum(h["counts"])
        (2, 1, 2)
    """
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
    """Test accuracy (percent) and mean cross-entropy over ``x``/``y``.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> acc, loss = evaluate(model, torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.long), 2, False)
        >>> acc in (0.0, 100.0), loss > 0
        (True, True)
    """
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
    """A few untimed steps (full and half resolution) so one-off kernel set-up is not charged to the
    first run; half batches keep two samples at least (BatchNorm cannot normalise one).

    Example:
        >>> from leanbatch.bench.data import load_data
        >>> warm_up(load_data("digits", 12, 4), TrainConfig(batch_size=3, widths=(4,), flush_denormal=False))
    """
    if cfg.flush_denormal:
        torch.set_flush_denormal(True)
    torch.manual_seed(12345)
    model = cfg.make_model(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    n = min(cfg.batch_size, data.num_train)
    x = data.x_train[:n].to(cfg.device)
    y = data.y_train[:n].to(cfg.device)
    for scale in (1.0, 0.5, 1.0):
        xb = x if scale == 1.0 else F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
        if cfg.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        for k in (n, min(n, max(2, n // 2))):
            loss = F.cross_entropy(model(xb[:k]), y[:k])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def load_avg() -> float:
    """The machine's 1-minute load average (-1 where the platform has none).

    Example:
        >>> isinstance(load_avg(), float)
        True
    """
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return -1.0


def snapshot_epochs(policy: Policy | None, epochs: int, count: int) -> set[int]:
    """Pruning epochs (first, middle, last) whose planning scores are kept for the histogram plot:
    among epochs 1 to the policy's last pruning epoch (epoch 0 plans from no scores).

    Example:
        >>> from leanbatch.policies import InfoBatchPolicy
        >>> snapshot_epochs(InfoBatchPolicy(0.5, 8, 0.875), 8, 3), snapshot_epochs(None, 8, 3)
        ({1, 3, 6}, set())
    """
    if policy is None or count <= 0:
        return set()
    last = min(int(math.floor(float(getattr(policy, "delta", 1.0)) * epochs)), epochs) - 1
    if last < 1:
        return set()
    if count == 1:
        return {last}
    picks = {1 + (k * (last - 1)) // (count - 1) for k in range(count)}
    return {p for p in picks if 1 <= p <= last}


def probe_step(net: nn.Module, x: Tensor, y: Tensor, channels_last: bool) -> None:
    """One training step's forward and backward on ``x``, ``y``, the weights left as they were (the
    gradients cleared, no optimizer step): what :meth:`~leanbatch.bench.world.World.time_overlap`
    times the score gather against."""
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    F.cross_entropy(net(x), y).backward()
    net.zero_grad(set_to_none=True)
