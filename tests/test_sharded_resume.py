"""Sharded checkpoints in real processes (gloo on CPU): per-rank states saved mid-epoch on 2 ranks,
gathered into one unsharded state, re-sharded for 1 and 3 ranks, resume with the same later plans,
and the interrupted epoch trains every kept sample once (the padding aside) whatever the world."""

from __future__ import annotations

import os

import pytest
import torch
from sharded_helpers import done, init, spawn
from test_sharded import BS, EPOCHS, N, loss_of, whole
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch
from leanbatch.distributed import gather_states, shard_state

SAVE_AT = (1, 3)  # after the 3rd batch of epoch 1 (a pruning epoch)


def make(sharded: bool = True) -> InfoBatch:
    return InfoBatch(
        TensorDataset(torch.arange(N, dtype=torch.float32)), EPOCHS, 0.5, 0.8, seed=4, shard_scores=sharded
    )


def _worker(rank: int, world: int, init_file: str, out: str, load: str | None, mode: str) -> None:
    init(rank, world, init_file)
    try:
        ds = make(mode != "unsharded")
        if load is not None:  # own: each rank its own state; else the gathered one, cut or whole
            state = torch.load(
                load.replace("gathered.pt", f"own{rank}.pt") if mode == "own" else load, weights_only=True
            )
            ds.load_state_dict(shard_state(state, world, rank) if mode == "shard_state" else state)
        loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
        served: dict[int, list[int]] = {}
        plans = {}
        for epoch in range(ds.epoch, EPOCHS):
            ds.set_epoch(epoch)
            plan = ds.sampler.plan()  # the epoch's plan (a resumed epoch: its continuation)
            for k, (x,) in enumerate(loader):
                served.setdefault(epoch, []).extend(x.long().tolist())
                ds.update(loss_of(x, epoch))
                if load is None and (epoch, k + 1) == SAVE_AT:
                    torch.save(ds.state_dict(), os.path.join(out, f"shard{rank}.pt"))  # each rank its own
            plans[epoch] = (plan.kept, plan.weights)
        state = {"served": served, "plans": plans, "stats": ds.epoch_stats, "scores": ds.scores.values}
        if load is None:
            state["shards"] = torch.load(os.path.join(out, f"shard{rank}.pt"), weights_only=True)
        torch.save(state, os.path.join(out, f"rank{rank}.pt"))
    finally:
        done()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    full = spawn(_worker, 2, None, "sharded")
    path = str(tmp_path_factory.mktemp("shards") / "gathered.pt")
    torch.save(gather_states([r["shards"] for r in reversed(full)]), path)  # any order
    for rank, r in enumerate(full):  # each rank's own state, for a resume on the same world
        torch.save(r["shards"], path.replace("gathered.pt", f"own{rank}.pt"))
    return path, full


def _plans(results: list[dict], epoch: int) -> tuple:
    for r in results:  # whole() reads plans by epoch index
        r["plan_list"] = [r["plans"].get(e, (None, None)) for e in range(EPOCHS)]
    return whole([{"plans": r["plan_list"]} for r in results], epoch)


@pytest.mark.parametrize(
    "world,mode", [(2, "own"), (1, "auto"), (3, "shard_state"), (1, "unsharded"), (3, "auto")]
)
def test_a_gathered_mid_epoch_state_resumes_on_another_world(saved, world, mode):
    path, full = saved
    resumed = spawn(_worker, world, path, mode)
    epoch, batches = SAVE_AT
    before = [i for r in full for i in r["served"][epoch][: batches * BS]]
    after = [i for r in resumed for i in r["served"][epoch]]
    kept = full[0]["stats"][epoch]["kept"]
    planned, _ = _plans(full, epoch)
    assert planned is not None and len(planned) == kept < N  # a pruning epoch
    assert set(before) | set(after) == planned  # every kept sample trained
    padded = len(before) + len(after) - kept
    assert (
        len(set(before) & set(after)) == 0 and len(after) - len(set(after)) == padded
    )  # none twice but padding
    assert len({len(r["served"][epoch]) for r in resumed}) == 1  # equal shards (padded to the longest)
    for e in range(epoch + 1, EPOCHS):  # later epochs: the uninterrupted run's plans and weights
        k_full, w_full = _plans(full, e)
        if mode == "unsharded":
            k_res, w_res = resumed[0]["plans"][e]
            k_res = None if k_res is None else set(k_res.tolist())
        else:
            k_res, w_res = _plans(resumed, e)
        assert k_res == k_full and ((w_res is None and w_full is None) or torch.equal(w_res, w_full))
    strip = [(s["epoch"], s["kept"], s["threshold"], s["pruning"]) for s in full[0]["stats"]]
    for r in resumed:
        assert [(s["epoch"], s["kept"], s["threshold"], s["pruning"]) for s in r["stats"]] == strip
    assert resumed[0]["stats"] and all(r["served"].keys() == set(range(epoch, EPOCHS)) for r in resumed)


def test_a_checkpoint_from_another_dataset_size_is_refused(saved):
    path, _ = saved
    state = torch.load(path, weights_only=True)
    other = InfoBatch(TensorDataset(torch.arange(N + 1.0)), EPOCHS, shard_scores=True, num_replicas=2, rank=1)
    with pytest.raises(ValueError, match="dataset of 203 samples"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="another rank|rank 0 of 2|gather"):
        make_two = InfoBatch(
            TensorDataset(torch.arange(float(N))), EPOCHS, shard_scores=True, num_replicas=2, rank=1
        )
        make_two.load_state_dict(shard_state(state, 2, 0))  # rank 0's part on rank 1
