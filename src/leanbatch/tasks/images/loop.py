"""What the image task's loop calls besides a training step: augmentation, evaluation, and the
untimed warm-up (each function has its example)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import CROP_PADDING, DataSplit

__all__ = ["augment", "evaluate", "warm_up"]


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """Random crop (pad 4, reflect) and horizontal flip, per sample, on the batch's device."""
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
        >>> from leanbatch.tasks.images.data import load_data
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
