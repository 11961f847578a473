"""Sharded scores and plans (``shard_scores=True``) in real processes (gloo on CPU): each rank holds
its own slice of the index space, yet plans and weights equal the unsharded ones, every kept
sample is trained once per epoch on the rank that owns it, and shards have equal lengths."""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
import torch
from sharded_helpers import done, init, spawn
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import (
    EpsilonGreedyPolicy,
    InfoBatch,
    InfoBatchPolicy,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.policies.parts import Part, Slice

N, EPOCHS, BS = 203, 5, 8


def policy(name: str) -> Any:
    """Each supported policy, pruning in most of the EPOCHS epochs."""
    return {
        "infobatch": lambda: InfoBatchPolicy(0.5, EPOCHS, 0.8),
        "infobatch-all": lambda: InfoBatchPolicy(0.3, EPOCHS, 0.8, target="all"),
        "random": lambda: RandomPolicy(0.5, EPOCHS, 0.8),
        "rs2": lambda: RS2Policy(0.6, EPOCHS, seed=2),
        "egreedy": lambda: EpsilonGreedyPolicy(0.4, EPOCHS, epsilon=0.3),
        "ucb": lambda: UCBPolicy(0.4, EPOCHS, epsilon=0.2, c=0.5),
        "seta": lambda: SeTaPolicy(0.2, EPOCHS, num_groups=3, window_scale=0.67),
    }[name]()


def loss_of(x: torch.Tensor, epoch: int) -> torch.Tensor:
    """A loss of the sample and the epoch only (ties on purpose: rounded to 1/16)."""
    return (torch.round(torch.sin(x * (epoch + 1)).abs() * 16) / 16 + 0.01).requires_grad_()


NAMES = ("infobatch", "infobatch-all", "random", "rs2", "egreedy", "ucb", "seta")


def _worker(
    rank: int, world: int, init_file: str, out: str, names: tuple[str, ...], sharded: bool, drop_last: bool
) -> None:
    """Each policy of ``names`` in turn, in one process group (one spawn for all: the processes'
    start-up, not the training, is most of a spawn's time)."""
    init(rank, world, init_file)
    try:
        torch.save(
            {name: _run(name, sharded, drop_last) for name in names}, os.path.join(out, f"rank{rank}.pt")
        )
    finally:
        done()


def _run(name: str, sharded: bool, drop_last: bool) -> dict[str, Any]:
    data = TensorDataset(torch.arange(N, dtype=torch.float32))
    ds = InfoBatch(data, EPOCHS, policy=policy(name), seed=7, shard_scores=sharded, drop_last=drop_last)
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    served, plans, lengths = [], [], []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        lengths.append(len(ds.sampler))
        plan = ds.sampler.plan()  # the epoch's plan: made once, never re-made
        mine: list[int] = []
        for (x,) in loader:
            mine.extend(x.long().tolist())
            ds.update(loss_of(x, epoch))
        plans.append((plan.kept, plan.weights))
        served.append(mine)
    state = {"served": served, "plans": plans, "stats": ds.epoch_stats, "lengths": lengths}
    state["scores"] = ds.scores.values.clone()
    return state


def whole(results: list[dict], epoch: int) -> tuple[set[int] | None, torch.Tensor | None]:
    """The kept set and the (N,) weights of a sharded run's epoch, put together from every rank."""
    world = len(results)
    parts = [r["plans"][epoch] for r in results]
    kept = None if parts[0][0] is None else {int(i) for k, _ in parts for i in k}
    if parts[0][1] is None:
        return kept, None
    w = torch.empty(N)
    for rank, (_, wr) in enumerate(parts):
        w[rank::world] = wr
    return kept, w


def test_a_shardable_policy_has_one_signature_its_part_comes_as_the_scores():
    """No ``part=``: a sharded table hands a shardable policy its ``Part`` as the scores."""
    for name in NAMES:
        assert list(inspect.signature(policy(name).__call__).parameters) == ["scores", "epoch", "generator"]
    scores = torch.rand(N, generator=torch.Generator().manual_seed(1))
    plans = [
        InfoBatchPolicy(0.5, EPOCHS)(s, 0, torch.Generator().manual_seed(3))
        for s in (scores, Part(scores, Slice(N)))
    ]
    assert torch.equal(plans[0].kept, plans[1].kept) and plans[0].num_kept < N


@pytest.fixture(scope="module")
def runs() -> dict[tuple[int, bool], list[dict]]:
    """Every policy's run, unsharded on 1 process and sharded on 2 and 3 (one spawn each), and
    ``random`` sharded on 3 with ``drop_last``: each rank's states by policy."""
    return {
        (1, False): spawn(_worker, 1, NAMES, False, False),
        (2, False): spawn(_worker, 2, NAMES, True, False),
        (3, False): spawn(_worker, 3, NAMES, True, False),
        (3, True): spawn(_worker, 3, ("random",), True, True),
    }


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_sharded_plans_and_weights_equal_the_unsharded_ones(name, world, runs):
    ref = runs[1, False][0][name]
    results = [r[name] for r in runs[world, False]]
    assert any(s["pruning"] or s["kept"] < N for s in ref["stats"])  # the policy pruned something
    for epoch in range(EPOCHS):
        kept, w = whole(results, epoch)
        ref_kept, ref_w = ref["plans"][epoch]
        assert kept == (None if ref_kept is None else set(ref_kept.tolist())), (name, epoch)
        assert (w is None) == (ref_w is None) and (w is None or torch.equal(w, ref_w)), (name, epoch)
    for r in results:  # the statistics (kept, threshold, ...) but the padding, which depends on the world
        strip = [{k: v for k, v in s.items() if k not in ("padded", "dropped")} for s in r["stats"]]
        assert strip == [{k: v for k, v in s.items() if k not in ("padded", "dropped")} for s in ref["stats"]]
    for rank, r in enumerate(results):  # each rank holds its own rows of the same scores
        torch.testing.assert_close(r["scores"], ref["scores"][rank::world], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_kept_sample_is_trained_once_on_its_owner_with_equal_shard_lengths(drop_last, runs):
    world = 3
    results = [r["random"] for r in runs[world, drop_last]]
    for epoch in range(EPOCHS):
        stats = results[0]["stats"][epoch]
        lengths = [len(r["served"][epoch]) for r in results]
        assert len(set(lengths)) == 1 and lengths[0] == results[0]["lengths"][epoch]  # equal shards
        kept, _ = whole(results, epoch)
        kept = set(range(N)) if kept is None else kept
        for rank, r in enumerate(results):
            assert all(i % world == rank for i in r["served"][epoch])  # owner-serves
        served = [i for r in results for i in r["served"][epoch]]
        if drop_last:  # truncated to the shortest shard: nothing twice, only the extras left out
            assert len(served) == len(set(served)) and set(served) <= kept
            assert len(kept) - len(served) == stats["dropped"]
        else:  # every kept sample once; the padding repeats some
            assert set(served) == kept and len(served) - len(kept) == stats["padded"]
        assert lengths[0] % BS != 0 or epoch == 0  # a short last batch on every rank (no hang)
