"""Sharded scores in one process (ranks simulated in turns, collectives combined exactly): the bytes a
rank holds fall as N / world, and every policy's sharded plans equal its unsharded ones."""

from __future__ import annotations

import pytest
import torch
from test_sharded import policy

from leanbatch import ScoreTable
from leanbatch.distributed import ShardedScores
from leanbatch.distributed.shards import ShardedPlan
from leanbatch.distributed.simulate import SimulatedWorld
from leanbatch.epochs import plan_epoch
from leanbatch.micro.overheads import _fill
from leanbatch.micro.sharded import _measure


def test_the_bytes_a_rank_holds_scale_as_n_over_world():
    n = 200_003
    held = {}
    for world in (1, 2, 4, 8):
        rows = _measure(n, world, world > 1, 1, "random")
        assert len(rows) == (world if world > 1 else 1) and len({r["kept"] for r in rows}) == 1
        held[world] = max(r["score_bytes"] + r["plan_bytes"] for r in rows)
        assert held[world] <= 12 * (-(-n // world)) + 64  # at most 12 bytes per own sample (+ the spare slot)
    for world in (2, 4, 8):
        assert held[world] * world < held[1] * 1.01  # N / world each, not N


@pytest.mark.parametrize("name", ["infobatch", "infobatch-all", "random", "rs2", "egreedy", "ucb", "seta"])
def test_simulated_ranks_plan_what_one_process_plans(name):
    n, world, epochs = 1031, 4, 4
    tables = [ShardedScores(n, world, r, **_options(name)) for r in range(world)]
    whole = ScoreTable(n, **_options(name))
    sim = SimulatedWorld(world)
    policies = [_bound(policy(name), t) for t in tables]
    reference = _bound(policy(name), whole)
    g = torch.Generator().manual_seed(1)
    for epoch in range(epochs):
        losses = torch.round(torch.rand(n, generator=g) * 8) / 8  # ties on purpose
        _fill_with(tables + [whole], losses)
        plans = sim.run(
            [
                lambda r=r, e=epoch: plan_epoch(policies[r], tables[r], e, 3, world, r, comm=sim.comm(r))[0]
                for r in range(world)
            ]
        )
        ref = plan_epoch(reference, whole, epoch, 3, 1, 0)[0]
        kept = set() if ref.kept is not None else None
        for r, p in enumerate(plans):
            assert p.counts == plans[0].counts  # a ShardedPlan: every rank's counts
            if kept is not None:
                kept |= set(p.kept.tolist())
            if ref.weights is not None:
                assert torch.equal(p.weights, ref.weights[r::world])
        assert (
            kept == (None if ref.kept is None else set(ref.kept.tolist()))
            and plans[0].num_kept == ref.num_kept
        )


def _options(name: str) -> dict:
    return dict(getattr(policy(name), "score_table_options", dict)())


def _bound(pol, table):
    """The policy, bound to its table (what the sampler does: UCB reads the table's variances)."""
    bind = getattr(pol, "bind", None)
    if callable(bind):
        bind(table)
    return pol


def _fill_with(tables: list[ScoreTable], losses: torch.Tensor) -> None:
    for t in tables:
        idx = t.slice.indices() if isinstance(t, ShardedScores) else torch.arange(t.num_samples)
        t.update(idx, losses[idx])


def test_fill_gives_each_rank_its_own_rows():
    tables: list[ScoreTable] = [ShardedScores(10, 3, r) for r in range(3)]
    whole = ScoreTable(10)
    _fill(tables + [whole], 10, chunk=4)
    for r, t in enumerate(tables):
        assert torch.equal(t.values, whole.values[r::3])


def test_a_sharded_update_reads_no_value():
    """The per-step path of a sharded rank (keeping its own rows of the gathered ones, its weights by
    local row, the ownership check) on PyTorch's ``meta`` device, where any value read raises."""
    from torch.utils.data import DataLoader, TensorDataset

    from leanbatch import InfoBatch

    n, world = 1000, 2
    sim = SimulatedWorld(world)
    ranks = [
        InfoBatch(TensorDataset(torch.arange(n)), 4, seed=0, shard_scores=True, num_replicas=world, rank=r)
        for r in range(world)
    ]
    for r, ds in enumerate(ranks):
        ds.sampler.comm = sim.comm(r)
        own = ds.scores.slice.indices()
        ds.scores.update(own, torch.rand(own.numel(), generator=torch.Generator().manual_seed(r)))
        ds.set_epoch(1)
    sim.run([lambda ds=ds: len(ds.sampler) for ds in ranks])  # both plan epoch 1 (collectives)
    ds = ranks[1]
    assert ds.sampler.plan().pruning and isinstance(ds.sampler.plan(), ShardedPlan)
    it = iter(DataLoader(ds, batch_size=32, sampler=ds.sampler))
    ds.scores.to("meta")
    steps = (len(ds.sampler) - 1) // 64  # inside the epoch: its end checks the indices named (one sync)
    assert steps >= 4
    for _ in range(steps):
        next(it)
        out = ds.update(torch.empty(32, device="meta", requires_grad=True))  # rows kept by the owner
        out.backward()
        next(it)
        idx = ds.next_indices(32).to("meta")  # the batch's indices: rank 1's, on the device
        assert ds.weights(idx).device.type == "meta"
        out = ds.update(torch.empty(32, device="meta", requires_grad=True), idx)
        out.backward()
        assert out.device.type == "meta"
    ds.scores.flush()
    assert ds.scores.values.device.type == "meta" and ds.scores.values.shape == (n // world,)


def test_loss_rank_policy_and_unknown_policies_refuse_sharded_scores():
    from torch.utils.data import TensorDataset

    from leanbatch import InfoBatch, LossRankPolicy, PrunedSampler

    data = TensorDataset(torch.arange(10.0))
    with pytest.raises(ValueError, match="LossRankPolicy needs every score in one place"):
        InfoBatch(data, 2, policy=LossRankPolicy(0.5, 2), shard_scores=True, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="shard_scores=True"):  # a sharded table needs a sharded sampler
        PrunedSampler(ShardedScores(10, 2, 0), policy("random"))
    with pytest.raises(ValueError, match="init_process_group|num_replicas"):  # the slice must be known
        InfoBatch(data, 2, shard_scores=True)


@pytest.mark.parametrize("kind", ["positive", "signed", "tiny", "huge", "outlier"])
def test_the_mean_is_the_same_on_any_split_and_close_to_the_float64_mean(kind):
    from leanbatch.policies.parts import Slice, global_mean

    n, world = 5003, 3
    x = torch.rand(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = {
        "signed": x - 0.5,
        "tiny": x * 1e-30,
        "huge": x * 3e38,
        "outlier": x.index_fill(0, torch.tensor([7]), 1e9),
    }.get(kind, x)
    x = x.float()
    x[::13] = float("nan")
    whole = global_mean(x, Slice(n))
    sim = SimulatedWorld(world)
    parts = sim.run(
        [lambda r=r: global_mean(x[r::world], Slice(n, world, r, sim.comm(r))) for r in range(world)]
    )
    assert all(p == whole for p in parts)  # bit for bit
    exact = float(x[~torch.isnan(x)].double().mean())
    assert (
        whole[1] == int((~torch.isnan(x)).sum()) and abs(whole[0] - exact) <= 1e-9 * abs(x).nan_to_num().max()
    )


def test_micro_plan_shard_reports_each_simulated_rank(capsys, restore_torch_globals):
    from leanbatch import cli

    assert cli.main(["micro", "plan", "--sizes", "5000", "--shard", "--world", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert [f"| 5,000 | sharded / 3 | {r} |" in out for r in range(3)] == [
        True
    ] * 3 and "| 5,000 | unsharded |" in out
    assert cli.main(["micro", "plan", "--world", "3"]) == 2  # --world without --shard: one line, status 2
    assert "add --shard" in capsys.readouterr().err
