"""Plan math: thresholds, weights, annealing, and the unbiasedness of the rescaling."""

import math

import pytest
import torch

from leanbatch.policies import InfoBatchPolicy, RandomPolicy, pruning_epochs


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_threshold_is_mean_of_scored_and_unscored_are_kept():
    scores = torch.tensor([1.0, 2.0, float("nan"), 3.0, 10.0, float("nan")])
    plan = InfoBatchPolicy(0.99, num_epochs=10, delta=0.5)(scores, 0, gen())
    assert plan.threshold == pytest.approx(4.0)
    kept = set(plan.kept.tolist())
    assert {2, 4, 5} <= kept  # never scored (NaN) and above the mean: always kept
    assert plan.weights[[2, 4, 5]].tolist() == [1.0, 1.0, 1.0]


def test_samples_at_the_mean_are_not_pruned():
    scores = torch.tensor([2.0, 2.0, 2.0, 2.0])
    plan = InfoBatchPolicy(0.9, num_epochs=4, delta=1.0)(scores, 0, gen())
    assert plan.num_kept == 4 and plan.weights.tolist() == [1.0] * 4


def test_weights_are_exact_inverse_of_inclusion_probability():
    scores = torch.arange(1000, dtype=torch.float32)
    ratios = torch.rand(60, generator=gen(9)).mul(0.99).tolist()  # (w - 1) + 1 in float32 misses some
    for r in (0.1, 0.5, 0.7, 0.3333, *ratios):
        plan = InfoBatchPolicy(r, num_epochs=4, delta=1.0)(scores, 0, gen())
        m = round(r * 2**32)
        expected = 2**32 / (2**32 - m)
        below = scores < plan.threshold
        assert torch.all(plan.weights[below] == torch.tensor(expected, dtype=torch.float32))
        assert torch.all(plan.weights[~below] == 1.0)


@pytest.mark.parametrize(
    "num_epochs,delta,expected", [(10, 0.875, 8), (8, 0.875, 7), (3, 1.0, 3), (5, 0.1, 0)]
)
def test_pruning_epochs_and_annealing(num_epochs, delta, expected):
    assert pruning_epochs(num_epochs, delta) == expected
    scores = torch.rand(200, generator=gen(1))
    pol = InfoBatchPolicy(0.5, num_epochs, delta)
    for e in range(num_epochs):
        plan = pol(scores, e, gen(e))
        if e < expected:
            assert plan.pruning and plan.num_kept < 200
        else:  # annealing: every sample, weight exactly 1 (the official code keeps weight 2 here)
            assert not plan.pruning and plan.kept is None and plan.weights is None


def test_pruned_fraction_is_prune_ratio_of_below_mean():
    scores = torch.rand(100_000, generator=gen(3))
    plan = InfoBatchPolicy(0.5, 4, 1.0)(scores, 0, gen(4))
    below = int((scores < plan.threshold).sum())
    assert plan.num_pruned == pytest.approx(0.5 * below, rel=0.02)
    assert torch.equal(plan.kept, torch.sort(plan.kept).values)


def test_random_policy_matches_infobatch_work_but_uniform():
    scores = torch.cat([torch.full((9000,), 0.01), torch.full((1000,), 5.0)])
    ib = InfoBatchPolicy(0.5, 4, 1.0)(scores, 0, gen(0))
    rnd = RandomPolicy(0.5, 4, 1.0)(scores, 0, gen(0))
    assert rnd.num_pruned == pytest.approx(ib.num_pruned, rel=0.05)
    # InfoBatch never prunes high-loss samples; random pruning does, in proportion.
    assert torch.all(ib.kept >= 0) and int((ib.kept >= 9000).sum()) == 1000
    high_kept = int((rnd.kept >= 9000).sum())
    assert 400 < high_kept < 700


def test_same_generator_same_plan_and_global_rng_untouched():
    scores = torch.rand(5000, generator=gen(5))
    state = torch.get_rng_state()
    a = InfoBatchPolicy(0.5, 4, 1.0)(scores, 0, gen(9))
    b = InfoBatchPolicy(0.5, 4, 1.0)(scores, 0, gen(9))
    c = InfoBatchPolicy(0.5, 4, 1.0)(scores, 0, gen(10))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.kept, b.kept) and not torch.equal(a.kept, c.kept)


@pytest.mark.parametrize("policy_cls", [InfoBatchPolicy, RandomPolicy])
def test_expected_weighted_gradient_equals_full_gradient(policy_cls):
    """Monte Carlo over the plan's randomness: E[sum_kept w_i g_i] = sum_i g_i."""
    torch.manual_seed(0)
    n, d, trials = 400, 3, 4000
    grads = torch.randn(n, d, dtype=torch.float64)  # per-sample gradients
    scores = torch.rand(n) ** 3  # skewed losses: most samples below the mean
    full = grads.sum(0)
    pol = policy_cls(0.7, num_epochs=2, delta=1.0)
    sums = torch.empty(trials, d, dtype=torch.float64)
    for t in range(trials):
        plan = pol(scores, 0, gen(t))
        k = plan.kept.long()
        sums[t] = (grads[k] * plan.weights[k, None].double()).sum(0)
    mean, sem = sums.mean(0), sums.std(0) / math.sqrt(trials)
    assert torch.all((mean - full).abs() < 4 * sem), (mean, full, sem)
    # and the estimator is not trivially the full sum: it has real variance
    assert torch.all(sem > 1e-3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(prune_ratio=1.0), "prune_ratio"),
        (dict(prune_ratio=-0.1), "prune_ratio"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.5), "delta"),
        (dict(num_epochs=0), "num_epochs"),
        (dict(num_epochs=2.5), "num_epochs"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    args = dict(prune_ratio=0.5, num_epochs=4, delta=0.875) | kwargs
    with pytest.raises(ValueError, match=match):
        InfoBatchPolicy(**args)


@pytest.mark.parametrize("policy", [InfoBatchPolicy, RandomPolicy])
def test_chunked_planning_matches_the_plan_definition(monkeypatch, policy):
    import leanbatch.policies as policies

    monkeypatch.setattr(policies, "_CHUNK", 1000)  # many chunks, a ragged last one
    n = 10_537
    scores = torch.rand(n, generator=gen(5))
    scores[::11] = float("nan")
    plan = policy(0.5, 4, 1.0)(scores, 0, gen(6))
    kept = plan.kept.long()
    assert plan.kept.dtype == torch.int32
    assert torch.all(kept[1:] > kept[:-1]) and kept[0] >= 0 and kept[-1] < n  # sorted, unique, in range
    dropped = torch.ones(n, dtype=torch.bool)
    dropped[kept] = False
    assert not dropped[torch.isnan(scores)].any()  # never scored: never dropped
    if policy is InfoBatchPolicy:
        assert not dropped[scores >= plan.threshold].any()
        candidates = scores < plan.threshold
    else:
        candidates = ~torch.isnan(scores)
    up = plan.weights > 1.0
    assert torch.equal(up, candidates)  # the weight marks exactly the candidates
    assert torch.all(plan.weights[~candidates] == 1.0)
    q = 1.0 - 1.0 / float(plan.weights[candidates][0])
    rate = dropped[candidates].float().mean().item()
    sd = math.sqrt(q * (1 - q) / int(candidates.sum()))
    assert abs(rate - q) < 5 * sd
    # Same generator state, same plan: chunking is deterministic.
    again = policy(0.5, 4, 1.0)(scores, 0, gen(6))
    assert torch.equal(again.kept, plan.kept) and torch.equal(again.weights, plan.weights)
