"""Reference inclusion probabilities for the rank rule, computed independently of leanbatch.

The rank rule draws ``k`` of ``n`` rank positions without replacement, each draw
proportional to the weights ``((i + 0.5) / n) ** (1 / keep - 1)`` of the positions not
drawn yet. Two oracles give the probability that each position is drawn, from the
formula alone (not from ``rank_weights`` or the sampler):

- :func:`exact_inclusion` enumerates every ordered draw (small ``n`` only);
- :func:`race_inclusion` integrates the exponential-race form of the same draw
  (position ``j`` arrives at ``T_j ~ Exp(w_j)``, the first ``k`` arrivals are drawn), so
  ``P(i) = integral of w_i exp(-w_i t) P(#{j != i: T_j < t} <= k - 1) dt``: any ``n``,
  exact up to quadrature (checked here against the enumeration).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch


def formula_weights(n: int, keep: float) -> list[float]:
    """Composer's rank weights, normalised: ``((i + 0.5) / n) ** (1 / keep - 1)``."""
    w = [((i + 0.5) / n) ** (1.0 / keep - 1.0) for i in range(n)]
    total = sum(w)
    return [x / total for x in w]


def draw_count(n: int, keep: float) -> int:
    return max(1, int(keep * n))


def exact_inclusion(n: int, keep: float) -> list[float]:
    """Inclusion probability of each rank under sequential weighted draws without replacement."""
    return exact_inclusion_for(formula_weights(n, keep), draw_count(n, keep))


def race_inclusion(n: int, keep: float, points: int = 2000) -> torch.Tensor:
    """The same probabilities for any ``n``, from the exponential race (float64 quadrature)."""
    w = torch.tensor(formula_weights(n, keep), dtype=torch.float64)
    k = draw_count(n, keep)
    x = torch.linspace(
        math.log(1e-11 / float(w.max())), math.log(80.0 / float(w.min())), points, dtype=torch.float64
    )
    t = x.exp()
    arrived = 1.0 - torch.exp(-w[:, None] * t[None, :])  # (n, T): P(T_j < t)

    def step(f: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Add one position to the count distribution ``f`` (T, k + 1); the last bin is ``>= k``."""
        g = f * (1.0 - p[:, None])
        g[:, 1:] += f[:, :-1] * p[:, None]
        g[:, k] += f[:, k] * p
        return g

    start = torch.zeros(points, k + 1, dtype=torch.float64)
    start[:, 0] = 1.0
    suffix = [start]  # suffix[m]: count distribution of positions n - m .. n - 1
    for j in range(n - 1, -1, -1):
        suffix.append(step(suffix[-1], arrived[j]))
    incl = torch.empty(n, dtype=torch.float64)
    prefix = start  # count distribution of positions 0 .. i - 1
    for i in range(n):
        suf_cdf = suffix[n - 1 - i][:, :k].cumsum(1)  # positions i + 1 .. n - 1, P(count <= b)
        others_below_k = (prefix[:, :k] * suf_cdf.flip(1)).sum(1)  # P(count of the others <= k - 1)
        density = w[i] * t * torch.exp(-w[i] * t) * others_below_k  # d/dx, x = log t
        incl[i] = torch.trapezoid(density, x)
        prefix = step(prefix, arrived[i])
    return incl


@pytest.mark.parametrize("n,keep", [(8, 0.5), (7, 0.3), (6, 0.25), (5, 0.9)])
def test_race_oracle_matches_enumeration(n: int, keep: float) -> None:
    race = race_inclusion(n, keep)
    exact = torch.tensor(exact_inclusion(n, keep), dtype=torch.float64)
    assert torch.allclose(race, exact, atol=1e-7), (race, exact)
    assert abs(float(race.sum()) - draw_count(n, keep)) < 1e-6  # k positions drawn in all


def exact_inclusion_for(weights: list[float], k: int) -> list[float]:
    """Inclusion probability of each position under ``k`` sequential weighted draws without replacement."""
    total = sum(weights)
    w = [x / total for x in weights]
    incl = [0.0] * len(w)
    for seq in itertools.permutations(range(len(w)), k):
        p, left = 1.0, 1.0
        for s in seq:
            p *= w[s] / left
            left -= w[s]
        for s in seq:
            incl[s] += p
    return incl


def loss_rank_formula_weights(n: int, pressure: float) -> list[float]:
    """Loshchilov & Hutter's weights by ascending loss position: the hardest (last) weighs 1,
    each easier rank ``pressure ** (1 / n)`` times less."""
    return [pressure ** (-(n - 1 - i) / n) for i in range(n)]
