"""The rank rule of Selective Backprop (the form MosaicML Composer popularised).

Sort a batch's per-example losses in ascending order; rank position ``i`` (0 =
smallest loss) has percentile ``p = (i + 0.5) / N`` and weight
``p ** (1 / keep - 1)``. Draw ``k = max(1, int(keep * N))`` examples without
replacement, each draw proportional to the weights of the examples not drawn yet.

The draw is a Gumbel top-k: adding independent Gumbel noise to the log-weights
and taking the ``k`` largest gives exactly that sequential draw (Plackett-Luce),
with a fixed ``k`` known on the host. So the whole selection - sort, noise, top-k,
gather - runs on the device with a private generator: no host-device sync, no
numpy round trip, no global RNG.
"""

from __future__ import annotations

import torch
from torch import Tensor

from leanbatch.scores import check_per_sample_loss
from leanbatch.selection._checks import check_fraction, rankable_losses
from leanbatch.selection.rng import resolve_generator

__all__ = ["gumbel_top_k", "num_selected", "rank_weights", "select_hardest", "select_indices"]


def num_selected(n: int, keep: float) -> int:
    """How many of ``n`` examples the rank rule keeps: ``max(1, int(keep * n))``.

    Composer uses ``int(keep * n)``, which keeps nothing from a small batch; here
    at least one example always trains.

    Example:
        >>> num_selected(128, 0.5), num_selected(1, 0.5), num_selected(3, 0.3)
        (64, 1, 1)
    """
    keep = check_fraction(keep, "keep")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the batch must hold at least one example, got n={n!r}")
    return max(1, int(keep * n))


def _log_weights(n: int, keep: float, device: torch.device) -> Tensor:
    pos = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n
    return torch.log(pos) * (1.0 / keep - 1.0)


def rank_weights(n: int, keep: float) -> Tensor:
    """Draw probabilities of rank positions ``0..n-1`` (0 = smallest loss), summing to one.

    These are the probabilities of the *first* draw; later draws renormalise over
    the positions not drawn yet.

    Example:
        >>> w = rank_weights(4, 0.5)  # keep=0.5: weight proportional to p = (i + 0.5) / 4
        >>> [round(x, 3) for x in w.tolist()]
        [0.062, 0.188, 0.312, 0.438]
    """
    keep = check_fraction(keep, "keep")
    num_selected(n, keep)  # validates n
    pos = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    w = pos ** (1.0 / keep - 1.0)
    return w / w.sum()


def select_indices(losses: Tensor, keep: float, generator: torch.Generator | None = None) -> Tensor:
    """Positions of the examples the rank rule keeps, sampled on the losses' device.

    Args:
        losses: per-example losses, shape ``(N,)``, any float or integer dtype.
            Only their order matters (ties keep batch order; NaN counts as the
            largest loss).
        keep: fraction to keep, in (0, 1]; ``k = max(1, int(keep * N))`` positions
            are returned.
        generator: a ``torch.Generator`` on the losses' device; ``None`` uses the
            module's private seeded generator (see :func:`seed_selection`).

    Returns:
        int64 tensor of ``k`` distinct positions in ``[0, N)``, ascending, on the
        losses' device. No host-device synchronisation.

    Example:
        >>> import torch
        >>> losses = torch.tensor([0.1, 5.0, 0.2, 4.0, 0.3, 3.0])
        >>> g = torch.Generator().manual_seed(0)
        >>> idx = select_indices(losses, keep=0.5, generator=g)
        >>> idx.shape, idx.dtype
        (torch.Size([3]), torch.int64)
        >>> select_indices(losses, keep=1.0).tolist()  # keep=1 keeps everything
        [0, 1, 2, 3, 4, 5]
    """
    if isinstance(losses, Tensor):
        losses = rankable_losses(losses, "losses")  # integer losses rank as floats
    losses = check_per_sample_loss(losses, "losses")
    n = losses.shape[0]
    k = num_selected(n, keep)
    gen = resolve_generator(generator, losses.device)
    if k == n:
        return torch.arange(n, device=losses.device)
    order = torch.argsort(losses.detach(), stable=True)  # rank position -> batch position
    return gumbel_top_k(order, _log_weights(n, float(keep), losses.device), k, gen)


def gumbel_top_k(order: Tensor, log_weights: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Draw ``k`` rank positions without replacement by ``log_weights``; their batch positions, ascending.

    ``order[i]`` is the batch position holding rank position ``i``. Adding Gumbel noise to
    the log-weights and keeping the ``k`` largest is the sequential weighted draw without
    replacement (Plackett-Luce), on the device, with ``k`` known on the host: no sync.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> gumbel_top_k(torch.tensor([2, 0, 1]), torch.tensor([0.0, 0.0, 50.0]), 1, g).tolist()  # rank 2
        [1]
    """
    n = order.shape[0]
    u = torch.rand(n, generator=generator, device=order.device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float32).tiny)))
    top = torch.topk(log_weights + gumbel, k, sorted=False).indices
    return torch.sort(order.index_select(0, top)).values


def select_hardest(losses: Tensor, keep: float) -> Tensor:
    """Positions of the ``max(1, int(keep * N))`` largest losses, ascending (NaN counts as largest).

    The deterministic rule of the airbench proxy runs: train on the hardest share of the batch.

    Example:
        >>> import torch
        >>> select_hardest(torch.tensor([0.1, 5.0, 0.2, 4.0]), keep=0.5).tolist()
        [1, 3]
    """
    if isinstance(losses, Tensor):
        losses = rankable_losses(losses, "losses")
    losses = check_per_sample_loss(losses, "losses")
    k = num_selected(losses.shape[0], keep)
    if k == losses.shape[0]:
        return torch.arange(k, device=losses.device)
    hard = torch.nan_to_num(losses.detach().float(), nan=float("inf"))
    return torch.sort(torch.topk(hard, k, sorted=False).indices).values
