"""Drawing by loss rank: the weighted draws without replacement that selection and pruning share.

A Gumbel top-k draws ``k`` items without replacement, each draw proportional to the weights of
the items not drawn yet (Gumbel noise on the log-weights, then the ``k`` largest: the sequential
weighted draw, Plackett-Luce), with ``k`` known on the host: no host-device sync. Online batch
selection (Loshchilov & Hutter) weighs the item of hardness rank ``r`` (0 = the largest loss) by
``s ** (-r / N)``: the hardest is about ``s`` times as likely as the easiest (``s`` is the
*selection pressure*, decaying from ``s_e0`` to ``s_end`` in the paper). In-batch selection
(:func:`leanbatch.selection.select_by_loss_rank`) and whole-dataset sampling
(:class:`leanbatch.policies.LossRankPolicy`) both draw with :func:`loss_rank_draw`.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> loss_rank_draw(torch.tensor([0.1, 9.0, 0.2, 8.0]), 2, pressure=1e6, generator=g).tolist()
    [1, 3]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from leanbatch.checks import check_real

__all__ = ["check_pressure", "decayed_pressure", "gumbel_top_k", "loss_rank_draw", "pressure_at"]

_PRESSURE = "the hardest example's odds over the easiest (1 = uniform; 100 is Loshchilov & Hutter's s_e0)"


def check_pressure(value: object, name: str = "selection_pressure") -> float:
    """A selection pressure: a finite float >= 1; ``ValueError`` naming ``name`` otherwise."""
    return check_real(value, name, low=1.0, hint=_PRESSURE)


def pressure_at(progress: float, start: float, end: float | None = None) -> float:
    """The selection pressure at ``progress`` in [0, 1]: ``start * (end / start) ** progress``.

    Example:
        >>> round(pressure_at(0.5, 100.0, 1.0), 9), pressure_at(0.5, 100.0)
        (10.0, 100.0)
    """
    start = check_pressure(start)
    return decayed_pressure(progress, start, None if end is None else check_pressure(end, "final_pressure"))


def decayed_pressure(progress: float, start: float, end: float | None) -> float:
    """:func:`pressure_at` of pressures checked once, by the rule or policy that holds them.

    Example:
        >>> round(decayed_pressure(1.0, 100.0, 4.0), 9), decayed_pressure(0.3, 100.0, None)
        (4.0, 100.0)
    """
    if end is None or end == start:
        return start
    t = min(max(float(progress), 0.0), 1.0)
    return float(math.exp(math.log(start) + t * (math.log(end) - math.log(start))))


def gumbel_top_k(order: Tensor, log_weights: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Draw ``k`` rank positions without replacement by ``log_weights``; their item positions
    (``order[i]`` holds rank position ``i``), ascending.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> gumbel_top_k(torch.tensor([2, 0, 1]), torch.tensor([0.0, 0.0, 50.0]), 1, g).tolist()  # rank 2
        [1]
    """
    u = torch.rand(order.shape[0], generator=generator, device=order.device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float32).tiny)))
    top = torch.topk(log_weights + gumbel, k, sorted=False).indices
    return torch.sort(order.index_select(0, top)).values


def loss_rank_draw(losses: Tensor, k: int, pressure: float, generator: torch.Generator) -> Tensor:
    """Positions of ``k`` of ``losses`` drawn by loss rank (NaN counts as the largest; ties at random).

    Example:
        >>> import torch
        >>> loss_rank_draw(torch.tensor([3.0, 1.0]), 2, 10.0, torch.Generator()).tolist()
        [0, 1]
    """
    n = losses.shape[0]
    if k >= n:
        return torch.arange(n, device=losses.device)
    shuffle = torch.randperm(n, generator=generator, device=losses.device)  # ties broken at random
    hard = torch.nan_to_num(losses.detach().float(), nan=float("inf")).index_select(0, shuffle)
    order = shuffle.index_select(0, torch.argsort(hard, stable=True))
    hardness = torch.arange(n - 1, -1, -1, device=losses.device, dtype=torch.float32)  # n - 1: the easiest
    return gumbel_top_k(order, hardness * (-math.log(pressure) / n), k, generator)
