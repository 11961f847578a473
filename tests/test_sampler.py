"""Sampler invariants (hypothesis), epochs, sharding, and the keyed permutation."""

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leanbatch import InfoBatchPolicy, PrunedSampler, ScoreTable
from leanbatch.permutation import KeyedPermutation


def make(n, scores=None, num_epochs=4, delta=0.75, ratio=0.5, **kw):
    table = ScoreTable(n)
    if scores is not None:  # loaded, as every rank loads the same checkpoint: nothing to merge
        table.load_state_dict({"num_samples": n, "ema": None, "values": scores})
    return PrunedSampler(table, InfoBatchPolicy(ratio, num_epochs, delta), **kw)


@given(n=st.integers(1, 3000), key=st.integers(0, 2**40))
@settings(max_examples=60, deadline=None)
def test_keyed_permutation_is_a_bijection(n, key):
    out = KeyedPermutation(n, key)(torch.arange(n))
    assert torch.equal(torch.sort(out).values, torch.arange(n))


def test_keyed_permutation_looks_shuffled():
    n = 10_000
    out = KeyedPermutation(n, 123)(torch.arange(n)).double()
    pos = torch.arange(n).double()
    corr = torch.corrcoef(torch.stack([out, pos]))[0, 1]
    assert abs(float(corr)) < 0.05
    # first positions land all over the range, not in one block
    assert out[:100].std() > 0.2 * n
    assert not torch.equal(KeyedPermutation(n, 1)(torch.arange(50)), KeyedPermutation(n, 2)(torch.arange(50)))


@given(
    n=st.integers(1, 400),
    world=st.integers(1, 5),
    drop_last=st.booleans(),
    epoch=st.integers(0, 3),
    seed=st.integers(0, 1000),
    data=st.data(),
)
@settings(max_examples=80, deadline=None)
def test_shards_cover_the_plan_with_equal_lengths(n, world, drop_last, epoch, seed, data):
    scores = torch.tensor(data.draw(st.lists(st.floats(0, 10), min_size=n, max_size=n)), dtype=torch.float32)
    samplers = [
        make(n, scores, num_replicas=world, rank=r, drop_last=drop_last, seed=seed) for r in range(world)
    ]
    shards = []
    plans = []
    for s in samplers:
        s.set_epoch(epoch)
        plans.append(s.plan())
        length = len(s)
        shard = list(s)
        assert len(shard) == length  # len() is right before iteration
        s.set_epoch(epoch)  # without it, a finished iteration moves on to the next epoch
        assert list(s) == shard  # a second iter() of the same epoch: same order, no re-plan
        shards.append(shard)
    assert len({len(x) for x in shards}) == 1
    plan = plans[0]
    assert all(torch.equal(p.kept, plan.kept) for p in plans if p.kept is not None)
    kept = set(range(n)) if plan.kept is None else set(plan.kept.tolist())
    served = [i for shard in shards for i in shard]
    assert set(served) <= kept
    if drop_last:
        assert len(served) == len(set(served)) == (len(kept) // world) * world
    else:
        assert set(served) == kept
        assert len(served) - len(kept) == samplers[0].epoch_stats[-1]["padded"] < world


def test_deterministic_across_objects_and_no_global_rng_use():
    scores = torch.rand(500, generator=torch.Generator().manual_seed(0))
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    a, b = make(500, scores, seed=3), make(500, scores, seed=3)
    for e in range(4):
        a.set_epoch(e)
        b.set_epoch(e)
        assert list(a) == list(b)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1]) and random.getstate() == states[2]
    c = make(500, scores, seed=4)
    assert list(c) != list(make(500, scores, seed=3))


def test_epoch_advances_after_a_full_iteration_without_set_epoch():
    s = make(100, torch.rand(100), num_epochs=4, delta=0.5)
    lens = []
    for e in range(4):
        order = list(s)
        lens.append(len(s))  # the iteration's, from its iter() on
        assert len(order) == lens[-1] and s.epoch == e
        s.take(len(order))  # trained
        assert s.epoch == e + 1
    assert [st["epoch"] for st in s.epoch_stats] == [0, 1, 2, 3]
    assert lens[0] < 100 and lens[1] < 100 and lens[2] == lens[3] == 100


def test_an_untrained_iteration_that_ran_out_still_advances_the_next_iter():
    s = make(100, torch.rand(100), num_epochs=4, delta=0.5)
    first = list(s)  # served, never trained (a loader that dropped everything)
    assert s.epoch == 0 and len(s) == len(first)  # len() does not plan ahead of training
    second = list(s)
    assert [st["epoch"] for st in s.epoch_stats] == [0, 1] and s.epoch == 1
    assert len(s) == len(second)


def test_ranks_without_a_process_group_refuse_to_plan_from_unmerged_scores():
    table = ScoreTable(50)
    s = PrunedSampler(table, InfoBatchPolicy(0.5, 4, 1.0), num_replicas=2, rank=1)
    assert len(list(s)) == 25  # nothing scored yet: every rank plans the same full epoch
    table.update(torch.arange(50), torch.rand(50))  # what this rank saw, the other rank did not
    s.set_epoch(1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        len(s)


def test_len_does_not_advance_while_batches_are_in_flight():
    table = ScoreTable(64)
    s = PrunedSampler(table, InfoBatchPolicy(0.5, 3, 1.0))
    it = iter(s)
    first = [next(it) for _ in range(16)]
    assert s.take(16).indices.tolist() == first
    served = first + list(it)  # a prefetching loader exhausted the sampler
    for _ in range(2):
        s.take(16)
    assert len(s) == 64 and s.epoch == 0  # the last batch has not been updated yet: still epoch 0
    assert s.take(16).indices.tolist() == served[48:]
    assert s.epoch == 1 and s.epoch_stats[-1]["epoch"] == 0  # all trained: epoch 1 is next, not planned yet
    table.update(torch.arange(64), torch.arange(64.0))
    assert len(s) == 64  # epoch 0's iteration until epoch 1's begins (constant inside a loop's epoch)
    assert s.plan().num_kept < 64  # planned now, from every score of epoch 0:
    assert s.epoch_stats[-1]["epoch"] == 1 and s.epoch_stats[-1]["threshold"] == 31.5  # mean of 0..63
    assert len(list(s)) == len(s) == s.plan().num_kept


def test_iter_returns_fresh_generators_and_plans_once():
    s = make(50, torch.rand(50))
    calls = []
    inner = s.policy

    def counting(scores, epoch, g):
        calls.append(epoch)
        return inner(scores, epoch, g)

    s.policy = counting
    s.set_epoch(0)
    len(s), len(s)
    it1, it2 = iter(s), iter(s)
    assert it1 is not it2 and iter(it1) is it1
    assert list(it2) == list(it1)
    assert calls == [0]


def test_bad_arguments():
    table = ScoreTable(10)
    pol = InfoBatchPolicy(0.5, 2, 1.0)
    with pytest.raises(ValueError, match="rank"):
        PrunedSampler(table, pol, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas"):
        PrunedSampler(table, pol, num_replicas=0)
    with pytest.raises(ValueError, match="epoch"):
        PrunedSampler(table, pol).set_epoch(-1)
    with pytest.raises(TypeError, match="seed"):
        PrunedSampler(table, pol, seed=1.5)


def test_a_prepared_step_is_committed_once() -> None:
    """commit() marks the step prepare() checked, without searching again; a step whose samples were
    marked since (committed twice, or taken by another update) is refused, nothing marked."""
    s = PrunedSampler(ScoreTable(8), InfoBatchPolicy(0.5, 2), seed=0)
    order = list(s)
    step = s.prepare(8, indices=True)
    assert step.indices is not None and step.indices.tolist() == order
    s.commit(step)
    assert s.position.epoch == 1
    s2 = PrunedSampler(ScoreTable(8), InfoBatchPolicy(0.5, 2), seed=0)
    list(s2)
    step = s2.prepare(6)
    s2.take(4)
    with pytest.raises(ValueError, match="commit"):
        s2.commit(step)
    assert s2.position.trained == 4
