"""The paper's rule (leanbatch.selection.history): the percentile, the ring buffer, ``cdf ** beta``,
and full-batch accumulation with ``iterate``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from leanbatch import SelectiveBackprop
from leanbatch.selection import LossHistory


def brute_percentile(history: list[float], x: float) -> float:
    below = sum(h < x for h in history)
    at = sum(h == x for h in history)
    return (2 * below + at + (1 if at else 0)) / (2 * len(history))


@settings(max_examples=50, deadline=None)
@given(
    history=st.lists(st.integers(0, 6).map(float), min_size=1, max_size=30),
    queries=st.lists(st.integers(-1, 7).map(float), min_size=1, max_size=10),
)
def test_history_percentile_matches_scipy_rank_definition(history: list[float], queries: list[float]) -> None:
    h = LossHistory(size=64, beta=2.0)
    h.push(torch.tensor(history))
    got = h.percentile(torch.tensor(queries)).tolist()
    want = [brute_percentile(history, q) for q in queries]
    assert got == pytest.approx(want, abs=1e-6)
    assert h.probabilities(torch.tensor(queries)).tolist() == pytest.approx([w**2 for w in want], abs=1e-6)


def test_history_ring_buffer_forgets_the_oldest() -> None:
    h = LossHistory(size=4, beta=1.0)
    h.push(torch.tensor([1.0, 2.0, 3.0]))
    h.push(torch.tensor([10.0, 11.0, float("inf")]))  # inf is not remembered
    assert sorted(x for x in h.values.tolist() if x == x) == [3.0, 10.0, 11.0]
    assert h.percentile(torch.tensor([float("nan")])).tolist() == [1.0]


def test_history_rule_selects_with_probability_cdf_pow_beta() -> None:
    beta, copies = 3.0, 3000
    h = LossHistory(size=400_000, beta=beta)
    h.push(torch.rand(400_000, generator=torch.Generator().manual_seed(0)))
    queries = torch.tensor([0.3, 0.6, 0.8, 0.95])
    batch = queries.repeat_interleave(copies)  # one Bernoulli per example: many examples per query
    mask = h.sample(batch, torch.Generator().manual_seed(1), at_least_one=False)
    freq = mask.view(4, copies).float().mean(1)
    p = h.probabilities(queries)  # the history now holds the batch too, as when it was drawn
    sd = (p * (1 - p) / copies).sqrt()
    assert ((freq - p).abs() / sd).max() < 4.5, (freq, p)
    assert torch.allclose(p, queries**beta, atol=0.03)  # ~uniform history (3% are the queries)
    assert ((freq - queries ** (beta / 2)).abs() / sd).max() > 10  # a wrong exponent would be caught


def test_history_rule_iterate_yields_full_batches_of_about_one_in_beta_plus_one() -> None:
    n_batches, bs = 150, 64
    gen = torch.Generator().manual_seed(123)
    data = [(torch.rand(bs, 1, generator=gen), torch.zeros(bs)) for _ in range(n_batches)]

    def loss_of_value(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return out[:, 0]  # iid uniform losses: the history rule keeps E[U ** 3] = 1 / 4

    sb = SelectiveBackprop(start=0.0, end=1.0, scale_factor=1.0, interrupt=0, rule="history", beta=3.0)
    out = list(sb.iterate(data, nn.Identity(), loss_of_value, epoch=0, num_epochs=1))
    sizes = [len(y) for _, y in out]
    assert all(s == bs for s in sizes[:-1]) and 0 < sizes[-1] <= bs
    frac = sum(sizes) / (n_batches * bs)
    assert abs(frac - 0.25) < 0.02, frac
    assert sb.stats.backpropagated == sum(sizes) and sb.stats.skipped == n_batches * bs - sum(sizes)
