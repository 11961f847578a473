"""InfoBatch's target-fraction semantics and its short-schedule options (each off by default)."""

import math

import pytest
import torch

from leanbatch import InfoBatchPolicy, RandomPolicy


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("policy_cls", [InfoBatchPolicy, RandomPolicy])
def test_target_all_prunes_the_share_of_all_samples(policy_cls):
    """Uniform scores: half are below the mean. "Prune 30% of all" drops 60% of those (InfoBatch), or
    30% of everyone (random pruning); the paper's semantics would prune 30% of the half, 15%."""
    n = 200_000
    scores = torch.rand(n, generator=gen(1))
    plan = policy_cls(0.3, num_epochs=2, delta=1.0, target="all")(scores, 0, gen(2))
    below = scores < plan.threshold
    q = 0.3 * n / int(below.sum()) if policy_cls is InfoBatchPolicy else 0.3
    candidates = below if policy_cls is InfoBatchPolicy else torch.ones(n, dtype=torch.bool)
    sd = math.sqrt(int(candidates.sum()) * q * (1 - q))
    assert abs(plan.num_pruned - 0.3 * n) < 5 * sd  # the budget, in expectation
    paper = policy_cls(0.3, num_epochs=2, delta=1.0)(scores, 0, gen(2))
    assert paper.num_pruned < 0.2 * n  # the default keeps the paper's meaning
    w = float(plan.weights[candidates][0])
    assert w == pytest.approx(1 / (1 - q), rel=1e-6)  # the exact inverse inclusion probability
    if policy_cls is InfoBatchPolicy:
        assert torch.all(plan.weights[~below] == 1.0)


@pytest.mark.parametrize("policy_cls", [InfoBatchPolicy, RandomPolicy])
def test_target_all_is_capped_when_too_few_are_below_the_mean(policy_cls):
    """With 10% of the samples below the mean, "prune 50% of all" cannot be met: the drop probability
    of the below-mean samples stops at max_drop (random pruning drops as many, from everyone)."""
    scores = torch.cat([torch.full((100,), 0.0), torch.full((900,), 1.0)])  # mean 0.9: 100 below
    for max_drop in (0.9, 0.5):
        plan = policy_cls(0.5, num_epochs=2, delta=1.0, target="all", max_drop=max_drop)(scores, 0, gen(0))
        expected = max_drop * 100  # drops, InfoBatch and random alike
        n, q = (100, max_drop) if policy_cls is InfoBatchPolicy else (1000, expected / 1000)
        assert abs(plan.num_pruned - expected) < 5 * math.sqrt(n * q * (1 - q))
        w = float(plan.weights[0])
        assert w == pytest.approx(1 / (1 - q), rel=1e-6)


def test_warmup_and_refresh_epochs_train_on_everything():
    scores = torch.rand(500, generator=gen(3))
    pol = InfoBatchPolicy(0.5, num_epochs=10, delta=0.8, warmup_epochs=2, refresh_every=3)
    pruning = [pol(scores, e, gen(e)).pruning for e in range(10)]
    # warm-up 0-1, refresh 3 and 6 (0 too), annealing from floor(0.8 * 10) = 8
    assert pruning == [False, False, True, False, True, True, False, True, False, False]
    for e in range(10):
        plan = pol(scores, e, gen(e))
        if not plan.pruning:
            assert plan.kept is None and plan.weights is None  # every sample, weight exactly 1
    default = InfoBatchPolicy(0.5, num_epochs=10, delta=0.8)
    assert [default(scores, e, gen(e)).pruning for e in range(10)] == [True] * 8 + [False] * 2


@pytest.mark.parametrize("policy_cls", [InfoBatchPolicy, RandomPolicy])
def test_max_weight_caps_the_rescaling_and_defaults_to_the_exact_inverse(policy_cls):
    scores = torch.arange(1000, dtype=torch.float32)
    exact = policy_cls(0.5, 2, 1.0)(scores, 0, gen(0))
    capped = policy_cls(0.5, 2, 1.0, max_weight=1.25)(scores, 0, gen(0))
    flat = policy_cls(0.5, 2, 1.0, max_weight=1.0)(scores, 0, gen(0))
    assert torch.equal(exact.kept, capped.kept) and torch.equal(exact.kept, flat.kept)  # same draw
    up = exact.weights > 1
    assert float(exact.weights.max()) > 1.25
    assert torch.all(capped.weights[up] == 1.25) and torch.all(capped.weights[~up] == 1.0)
    assert torch.all(flat.weights == 1.0)
    same = policy_cls(0.5, 2, 1.0, max_weight=100.0)(scores, 0, gen(0))  # not binding: unchanged
    assert torch.equal(same.weights, exact.weights)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(target="most"), "target"),
        (dict(warmup_epochs=-1), "warmup_epochs"),
        (dict(warmup_epochs=1.5), "warmup_epochs"),
        (dict(refresh_every=True), "refresh_every"),
        (dict(max_weight=0.5), "max_weight"),
        (dict(max_weight="2"), "max_weight"),
        (dict(max_drop=1.0), "max_drop"),
        (dict(max_drop=0.0), "max_drop"),
    ],
)
def test_bad_options_name_the_argument(kwargs, name):
    for cls in (InfoBatchPolicy, RandomPolicy):
        with pytest.raises(ValueError, match=name):
            cls(0.5, 4, 0.875, **kwargs)


def test_warmup_of_one_epoch_changes_nothing_in_a_run_because_epoch_zero_has_no_scores():
    """The documented caveat: a run's first epoch trains on everything anyway (no sample is scored
    yet), so ``warmup_epochs=1`` trains exactly like 0, and ``2`` is the first value that delays
    pruning."""
    from leanbatch import InfoBatch

    def run(warmup: int) -> list[list[int]]:
        data = torch.utils.data.TensorDataset(torch.arange(300).float())
        pol = InfoBatchPolicy(0.5, num_epochs=4, delta=0.875, warmup_epochs=warmup)
        ib = InfoBatch(data, 4, seed=5, policy=pol)
        orders = []
        for epoch in range(4):
            order = list(ib.sampler)
            orders.append(order)
            idx = torch.tensor(order)
            ib.update(torch.sin(idx.float() * (epoch + 1)).abs() + 0.01, idx)
        return orders

    default, one, two = run(0), run(1), run(2)
    assert one == default
    assert len(default[0]) == 300 and len(default[1]) < 300  # epoch 1 is the first pruned one
    assert len(two[1]) == 300 and len(two[2]) < 300  # warm-up 2 delays it by an epoch
