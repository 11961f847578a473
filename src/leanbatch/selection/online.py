"""Online batch selection by loss rank (Loshchilov & Hutter, 2015), batch-level and forward-free.

Every example of a loaded batch is ranked by the *last known* loss of its dataset
index (a :class:`~leanbatch.scores.ScoreTable`: losses of earlier training steps, no
extra forward pass). The example of rank ``r`` (``r = 0``: the largest loss) is drawn
with weight ``s ** (-r / N)``, so the probability falls exponentially with the rank and
the hardest example is about ``s`` times more likely than the easiest: ``s`` is the
*selection pressure* (``s = 1`` is uniform). ``k = max(1, int(keep * N))`` examples are
drawn without replacement (a Gumbel top-k on the device: no host sync).

Examples never scored count as the hardest (their loss is unknown, as in Stale-SB);
ties - all unscored examples in the first epoch, for one - are broken uniformly at
random. The paper lets the pressure decay exponentially during training, from
``s_e0`` to ``s_end``; :func:`pressure_at` gives that schedule.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from leanbatch.scores import check_per_sample_loss
from leanbatch.selection._checks import rankable_losses
from leanbatch.selection.rank import gumbel_top_k, num_selected
from leanbatch.selection.rng import resolve_generator

__all__ = ["check_pressure", "loss_rank_weights", "pressure_at", "select_by_loss_rank"]


def check_pressure(value: object, name: str = "selection_pressure") -> float:
    """``value`` as a float >= 1; ``ValueError`` naming ``name`` otherwise.

    Example:
        >>> check_pressure(100)
        100.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (1.0 <= value < math.inf):
        raise ValueError(
            f"{name} must be a finite float >= 1 (the hardest example's odds over the easiest; 1 = "
            f"uniform, 100 is Loshchilov & Hutter's s_e0), got {value!r}"
        )
    return float(value)


def pressure_at(progress: float, start: float, end: float | None = None) -> float:
    """The selection pressure at ``progress`` in [0, 1]: ``start * (end / start) ** progress``.

    Example:
        >>> round(pressure_at(0.5, 100.0, 1.0), 9), pressure_at(0.5, 100.0)
        (10.0, 100.0)
    """
    if end is None or end == start:
        return start
    t = min(max(float(progress), 0.0), 1.0)
    return float(math.exp(math.log(start) + t * (math.log(end) - math.log(start))))


def _log_weights(n: int, pressure: float, device: torch.device) -> Tensor:
    """Log-weights of rank positions ``0..n-1`` in ascending loss order (``n - 1``: the hardest)."""
    hardness_rank = torch.arange(n - 1, -1, -1, device=device, dtype=torch.float32)
    return hardness_rank * (-math.log(pressure) / n)


def loss_rank_weights(n: int, pressure: float) -> Tensor:
    """First-draw probabilities of rank positions ``0..n-1`` (ascending loss), summing to one.

    Example:
        >>> w = loss_rank_weights(4, 16.0)   # the hardest (position 3) is 16 ** (3/4) = 8 times the easiest
        >>> round(float(w[3] / w[0]), 6)
        8.0
    """
    pressure = check_pressure(pressure)
    num_selected(n, 1.0)  # validates n
    r = torch.arange(n - 1, -1, -1, dtype=torch.float64)
    w = torch.exp(-r * math.log(pressure) / n)
    return w / w.sum()


def select_by_loss_rank(
    losses: Tensor, keep: float, pressure: float, generator: torch.Generator | None = None
) -> Tensor:
    """Positions of the examples online batch selection keeps, ascending, on the losses' device.

    Args:
        losses: the last known loss of each example, shape ``(N,)``; NaN (never scored)
            counts as the largest.
        keep: fraction kept, in (0, 1]: ``k = max(1, int(keep * N))``.
        pressure: selection pressure ``s >= 1``.
        generator: a generator on the losses' device (default: the module's private one).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> select_by_loss_rank(torch.tensor([0.1, 9.0, 0.2, 8.0]), keep=0.5, pressure=1e6, generator=g).tolist()
        [1, 3]
    """
    if isinstance(losses, Tensor):
        losses = rankable_losses(losses, "losses")
    losses = check_per_sample_loss(losses, "losses")
    pressure = check_pressure(pressure)
    n = losses.shape[0]
    k = num_selected(n, keep)
    gen = resolve_generator(generator, losses.device)
    if k == n:
        return torch.arange(n, device=losses.device)
    shuffle = torch.randperm(n, generator=gen, device=losses.device)  # ties broken at random
    hard = torch.nan_to_num(losses.detach().float(), nan=float("inf")).index_select(0, shuffle)
    order = shuffle.index_select(0, torch.argsort(hard, stable=True))
    return gumbel_top_k(order, _log_weights(n, pressure, losses.device), k, gen)
