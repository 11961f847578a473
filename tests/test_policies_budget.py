"""Fixed-budget policies (RS2, epsilon-greedy, UCB) and SeTa: budgets, inclusion probabilities
measured over many plans, cycling, the window schedule, and the score table's EMA variance."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies import SCORE_KINDS, scores_of

from leanbatch import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    LossRankPolicy,
    RandomPolicy,
    RS2Policy,
    ScoreTable,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.policies.budget import budget_size
from leanbatch.policies.seta import kmeans_boundaries


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_frequencies(freq: torch.Tensor, p: torch.Tensor, trials: int) -> None:
    """Measured inclusion frequencies against promised probabilities ``p`` (0 < p < 1), pooled and per
    sample, with the power to see a 5% error in the probability (the style of test_policies.py)."""
    var = p * (1 - p) / trials
    pooled_sd = math.sqrt(float(var.sum())) / len(p)
    assert abs(float(freq.mean() - p.mean())) < 5 * pooled_sd
    assert 0.05 * float(p.mean()) > 20 * pooled_sd  # a 5% error would be > 20 sd away
    z = (freq - p) / var.sqrt()
    assert float(z.abs().max()) < 5.5 and abs(float(z.mean())) < 0.15 and 0.8 < float(z.std()) < 1.2


# ---------------------------------------------------------------------------- RS2
@pytest.mark.parametrize("epoch", [1, 3])  # 3 spans the end of the first pass and the start of the next
def test_rs2_subsets_are_uniform_with_the_exact_budget(epoch):
    n, trials = 2000, 400
    counts = torch.zeros(n)
    for t in range(trials):
        plan = RS2Policy(0.7, num_epochs=10, seed=t)(torch.rand(n), epoch, gen(t))
        assert plan.num_kept == 600 and plan.weights is None
        counts[plan.kept.long()] += 1
    check_frequencies(counts / trials, torch.full((n,), 0.3, dtype=torch.float64), trials)


def test_rs2_cycles_through_the_data_before_repeating():
    n, k, epochs = 1000, 300, 10  # 3,000 positions: exactly three passes
    pol = RS2Policy(0.7, num_epochs=epochs, seed=4)
    plans = [pol(torch.zeros(n), e, gen(e)) for e in range(epochs)]
    kept = [set(p.kept.tolist()) for p in plans]
    assert all(len(s) == k for s in kept)  # distinct samples, the exact budget
    assert not (kept[0] & kept[1]) and not (kept[1] & kept[2]) and not (kept[0] & kept[2])  # one pass
    counts = torch.zeros(n)
    for p in plans:
        counts[p.kept.long()] += 1
    # Every sample is served once per pass (3 times), but for the few a pass-spanning epoch drew
    # from both passes (about m (k - m) / N = 20 per spanning epoch here) and those drawn to replace
    # them; independent uniform subsets would leave 73% of the counts off 3 (Binomial(10, 0.3)).
    assert int((counts != 3).sum()) < 0.15 * n and counts.min() >= 1 and counts.max() <= 5
    again = RS2Policy(0.7, num_epochs=epochs, seed=4)(torch.zeros(n), 7, gen(7))
    assert torch.equal(again.kept, plans[7].kept)  # a pure function of (seed, epoch)
    other = RS2Policy(0.7, num_epochs=epochs, seed=5)(torch.zeros(n), 7, gen(7))
    assert not torch.equal(other.kept, plans[7].kept)


# ---------------------------------------------------------------------------- epsilon-greedy and UCB
def test_epsilon_greedy_keeps_the_top_scores_and_explores_uniformly():
    n, trials = 4000, 400
    scores = torch.randperm(n, generator=gen(1)).float()  # distinct scores
    scores[:5] = float("nan")  # never scored: rank first
    pol = EpsilonGreedyPolicy(0.6, num_epochs=2, epsilon=0.25)
    k = budget_size(n, 0.6)
    explore = round(0.25 * k)
    greedy = set(torch.topk(torch.nan_to_num(scores, nan=math.inf), k - explore).indices.tolist())
    assert set(range(5)) <= greedy
    counts = torch.zeros(n)
    for t in range(trials):
        plan = pol(scores, 0, gen(100 + t))
        assert plan.num_kept == k and plan.weights is None
        counts[plan.kept.long()] += 1
    is_greedy = torch.zeros(n, dtype=torch.bool)
    is_greedy[list(greedy)] = True
    assert torch.all(counts[is_greedy] == trials)  # exploitation: always kept
    p = torch.full((n - len(greedy),), explore / (n - len(greedy)), dtype=torch.float64)
    check_frequencies(counts[~is_greedy].double() / trials, p, trials)
    assert pol(torch.full((n,), float("nan")), 1, gen(0)).kept is None  # nothing scored: everything


def test_ucb_ranks_by_the_ema_mean_plus_c_standard_deviations():
    n, m, c = 50, 0.8, 1.5
    pol = UCBPolicy(0.5, num_epochs=2, epsilon=0.0, c=c, ema=m)
    table = ScoreTable(n, **pol.score_table_options())
    pol.bind(table)
    g = gen(3)
    mean = torch.zeros(n, dtype=torch.float64)
    var = torch.zeros(n, dtype=torch.float64)
    for step in range(6):  # the reference: Finch's recursion in float64
        x = torch.rand(n, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, n, dtype=torch.float64)
        table.update(torch.arange(n), x.float())
        if step == 0:
            mean = x.clone()
        else:
            d = x - mean
            mean, var = mean + (1 - m) * d, m * (var + (1 - m) * d * d)
    assert torch.allclose(table.values.double(), mean, atol=1e-5)
    assert torch.allclose(table.variances.double(), var, atol=1e-5)
    ucb = mean + c * var.sqrt()
    plan = pol(table.values, 0, gen(0))
    assert set(plan.kept.tolist()) == set(torch.topk(ucb, 25).indices.tolist())
    greedy = EpsilonGreedyPolicy(0.5, num_epochs=2, epsilon=0.0, ema=m)(table.values, 0, gen(0))
    assert set(greedy.kept.tolist()) == set(torch.topk(mean, 25).indices.tolist())
    assert set(greedy.kept.tolist()) != set(plan.kept.tolist())  # the variance term matters here


def test_bandit_policies_refuse_a_table_they_cannot_rank_by():
    with pytest.raises(RuntimeError, match="bind"):
        UCBPolicy(0.5, 2)(torch.rand(10), 0, gen(0))
    with pytest.raises(ValueError, match="variance"):
        UCBPolicy(0.5, 2).bind(ScoreTable(10, ema=0.9))
    with pytest.raises(ValueError, match="ema"):
        EpsilonGreedyPolicy(0.5, 2, ema=0.9).bind(ScoreTable(10))
    with pytest.raises(ValueError, match="variance=True .* ema="):
        ScoreTable(10, variance=True)
    bound = UCBPolicy(0.5, 2)
    bound.bind(ScoreTable(10, **bound.score_table_options()))
    with pytest.raises(ValueError, match="one policy per sampler"):
        bound.bind(ScoreTable(10, **bound.score_table_options()))


def test_ema_variance_skips_nonfinite_losses_and_survives_a_checkpoint():
    t = ScoreTable(3, ema=0.5, variance=True)
    t.update(torch.tensor([0, 1]), torch.tensor([1.0, 2.0]))
    t.update(torch.tensor([0, 1]), torch.tensor([3.0, float("inf")]))
    assert t.values[:2].tolist() == [2.0, 2.0] and t.variances[:2].tolist() == [1.0, 0.0]  # inf: not stored
    u = ScoreTable(3, ema=0.5, variance=True)
    u.load_state_dict(t.state_dict())
    assert torch.equal(u.variances[:2], t.variances[:2]) and torch.isnan(u.variances[2])
    with pytest.raises(ValueError, match="variance"):
        ScoreTable(3, ema=0.5).load_state_dict(t.state_dict())


# ---------------------------------------------------------------------------- SeTa
def test_seta_window_slides_over_the_loss_groups():
    g = gen(5)
    scores = torch.cat(
        [
            torch.rand(100, generator=g) * 0.1,
            1 + torch.rand(150, generator=g) * 0.1,
            10 + torch.rand(50, generator=g),
        ]
    )
    scores[7] = float("nan")  # never scored: always in the window
    pol = SeTaPolicy(prune_ratio=0.0, num_epochs=10, num_groups=3, window_scale=0.67, delta=0.8)
    assert [pol.window(e) for e in range(4)] == [(0, 3), (1, 2), (0, 2), (1, 2)]
    groups = [set(range(0, 100)) - {7}, set(range(100, 250)), set(range(250, 300))]
    assert pol(scores, 0, gen(0)).kept is None  # the first epoch keeps every group (and prunes nothing)
    assert set(pol(scores, 1, gen(1)).kept.tolist()) == groups[1] | groups[2] | {7}  # the hard end
    assert set(pol(scores, 2, gen(2)).kept.tolist()) == groups[0] | groups[1] | {7}  # the easy end
    assert pol(scores, 8, gen(8)).kept is None  # annealing, nothing randomly pruned
    assert SeTaPolicy().window(1) == (1, 4)  # the authors' CIFAR setting: round(5 * 0.9) = 4 groups


def test_seta_random_pruning_is_uniform_and_windows_stay_inside_it():
    n, trials = 2000, 400
    scores = torch.rand(n, generator=gen(6))
    pol = SeTaPolicy(prune_ratio=0.3, num_epochs=8, num_groups=5, window_scale=0.9)  # anneals from 7
    counts = torch.zeros(n)
    for t in range(trials):
        plan = pol(scores, 7, gen(t))  # partial annealing: the random subset alone
        assert plan.num_kept == 1400 and plan.weights is None
        counts[plan.kept.long()] += 1
    check_frequencies(counts / trials, torch.full((n,), 0.7, dtype=torch.float64), trials)
    for e in (1, 2, 3):
        full = pol(scores, 7, gen(e))  # the same generator draws the same random subset
        plan = pol(scores, e, gen(e))
        assert set(plan.kept.tolist()) <= set(full.kept.tolist())
        bounds = kmeans_boundaries(scores[full.kept.long()], 5)  # the groups of the subset's losses
        start, size = pol.window(e)
        group = torch.bucketize(scores[plan.kept.long()], bounds)
        assert bool(((group >= start) & (group < start + size)).all())
        assert 0.3 * 2000 < plan.num_kept < 1400


def test_one_dimensional_kmeans_is_a_lloyd_fixed_point():
    g = gen(7)
    x = torch.cat(
        [torch.rand(500, generator=g), 5 + torch.rand(300, generator=g), 20 + torch.rand(40, generator=g)]
    )
    b = kmeans_boundaries(x, 3)
    assert b is not None and b.shape == (2,)
    labels = torch.bucketize(x, b)
    assert labels.bincount().tolist() == [500, 300, 40]
    centres = torch.stack([x[labels == j].mean() for j in range(3)])
    assert torch.allclose(b, (centres[:-1] + centres[1:]) / 2, atol=1e-4)  # boundaries at the midpoints
    assert kmeans_boundaries(torch.full((10,), 2.0), 3) is None
    sampled = kmeans_boundaries(x, 3, gen(0), max_fit=200)  # fitted on a sample: the same clusters
    assert torch.bucketize(x, sampled).bincount().tolist() == [500, 300, 40]


# ---------------------------------------------------------------------------- invariants
ALL_POLICIES = {
    "infobatch": lambda r: InfoBatchPolicy(r, 4, 1.0),
    "infobatch-all": lambda r: InfoBatchPolicy(r, 4, 1.0, target="all"),
    "random": lambda r: RandomPolicy(r, 4, 1.0, max_weight=3.0),
    "rs2": lambda r: RS2Policy(r, 4),
    "epsilon-greedy": lambda r: EpsilonGreedyPolicy(r, 4, epsilon=0.3),
    "seta": lambda r: SeTaPolicy(r, 4, num_groups=3, window_scale=0.5, delta=0.75),
    "loss-rank": lambda r: LossRankPolicy(1.0 - r, 4, pressure=100.0, final_pressure=2.0),
}


@given(
    n=st.integers(1, 200),
    ratio=st.floats(0.0, 0.999),
    kind=st.sampled_from(SCORE_KINDS),
    epoch=st.integers(0, 4),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=150, deadline=None)
def test_every_policy_plans_a_nonempty_epoch_with_sane_weights(n, ratio, kind, epoch, seed):
    scores = scores_of(kind, n, gen(seed))
    for name, make in ALL_POLICIES.items():
        plan = make(ratio)(scores, epoch, gen(seed + 1))
        assert plan.num_kept >= 1, name
        if plan.kept is not None:
            kept = plan.kept.long()
            assert torch.all(kept[1:] > kept[:-1]) and 0 <= int(kept[0]) and int(kept[-1]) < n, name
        if plan.weights is not None:
            assert torch.all(plan.weights >= 1.0) and torch.all(torch.isfinite(plan.weights)), name
        if name in ("rs2", "epsilon-greedy") and plan.pruning:
            assert plan.num_kept == budget_size(n, ratio), name  # the budget, exactly
        if name == "loss-rank" and plan.pruning:
            assert plan.num_kept == max(1, int((1.0 - ratio) * n)) and plan.weights is None, name
        if name == "seta" and plan.pruning:
            assert plan.num_kept <= budget_size(n, ratio), name


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: RS2Policy(1.0, 4), "prune_ratio"),
        (lambda: RS2Policy(0.5, 4, seed=1.5), "seed"),
        (lambda: EpsilonGreedyPolicy(0.5, 4, epsilon=1.5), "epsilon"),
        (lambda: EpsilonGreedyPolicy(0.5, 4, ema=1.0), "ema"),
        (lambda: UCBPolicy(0.5, 4, c=-1.0), "c"),
        (lambda: UCBPolicy(0.5, 4, ema=None), "ema"),
        (lambda: SeTaPolicy(num_groups=0), "num_groups"),
        (lambda: SeTaPolicy(window_scale=0.0), "window_scale"),
        (lambda: SeTaPolicy(num_groups=5, window_scale=0.05), "window_scale"),
        (lambda: SeTaPolicy(delta=0.0), "delta"),
        (lambda: LossRankPolicy(keep=0.0), "keep"),
        (lambda: LossRankPolicy(pressure=float("inf")), "pressure"),
        (lambda: LossRankPolicy(final_pressure=0.5), "final_pressure"),
    ],
)
def test_bad_hyperparameters_name_the_argument(make, name):
    with pytest.raises((ValueError, TypeError), match=name):
        make()
