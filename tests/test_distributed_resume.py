"""Real processes (gloo on CPU): a checkpoint saved by rank 0 alone, mid-epoch, resumes on any
number of ranks. Every rank stores every rank's scores at every step, so rank 0's state holds
them all; the position is a place in the epoch's global order, so a run saved on 2 ranks
resumes on 1 or on 3 with the same plans and the same samples trained, none twice."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch
from ranks import in_process_group, spawn_ranks
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch

N, EPOCHS, BS, SAVE_AT = 203, 4, 8, (1, 5)  # save after the 5th batch of epoch 1 (a pruning epoch)


def loss_of(x: torch.Tensor, epoch: int) -> torch.Tensor:
    """A loss that depends on the sample and the epoch only, not on which rank trains it."""
    return (torch.sin(x * (epoch + 1)).abs() + 0.01).requires_grad_()


def make() -> InfoBatch:
    return InfoBatch(TensorDataset(torch.arange(N, dtype=torch.float32)), EPOCHS, 0.5, 0.75, seed=3)


def _worker(rank: int, out: str, resume: str | None) -> None:
    ds = make()
    if resume is not None:
        ds.load_state_dict(torch.load(resume, weights_only=True))
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    served: dict[int, list[int]] = {}
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for k, (x,) in enumerate(loader):
            served.setdefault(epoch, []).extend(x.long().tolist())
            ds.update(loss_of(x, epoch))
            if resume is None and (epoch, k + 1) == SAVE_AT and rank == 0:
                torch.save(ds.state_dict(), os.path.join(out, "ckpt.pt"))  # rank 0 alone, no sync
    torch.save(
        {"served": served, "stats": ds.epoch_stats, "scores": ds.scores.values.clone()},
        os.path.join(out, f"{'resumed' if resume else 'full'}{rank}.pt"),
    )


def run(world: int, out: str, resume: str | None = None) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (world, os.path.join(tmp, "init"), _worker, out, resume), world)
    name = "resumed" if resume else "full"
    return [torch.load(os.path.join(out, f"{name}{r}.pt"), weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    out = str(tmp_path_factory.mktemp("ddp"))
    return out, run(2, out)


def test_rank_zeros_mid_epoch_state_holds_every_ranks_scores(saved):
    out, full = saved
    state = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    epoch, batches = SAVE_AT
    trained = [i for r in full for i in r["served"][epoch][: batches * BS]]  # both ranks' first batches
    values = state["scores"]["values"]
    expected = loss_of(torch.tensor(trained, dtype=torch.float32), epoch).detach()
    torch.testing.assert_close(values[trained], expected)  # rank 1's samples too, without any sync()
    assert state["sampler"]["position"] == 2 * batches * BS  # global: both ranks' samples


@pytest.mark.parametrize("world", [1, 3])
def test_a_two_rank_checkpoint_resumes_on_another_number_of_ranks(saved, world):
    out, full = saved
    resumed = run(world, out, os.path.join(out, "ckpt.pt"))

    def plans(stats: list[dict]) -> list[tuple]:  # padding depends on the world size; the plan does not
        return [(s["epoch"], s["kept"], s["pruned"], s["threshold"], s["pruning"]) for s in stats]

    assert all(plans(r["stats"]) == plans(full[0]["stats"]) for r in resumed)  # the same plans, every epoch
    for r in resumed[1:]:
        torch.testing.assert_close(r["scores"], resumed[0]["scores"], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(resumed[0]["scores"], full[0]["scores"], equal_nan=True)
    epoch, batches = SAVE_AT
    before = [i for r in full for i in r["served"][epoch][: batches * BS]]
    after = [i for r in resumed for i in r["served"][epoch]]
    kept = full[0]["stats"][epoch]["kept"]
    whole = {i for r in full for i in r["served"][epoch]}
    assert set(before) | set(after) == whole and len(whole) == kept  # nothing left out
    # nothing trained twice but padding: fewer than `world` samples served again (wrapping to the
    # epoch's start, as the uninterrupted run pads) so the new world's shards have equal lengths
    assert len(before) + len(after) - kept == len(set(before) & set(after)) + len(after) - len(set(after))
    assert len(before) + len(after) - kept < world
    for e in range(epoch + 1, EPOCHS):  # later epochs: the same plan, served by the new world
        assert {i for r in resumed for i in r["served"][e]} == {i for r in full for i in r["served"][e]}


def _fsdp_worker(rank: int, out: str, sharded: bool) -> None:
    """A plain loop with InfoBatch over a model sharded by FSDP2 (``fully_shard``) or replicated by DDP."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    net = fully_shard(model) if sharded else DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ds = make()
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    weights = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        for (x,) in loader:
            idx = ds.next_indices(len(x))
            weights.append(ds.weights(idx).tolist())
            loss = ds.update((net(x[:, None] / N).squeeze(1) - torch.sin(x)).pow(2))
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.save(
        {"stats": ds.epoch_stats, "scores": ds.scores.values.clone(), "weights": weights},
        os.path.join(out, f"{'fsdp' if sharded else 'ddp'}{rank}.pt"),
    )


def test_pruning_weights_and_scores_are_exact_when_the_model_is_sharded_by_fsdp(tmp_path):
    """FSDP shards parameters, not data: every rank still trains its own shard of the plan, with
    the same weights and scores as under DDP (up to the float sums sharding reorders)."""
    runs = {}
    for sharded in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            args = (2, os.path.join(tmp, "init"), _fsdp_worker, str(tmp_path), sharded)
            spawn_ranks(in_process_group, args, 2)
        name = "fsdp" if sharded else "ddp"
        runs[name] = [torch.load(tmp_path / f"{name}{r}.pt", weights_only=False) for r in range(2)]
    for ddp, fsdp in zip(runs["ddp"], runs["fsdp"], strict=True):
        assert ddp["stats"] == fsdp["stats"] and ddp["weights"] == fsdp["weights"]
        torch.testing.assert_close(ddp["scores"], fsdp["scores"], rtol=1e-4, atol=1e-5, equal_nan=True)
    assert any(s["pruning"] and s["kept"] < N for s in runs["fsdp"][0]["stats"])
