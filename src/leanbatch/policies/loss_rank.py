"""Online batch selection in the paper's own form: each epoch is drawn from the whole dataset by loss rank.

Loshchilov & Hutter (2015) build *full* batches by sampling from the whole dataset with
probabilities that fall exponentially with each sample's loss rank (the losses last measured: no
extra forward pass). :class:`LossRankPolicy` does it per epoch: it serves ``k = max(1,
int(keep * N))`` samples drawn without replacement, the sample of hardness rank ``r`` (0 = the
largest last loss) with weight ``s ** (-r / N)``. Batches stay full and the run is simply
shorter (fewer steps per epoch): the step-budget axis, with no batch-size confound. Kept samples
weigh 1, as in the paper (the draw is biased on purpose). Samples never scored count as the
hardest, ties are broken at random, so the first epoch is a uniform subset and the samples it
left out come first in the next. ``pressure=1`` is the uniform twin: a uniform random ``keep``
share of the data each epoch.

Example:
    >>> import torch
    >>> pol = LossRankPolicy(keep=0.5, num_epochs=4, pressure=1e6)
    >>> plan = pol(torch.tensor([0.1, 9.0, 0.2, 8.0]), 1, torch.Generator().manual_seed(0))
    >>> plan.kept.tolist(), plan.weights is None
    ([1, 3], True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from leanbatch.checks import check_epochs, check_fraction
from leanbatch.policies.base import plan_from_keep, pruning_epochs
from leanbatch.policies.plan import Plan, full_plan
from leanbatch.ranking import check_pressure, loss_rank_draw, pressure_at

__all__ = ["LossRankPolicy"]


@dataclass
class LossRankPolicy:
    """Each epoch, ``keep`` of the whole dataset drawn by loss rank (see the module docstring).

    Args:
        keep: the share of the dataset each epoch serves, in (0, 1] (1: every sample).
        num_epochs: the run's length (the pressure decays over it).
        pressure: the selection pressure ``s >= 1`` at the start (the paper's ``s_e0 = 100``).
        final_pressure: decay ``s`` exponentially to this at the end (default: constant).
        delta: epochs from ``floor(delta * num_epochs)`` serve every sample (default 1: never).

    Example:
        >>> import torch
        >>> twin = LossRankPolicy(keep=0.5, num_epochs=2, pressure=1.0)   # uniform: the twin
        >>> twin(torch.rand(10), 0, torch.Generator().manual_seed(0)).num_kept
        5
    """

    keep: float = 0.7
    num_epochs: int = 1
    pressure: float = 100.0
    final_pressure: float | None = None
    delta: float = 1.0

    def __post_init__(self) -> None:
        check_fraction(self.keep, "keep")
        check_epochs(self.num_epochs, self.delta)
        check_pressure(self.pressure, "pressure")
        if self.final_pressure is not None:
            check_pressure(self.final_pressure, "final_pressure")

    def pressure_in(self, epoch: int) -> float:
        """The pressure of epoch ``epoch``: decayed over the run's progress at its start."""
        return pressure_at(epoch / self.num_epochs, self.pressure, self.final_pressure)

    def __call__(self, scores: Tensor, epoch: int, generator: torch.Generator) -> Plan:
        n = scores.numel()
        k = max(1, int(self.keep * n))
        if k >= n or epoch >= pruning_epochs(self.num_epochs, self.delta):
            return full_plan(epoch, n)
        chosen = loss_rank_draw(
            scores.detach().to("cpu", torch.float32), k, self.pressure_in(epoch), generator
        )
        keep = torch.zeros(n, dtype=torch.bool)
        keep[chosen] = True
        return plan_from_keep(epoch, keep)
