"""``LossRankPolicy``: each epoch drawn from the whole dataset by loss rank (Loshchilov & Hutter).

Exact inclusion probabilities against enumeration of the sequential weighted draw, the uniform
twin at pressure 1, unscored samples first, and a real run that serves full batches."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from leanbatch import InfoBatch, LossRankPolicy


def draw_probabilities(n: int, k: int, pressure: float) -> list[float]:
    """P(hardness rank r is among the k drawn) by enumerating every ordered sequential draw."""
    w = [pressure ** (-r / n) for r in range(n)]
    p = [0.0] * n
    for seq in itertools.permutations(range(n), k):
        prob, left = 1.0, sum(w)
        for r in seq:
            prob *= w[r] / left
            left -= w[r]
        for r in seq:
            p[r] += prob
    return p


def test_inclusion_matches_the_sequential_weighted_draw():
    n, k, s, trials = 6, 2, 30.0, 20_000
    scores = torch.tensor([5.0, 0.1, 3.0, 0.5, 9.0, 1.0])  # hardness ranks: 9.0 -> 0, 5.0 -> 1, ...
    by_rank = torch.argsort(scores, descending=True)
    pol = LossRankPolicy(keep=k / n, num_epochs=2, pressure=s)
    hits = torch.zeros(n)
    g = torch.Generator().manual_seed(0)
    for _ in range(trials):
        hits[pol(scores, 1, g).kept.long()] += 1
    expected = torch.tensor(draw_probabilities(n, k, s))
    observed = hits[by_rank] / trials
    se = (expected * (1 - expected) / trials).sqrt()
    assert torch.all((observed - expected).abs() < 5 * se), (observed, expected)
    assert observed[0] > 3 * observed[-1]  # pressure: the hardest far more often than the easiest


def test_pressure_one_is_the_uniform_twin_and_the_first_epoch_a_uniform_subset():
    n, trials = 10, 8000
    g = torch.Generator().manual_seed(1)
    for scores in (torch.arange(n, dtype=torch.float32), torch.full((n,), float("nan"))):
        pol = LossRankPolicy(keep=0.3, num_epochs=2, pressure=1.0 if not scores.isnan().any() else 100.0)
        hits = torch.zeros(n)
        for _ in range(trials):
            hits[pol(scores, 0, g).kept.long()] += 1
        p = 3 / n
        assert torch.all((hits / trials - p).abs() < 5 * math.sqrt(p * (1 - p) / trials))


def test_samples_never_scored_come_first_and_annealing_serves_everything():
    scores = torch.tensor([0.1, float("nan"), 0.2, float("nan"), 0.3, 0.4])
    pol = LossRankPolicy(keep=0.34, num_epochs=4, pressure=1e9, delta=0.75)
    assert pol(scores, 1, torch.Generator().manual_seed(0)).kept.tolist() == [1, 3]
    assert pol(scores, 3, torch.Generator()).kept is None  # epoch 3 >= floor(0.75 * 4)
    assert pol.pressure_in(0) == 1e9 and math.isclose(LossRankPolicy(1.0, 4, 100.0, 1.0).pressure_in(2), 10.0)


def test_a_run_serves_full_batches_of_fewer_samples_and_learns():
    torch.manual_seed(0)
    n, d = 512, 8
    x = torch.randn(n, d)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).long()
    ds = InfoBatch(list(range(n)), 4, policy=LossRankPolicy(keep=0.5, num_epochs=4), seed=0)
    model = torch.nn.Linear(d, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sizes = []
    for _ in range(4):
        for idx in DataLoader(ds, batch_size=64, sampler=ds.sampler):
            loss = ds.update(F.cross_entropy(model(x[idx]), y[idx], reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sizes.append(len(idx))
    assert [s["kept"] for s in ds.epoch_stats] == [256] * 4
    assert sizes.count(64) == len(sizes)  # full batches: the run is shorter, the batch is not smaller
    acc = (model(x).argmax(1) == y).float().mean()
    assert acc > 0.9 and ds.progress == 1.0
