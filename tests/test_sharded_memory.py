"""Sharded scores in one process (ranks simulated in turns, collectives combined exactly): the bytes a
rank holds fall as N / world, and every policy's sharded plans equal its unsharded ones."""

from __future__ import annotations

import pytest
import torch
from test_sharded import policy

from leanbatch.bench.micro_sharded import _fill, _measure
from leanbatch.planner import EpochPlanner
from leanbatch.scores import ScoreTable
from leanbatch.sharding import Sharding
from leanbatch.simulate import SimulatedWorld


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
    tables = [ScoreTable(n, world=world, rank=r, **_options(name)) for r in range(world)]
    whole = ScoreTable(n, **_options(name))
    sim = SimulatedWorld(world)
    planners = [
        EpochPlanner(t, policy(name), 3, Sharding(world, r, scores_sharded=True), sim.comm(r))
        for r, t in enumerate(tables)
    ]
    reference = EpochPlanner(whole, policy(name), 3)
    g = torch.Generator().manual_seed(1)
    for epoch in range(epochs):
        losses = torch.round(torch.rand(n, generator=g) * 8) / 8  # ties on purpose
        _fill_with(tables + [whole], losses)
        plans = sim.run([lambda p=p, e=epoch: p.plan(e) for p in planners])
        ref = reference.plan(epoch)
        kept = set() if ref.kept is not None else None
        for r, p in enumerate(plans):
            assert p.shard is not None and p.shard.counts == plans[0].shard.counts
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


def _fill_with(tables: list[ScoreTable], losses: torch.Tensor) -> None:
    for t in tables:
        idx = t.slice.indices()
        t.update(idx, losses[idx])


def test_fill_gives_each_rank_its_own_rows():
    tables = [ScoreTable(10, world=3, rank=r) for r in range(3)]
    whole = ScoreTable(10)
    _fill(tables + [whole], 10, chunk=4)
    for r, t in enumerate(tables):
        assert torch.equal(t.values, whole.values[r::3])
