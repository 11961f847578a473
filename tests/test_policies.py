"""Plan math: thresholds, weights, annealing, and the unbiasedness of the rescaling."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leanbatch import InfoBatchPolicy, RandomPolicy
from leanbatch.policies import pruning_epochs


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _all(cls):
    """The target-fraction variant at half the ratio: "prune r/2 of all samples" keeps the drop
    probability of the below-mean ones near r, uncapped, in the tests below."""
    return lambda ratio, **kw: cls(ratio / 2, target="all", **kw)


# The paper's semantics and the target-fraction variant ("prune a share of all samples, drawn from
# the below-mean ones"), each with its random-pruning twin at the same expected work.
RESCALED = pytest.mark.parametrize(
    "policy_cls",
    [InfoBatchPolicy, RandomPolicy, _all(InfoBatchPolicy), _all(RandomPolicy)],
    ids=["infobatch", "random", "infobatch-all", "random-all"],
)


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
    assert int((ib.kept >= 9000).sum()) == 1000
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


def _estimates(policy, scores: torch.Tensor, g: torch.Tensor, trials: int, weight_error: float = 1.0):
    """The weighted sum over each plan's kept samples, sum_kept w_i g_i, over ``trials`` seeds."""
    out = torch.empty(trials, dtype=torch.float64)
    for t in range(trials):
        plan = policy(scores, 0, gen(t))
        k = plan.kept.long()
        w = plan.weights[k].double()
        w = torch.where(w > 1, w * weight_error, w)  # a plausible bug: a rescaling off by a few %
        out[t] = (g[k] * w).sum()
    return out


@RESCALED
def test_the_weighted_sum_is_unbiased_and_a_5_percent_weight_error_is_caught(policy_cls):
    """E[sum_kept w_i g_i] = sum_i g_i, with per-sample "gradients" g_i > 0 (not zero-mean, so a
    wrong weight or a wrong drop probability moves the mean by a share of the total)."""
    n = 100_000
    scores = torch.empty(n).exponential_(generator=gen(1))
    g = (1.0 + scores).double()  # correlated with the loss, as gradients are
    total = float(g.sum())
    pol = policy_cls(0.6, num_epochs=2, delta=1.0)
    est = _estimates(pol, scores, g, trials=12)
    sem = float(est.std() / math.sqrt(len(est)))
    assert abs(float(est.mean()) - total) < 5 * sem
    for err in (0.95, 1.05):  # the same statistic, with the weights 5% off: far outside
        bad = _estimates(pol, scores, g, trials=12, weight_error=err)
        assert abs(float(bad.mean()) - total) > 25 * sem


@RESCALED
def test_inclusion_frequencies_match_the_promised_probabilities(policy_cls):
    """Measured over many planned epochs, not recomputed from the code's formula: each sample's
    inclusion frequency is 1 / its weight (1 for samples that are never dropped)."""
    n, epochs = 2000, 400
    scores = torch.rand(n, generator=gen(2)) ** 2
    scores[::97] = float("nan")  # never scored: always kept
    pol = policy_cls(0.5, num_epochs=2, delta=1.0)
    counts = torch.zeros(n)
    promised = None
    for t in range(epochs):
        plan = pol(scores, 0, gen(100 + t))
        counts[plan.kept.long()] += 1
        promised = 1.0 / plan.weights.double() if promised is None else promised
        assert torch.equal(1.0 / plan.weights.double(), promised)  # same scores: same probabilities
    freq = counts.double() / epochs
    sure = promised == 1.0
    assert torch.all(freq[sure] == 1.0)
    assert torch.all(freq[torch.isnan(scores)] == 1.0)
    p = promised[~sure]
    pooled_sd = math.sqrt(float((p * (1 - p)).sum()) / epochs) / len(p)  # sd of the pooled mean frequency
    pooled = float(freq[~sure].mean() - p.mean())
    assert abs(pooled) < 5 * pooled_sd
    assert 0.05 * float(p.mean()) > 20 * pooled_sd  # a 5% error in the inclusion probability: > 20 sd
    z = (freq[~sure] - p) / torch.sqrt(p * (1 - p) / epochs)  # per sample: no sample is treated differently
    assert float(z.abs().max()) < 5.5 and abs(float(z.mean())) < 0.1 and 0.8 < float(z.std()) < 1.2


def test_random_pruning_never_plans_an_empty_epoch_and_stays_unbiased():
    """99 scores of 0.01 and one of 100 at prune_ratio 0.99: every sample is a candidate with drop
    probability 0.98, so about 13% of unconditioned draws would keep nothing."""
    scores = torch.tensor([0.01] * 99 + [100.0])
    pol = RandomPolicy(0.99, num_epochs=2, delta=1.0)
    sizes = [pol(scores, 0, gen(t)).num_kept for t in range(1000)]
    assert min(sizes) >= 1
    # Small cases, where conditioning on a non-empty plan changes the weights a lot: the
    # inclusion frequency and the weighted sum match the conditional probability exactly.
    for n, ratio in ((2, 0.99), (3, 0.9), (5, 0.99)):
        small = torch.arange(1.0, n + 1)
        pol = RandomPolicy(ratio, num_epochs=2, delta=1.0)
        trials = 2_500
        counts = torch.zeros(n)
        est = torch.empty(trials, dtype=torch.float64)
        w = None
        for t in range(trials):
            plan = pol(small, 0, gen(t))
            k = plan.kept.long()
            assert k.numel() >= 1
            counts[k] += 1
            w = float(plan.weights[0])
            est[t] = (small.double()[k] * plan.weights[k].double()).sum()
        below = int((small < small.mean()).sum())
        q = round(ratio * below / n * 2**32) / 2**32
        p = (1 - q) / (1 - q**n)  # inclusion probability given at least one kept
        assert w == pytest.approx(1 / p, rel=1e-6)
        sd = math.sqrt(p * (1 - p) / trials)
        assert torch.all((counts / trials - p).abs() < 5 * sd)
        sem = float(est.std()) / math.sqrt(trials)
        assert abs(float(est.mean()) - float(small.sum())) < 5 * sem


def scores_of(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    """Score tables that stress planning: spread, one outlier, all equal, half unscored, tiny, none."""
    if kind == "spike":
        return torch.cat([torch.full((n - 1,), 0.01), torch.tensor([100.0])])[:n]
    if kind == "constant":
        return torch.full((n,), 3.0)
    if kind == "all_nan":
        return torch.full((n,), float("nan"))
    u = torch.rand(n, generator=g)
    if kind == "some_nan":
        return torch.where(torch.rand(n, generator=g) < 0.5, float("nan"), u)
    return u * 1e-30 if kind == "tiny" else u


SCORE_KINDS = ["uniform", "spike", "constant", "some_nan", "tiny", "all_nan"]


@given(
    n=st.integers(1, 300),
    ratio=st.floats(0.0, 0.999),
    kind=st.sampled_from(SCORE_KINDS),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=200, deadline=None)
def test_no_policy_ever_plans_an_empty_epoch(n, ratio, kind, seed):
    scores = scores_of(kind, n, gen(seed))
    for policy_cls in (InfoBatchPolicy, RandomPolicy):
        plan = policy_cls(ratio, num_epochs=4, delta=1.0)(scores, 0, gen(seed + 1))
        assert plan.num_kept >= 1
        if plan.weights is not None:
            assert torch.all(plan.weights >= 1.0) and torch.all(torch.isfinite(plan.weights))


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
    import leanbatch.policies.base as base  # the chunk size lives there

    monkeypatch.setattr(base, "_CHUNK", 1000)  # many chunks, a ragged last one
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
