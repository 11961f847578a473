"""An index above 2**24 (where float32 stops holding every integer) survives every path of a sharded
run: scores, fates, serving and state, on 2 real processes (gloo on CPU)."""

from __future__ import annotations

import os

import torch
from sharded_helpers import done, init, spawn

from leanbatch import InfoBatch, InfoBatchPolicy, ScoreTable
from leanbatch.distributed import gather_states, shard_state
from leanbatch.epochs import plan_epoch

N = 2**24 + 100
HIGH = torch.arange(N - 64, N)  # the 64 highest indices, odd ones included


def losses_of(idx: torch.Tensor) -> torch.Tensor:
    return (idx - (N - 64)).float() / 8 + 0.5  # distinct, some below the mean of the 64, some above


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    init(rank, world, init_file)
    try:
        ds = InfoBatch(range(N), 3, policy=InfoBatchPolicy(0.5, 3, 1.0), seed=9, shard_scores=True)
        mine = HIGH[HIGH % world == rank]
        ds.update(losses_of(mine).requires_grad_(), mine)  # explicit indices; every rank's rows gathered
        ds.set_epoch(1)
        plan = ds.sampler.plan()
        local = len(ds.sampler)
        served = plan.serve(ds.sampler.seed, torch.arange(local, dtype=torch.int64) * world + rank)
        it = iter(ds.sampler)
        first = torch.tensor([next(it) for _ in range(8)])  # one batch trained: a mid-epoch state
        ds.update(torch.ones(8, requires_grad=True))
        state = ds.state_dict()
        torch.save(
            {
                "kept": plan.kept,
                "weights": plan.weights,
                "served": served,
                "state": state,
                "high_scores": ds.scores.get(mine),
                "mine": mine,
                "first": first,
            },
            os.path.join(out, f"rank{rank}.pt"),
        )
    finally:
        done()


def test_an_index_above_2_to_the_24_survives_scores_fates_serving_and_state():
    world = 2
    results = spawn(_worker, world, timeout=400)
    table = ScoreTable(N)
    table.update(HIGH, losses_of(HIGH))
    ref = plan_epoch(InfoBatchPolicy(0.5, 3, 1.0), table, 1, seed=9, world=1, rank=0)[0]
    ref_kept = ref.kept.long()
    assert ref.pruning and int(ref_kept.max()) == N - 1
    for rank, r in enumerate(results):
        assert torch.equal(r["high_scores"], losses_of(r["mine"]))  # stored at the right rows
        assert torch.equal(r["kept"].long(), ref_kept[ref_kept % world == rank])  # the same fates
        assert torch.equal(r["weights"], ref.weights[rank::world])
        assert torch.equal(torch.sort(torch.unique(r["served"])).values, r["kept"].long())  # served: its kept
    dropped = set(HIGH.tolist()) - set(ref_kept.tolist())
    assert (
        dropped and any(i % 2 for i in dropped) and any(i > 2**24 and i % 2 for i in ref_kept[-64:].tolist())
    )
    gathered = gather_states([r["state"] for r in results])
    values = gathered["scores"]["values"]
    trained = torch.cat([r["first"] for r in results])
    assert torch.equal(values[HIGH[~torch.isin(HIGH, trained)]], losses_of(HIGH[~torch.isin(HIGH, trained)]))
    left = gathered["sampler"]["plan"]["kept"].long()  # the continuation: the kept samples not trained yet
    assert (
        torch.equal(left, ref_kept[~torch.isin(ref_kept, trained)])
        and gathered["sampler"]["plan"]["trained_before"] == 16
    )
    for rank in range(3):  # re-sharded for 3 ranks: each its own high indices, scores and weights
        part = shard_state(gathered, 3, rank)
        assert torch.equal(part["sampler"]["plan"]["kept"].long(), left[left % 3 == rank])
        torch.testing.assert_close(part["scores"]["values"], values[rank::3], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(part["sampler"]["plan"]["weights"], ref.weights[rank::3])
