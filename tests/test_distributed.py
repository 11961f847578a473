"""Real multi-process torch.distributed (gloo on CPU): every rank holds the same scores
before it plans, plans the same epoch, and serves its own disjoint shard."""

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from ranks import CountedGathers, in_process_group, spawn_ranks
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ScoreTable
from leanbatch.distributed import ScoreExchange, merge_scores
from leanbatch.distributed.collectives import gather_step

N, WORLD, EPOCHS = 203, 2, 3


def run_ranks(worker: Callable[[int, str, str], None]) -> list[Any]:
    """Run ``worker(rank, init_file, out_dir)`` on WORLD processes; what each saved to ``rank{r}.pt``."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(worker, (os.path.join(tmp, "init"), tmp), WORLD)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]


def check_shards(stats: list, served_a: list, served_b: list) -> None:
    """Per epoch: equal shard lengths that together serve the whole plan, overlapping only by padding."""
    for epoch, (sa, sb) in enumerate(zip(served_a, served_b, strict=True)):
        assert len(sa) == len(sb)  # equal shard lengths
        kept, padded = stats[epoch]["kept"], stats[epoch]["padded"]
        assert len(sa) + len(sb) == kept + padded
        assert len(set(sa) | set(sb)) == kept  # together they serve the whole plan
        assert len(set(sa) & set(sb)) <= padded  # and overlap only by the padding


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
        ds = InfoBatch(data, EPOCHS, prune_ratio=0.5, delta=0.67, seed=5)  # rank and world from dist
        loader = DataLoader(ds, batch_size=8, sampler=ds.sampler)
        served = []
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            mine = []
            for x, i in loader:
                mine.extend(i.tolist())
                ds.update((x / N + rank).requires_grad_())  # ranks see different losses on purpose
            served.append(mine)
        merge_scores(ds.scores)
        torch.save(
            {"served": served, "scores": ds.scores.values, "stats": ds.epoch_stats},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_share_scores_plans_and_split_the_data():
    results = run_ranks(_worker)
    a, b = results
    assert torch.equal(a["scores"], b["scores"])  # merged: identical tables on every rank
    assert a["stats"] == b["stats"]  # identical plans
    assert a["stats"][1]["pruning"] and a["stats"][1]["kept"] < N
    check_shards(a["stats"], a["served"], b["served"])
    # each score is the loss of the rank that served the sample last (x / N + rank); padding (a
    # sample served a second time, at the end of a shard, so the shards have equal lengths)
    # trains but does not score, so a padded sample keeps the score of its first serving and
    # the merge does not depend on which rank padded
    padding = b["served"][-1][-a["stats"][-1]["padded"] :]  # rank 1's shard ends with the padding
    last_a, last_b = set(a["served"][-1]), set(b["served"][-1])
    expected = torch.arange(N) / N
    for i in range(N):
        expected[i] += 1.0 if (i in last_b and i not in padding) else 0.0
    assert len(padding) == 1 and padding[0] in last_a  # first served, unpadded, on rank 0
    assert last_a | last_b == set(range(N))  # the last epoch anneals: everything served
    assert torch.allclose(a["scores"], expected, atol=1e-6)


def _global_plan_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
        # shard=False: every rank serves the whole plan (accelerate shards the batches itself)
        ds = InfoBatch(data, EPOCHS, prune_ratio=0.5, delta=0.67, seed=5, shard=False)
        orders = []
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            order = list(ds.sampler)
            orders.append(order)
            mine = torch.tensor(order[rank::WORLD])  # this rank trains every WORLD-th sample
            ds.scores.update(mine, mine / N + rank)
            ds.sampler.take(len(order))  # the whole global batch is trained, across ranks
        merge_scores(ds.scores)  # planning merges; the last epoch's scores are merged here
        errors = []
        wrong = InfoBatch(data, EPOCHS, num_replicas=1, rank=0, seed=5)  # shards for a world of 1
        wrong.scores.update(torch.arange(N), torch.rand(N))
        wrong.set_epoch(1)
        try:
            len(wrong.sampler)
        except ValueError as e:
            errors.append(str(e))
        torch.save(
            {"orders": orders, "scores": ds.scores.values, "stats": ds.epoch_stats, "errors": errors},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_global_plan_on_every_rank_with_merged_scores_and_world_mismatch_refused():
    a, b = run_ranks(_global_plan_worker)
    assert a["orders"] == b["orders"]  # the same global order on both ranks, every epoch
    assert [len(o) for o in a["orders"]] == [s["kept"] for s in a["stats"]]  # whole plans, unsharded
    assert a["stats"][1]["pruning"] and a["stats"][1]["kept"] < N
    ds_scores = a["scores"]
    assert torch.equal(ds_scores, b["scores"])  # merged before each plan and at the end
    assert len(a["errors"]) == 1 and "process group has 2 processes" in a["errors"][0]


def _mean_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        table = ScoreTable(4, ema=0.5, variance=True)
        for loss in [[1.0, 3.0], [5.0]][rank]:  # index 0: mean 2, variance 1 on rank 0; 5 and 0 on rank 1
            table.update(torch.tensor([0]), torch.tensor([loss]))
        table.update(torch.tensor([1]), torch.tensor([3e38]))  # two writers of a huge loss: no overflow
        if rank == 1:
            table.update(torch.tensor([2]), torch.tensor([7.0]))  # one writer
        merge_scores(table)
        torch.save((table.values, table.variances), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_a_merge_takes_the_mean_of_the_ranks_that_wrote_each_index_variances_included():
    """Writes that bypass update() are merged: per index, the mean over the ranks that wrote it,
    of the scores and of the EMA variances; huge losses do not overflow; unwritten stay NaN."""
    (va, vara), (vb, varb) = run_ranks(_mean_worker)
    assert torch.equal(va.nan_to_num(-1), vb.nan_to_num(-1)) and torch.equal(
        vara.nan_to_num(-1), varb.nan_to_num(-1)
    )
    assert torch.equal(va[:3], torch.tensor([3.5, 3e38, 7.0])) and va[3].isnan()
    assert vara[:3].tolist() == [0.5, 0.0, 0.0] and vara[3].isnan()


def _resume_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        table = ScoreTable(4)
        table.update(torch.tensor([rank]), torch.tensor([10.0 + rank]))  # each rank scores its own sample
        merge_scores(table)
        resumed = ScoreTable(4)
        resumed.load_state_dict(table.state_dict())  # a checkpoint: every rank loads the same table
        if rank == 1:
            resumed.update(torch.tensor([0]), torch.tensor([5.0]))  # sample 0 trained on rank 1 only
        merge_scores(resumed)
        torch.save(resumed.values, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_after_a_resume_the_merge_takes_only_the_fresh_losses():
    a, b = run_ranks(_resume_worker)
    torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    # 5.0 alone: the loaded 10.0 is not a loss written since the resume, so it is not averaged in
    assert a[:2].tolist() == [5.0, 11.0] and a[2:].isnan().all()


def _resume_before_init_worker(rank: int, init_file: str, out_dir: str) -> None:
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.5, delta=0.67, seed=5)  # built before the group, as
    resumed = InfoBatch(data, EPOCHS, prune_ratio=0.5, delta=0.67, seed=5)  # frameworks do
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        loader = DataLoader(ds, batch_size=8, sampler=ds.sampler)
        whole = [i for _, i in loader]  # this rank's shard of epoch 0
        ds.sampler.set_epoch(0)
        for x, i in DataLoader(ds, batch_size=8, sampler=ds.sampler):
            ds.update(x / N, i)
            break  # a checkpoint after one batch
        resumed.load_state_dict(ds.state_dict())
        rest = [i for _, i in DataLoader(resumed, batch_size=8, sampler=resumed.sampler)]
        torch.save(
            {"whole": torch.cat(whole), "rest": torch.cat(rest), "len": len(resumed.sampler)},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_a_resumed_epoch_is_sharded_like_the_group_even_when_built_before_it():
    a, b = run_ranks(_resume_before_init_worker)
    for r in (a, b):
        assert torch.equal(r["rest"], r["whole"][8:])  # this rank's shard, from where it stopped
    assert a["len"] == b["len"] == math.ceil(N / WORLD) - 8
    assert not set(a["rest"].tolist()) & set(b["rest"].tolist())


def _short_last_batch_worker(rank: int, init_file: str, out_dir: str) -> None:
    """11 samples on 2 ranks in batches of 4: each shard is 6 (one of them padding), so every rank's
    last batch is 2 rows; rank 0 trains one row of each batch, rank 1 all of them (as a selection
    that keeps different counts on different ranks would)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = InfoBatch(list(range(11)), 2, prune_ratio=0.5, seed=3)
        loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
        sizes, kept = [], []
        for epoch in range(2):
            ds.set_epoch(epoch)
            for idx in loader:
                pos = torch.arange(1) if rank == 0 else torch.arange(idx.numel())
                ds.update(idx[pos].float().requires_grad_(), idx, positions=pos)  # loss = the index
                sizes.append(idx.numel())
                kept.extend(idx[pos].tolist())
        merge_scores(ds.scores)
        torch.save(
            {"sizes": sizes, "kept": kept, "scores": ds.scores.values, "stats": ds.epoch_stats},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_a_short_last_batch_and_unequal_selections_do_not_hang_the_ranks():
    a, b = run_ranks(_short_last_batch_worker)
    assert a["sizes"][:2] == b["sizes"][:2] == [4, 2]  # epoch 0: a full batch, then a short one
    assert a["stats"] == b["stats"] and torch.equal(a["scores"].nan_to_num(-1), b["scores"].nan_to_num(-1))
    scored = torch.isfinite(a["scores"]).nonzero().flatten().tolist()
    assert set(scored) == set(a["kept"]) | set(b["kept"])  # every trained row scored, on both ranks
    assert all(a["scores"][i] == i for i in scored)


def _subset_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Each rank passes the indices of part of its batch of 4 (2 rows on rank 0, 3 on rank 1), then
    the same rows as positions of the whole batch."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = InfoBatch(TensorDataset(torch.arange(16.0), torch.arange(16)), 2, seed=0)
        x, idx = next(iter(DataLoader(ds, batch_size=4, sampler=ds.sampler)))
        k = 2 + rank
        try:
            ds.update(x[:k].requires_grad_(), idx[:k])
            error = ""
        except ValueError as e:
            error = str(e)
        untouched = (ds.position.trained, ds.scores.num_scored())
        ds.update(x[:k].requires_grad_(), idx, positions=torch.arange(k))
        torch.save(
            {"error": error, "untouched": untouched, "scores": ds.scores.values, "idx": idx},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_indices_of_part_of_the_batch_are_refused_on_every_rank_before_the_gather():
    """The ranks gather one row per index, so a rank passing fewer indices than its batch (a
    different number on each rank) would make gloo abort the process; it is a ValueError naming
    the fix instead, before anything changes, and positions= then trains the same rows."""
    runs = run_ranks(_subset_worker)
    for rank, run in enumerate(runs):
        assert f"indices has {2 + rank} entries but the batch it trains has 4" in run["error"]
        assert "positions=rows" in run["error"] and run["untouched"] == (0, 0)
    assert torch.equal(runs[0]["scores"].nan_to_num(-1), runs[1]["scores"].nan_to_num(-1))
    trained = torch.cat([runs[0]["idx"][:2], runs[1]["idx"][:3]])
    assert torch.equal(runs[0]["scores"][trained], trained.float())


def _gather_worker(rank: int, out_dir: str) -> None:
    with CountedGathers() as counted:
        table = ScoreTable(8)
        idx = torch.tensor([2 * rank, 2 * rank + 1])
        ScoreExchange(table).send(idx, torch.tensor([[float("nan"), 3.0e38], [1e-45, 0.1]][rank]))
        after_store = (counted.calls, counted.waited)
        values = table.values.clone()  # a read flushes: the gather is awaited here
        edge = gather_step(torch.tensor([2**53 - 1 - rank]), torch.tensor([-float("inf") if rank else 2.5]))()
        after_read = (counted.calls, counted.waited)
    torch.save(
        {"after_store": after_store, "after_read": after_read, "values": values, "edge": edge},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


def test_a_steps_rows_travel_in_one_collective_awaited_only_when_the_scores_are_read():
    """update()'s gather: one all-gather (not one per column), not waited for in the step; every
    float32 loss (NaN, 3e38, denormals, infinities) and every index below 2**53 arrives exactly."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (WORLD, os.path.join(tmp, "init"), _gather_worker, tmp), WORLD)
        runs = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]
    expect = torch.tensor([float("nan"), 3.0e38, 1e-45, 0.1, *[float("nan")] * 4])
    for run in runs:
        assert run["after_store"] == (1, 0) and run["after_read"] == (2, 2)
        torch.testing.assert_close(run["values"], expect, equal_nan=True, rtol=0, atol=0)
        idx, loss = run["edge"]
        assert idx.dtype == torch.int64 and idx.tolist() == [2**53 - 1, 2**53 - 2]
        assert loss.dtype == torch.float32 and loss.tolist() == [2.5, -float("inf")]
