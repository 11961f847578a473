"""ScoreCarrier: a step's score rows ride DDP's gradient all-reduce (real gloo processes)."""

from __future__ import annotations

import copy
import gc
import os
import tempfile
import weakref
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks import CountedGathers, in_process_group, spawn_ranks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ScoreTable
from leanbatch.distributed import ScoreCarrier, ScoreExchange

WORLD, N, EPOCHS = 2, 150, 4


def _run(body: Any) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (WORLD, os.path.join(tmp, "init"), body, tmp), WORLD)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]


def _train(rank: int, carry: bool, accumulate: int = 1, shard: bool = False) -> dict[str, Any]:
    """InfoBatch under DDP on a small regression task; every `accumulate`-th step all-reduces."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, 6, generator=g), torch.randn(N, generator=g)
    ds = InfoBatch(TensorDataset(torch.arange(N), x, y), EPOCHS, prune_ratio=0.5, seed=3, shard_scores=shard)
    torch.manual_seed(1)
    model = DDP(torch.nn.Linear(6, 1))
    carrier = ds.carry_scores(model) if carry else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ds, batch_size=8, sampler=ds.sampler)
    plans, step = [], 0
    with CountedGathers() as gathers:
        for _ in range(EPOCHS):
            served = []  # this rank's trained order of the epoch
            for idx, xb, yb in loader:
                served.append(idx)
                step += 1
                sync = step % accumulate == 0
                with model.no_sync() if not sync else _nothing():
                    loss = ds.update(F.mse_loss(model(xb).squeeze(1), yb, reduction="none"), idx)
                    loss.backward()
                if sync:
                    opt.step()
                    opt.zero_grad()
            plans.append(torch.cat(served))
    state = ds.state_dict() if rank == 0 and not shard else None  # rank 0 alone: no collective
    return {
        "scores": ds.scores.values.clone(),
        "state": state,
        "plans": plans,
        "weight": model.module.weight.detach().clone(),
        "gathers": gathers.calls,
        "steps": step,
        "carried": None if carrier is None else (carrier.carried_rows, carrier.gathered_rows),
    }


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _loop_worker(rank: int, out_dir: str) -> None:
    out = {"gather": _train(rank, carry=False), "carry": _train(rank, carry=True)}
    out["gather_acc"], out["carry_acc"] = _train(rank, False, accumulate=2), _train(rank, True, accumulate=2)
    out["gather_shard"], out["carry_shard"] = _train(rank, False, shard=True), _train(rank, True, shard=True)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def test_carried_scores_train_exactly_as_gathered_ones_with_no_collective_of_their_own():
    """The same scores, plans, weights and rank-0 checkpoint as the all-gather, bit for bit, in a
    real DDP loop (and with sharded scores: each owner stores its rows); the carrier makes no
    all-gather, and under no_sync its rows go by the gather."""
    runs = _run(_loop_worker)
    for r in runs:
        for a, b in (("gather", "carry"), ("gather_acc", "carry_acc"), ("gather_shard", "carry_shard")):
            x, y = r[a], r[b]
            assert torch.equal(x["scores"].nan_to_num(-1), y["scores"].nan_to_num(-1))
            assert all(torch.equal(p, q) for p, q in zip(x["plans"], y["plans"], strict=True))
            assert torch.equal(x["weight"], y["weight"])
        assert r["gather"]["gathers"] == r["gather"]["steps"]  # one all-gather a step...
        assert r["carry"]["gathers"] == 0  # ...and none with the carrier
        for key in ("carry", "carry_shard"):  # every trained row rode the all-reduce
            carried, gathered = r[key]["carried"]
            assert gathered == 0 and carried == sum(p.numel() for p in r[key]["plans"])
        # accumulation: the no_sync steps' rows (odd steps) went by the all-gather
        acc_steps = r["carry_acc"]["steps"]
        assert r["carry_acc"]["gathers"] == acc_steps - acc_steps // 2
        assert r["carry_acc"]["carried"][1] > 0 and r["carry_acc"]["carried"][0] > 0
    a, b = runs
    assert torch.equal(a["carry"]["scores"].nan_to_num(-1), b["carry"]["scores"].nan_to_num(-1))
    # rank 0's checkpoint, taken alone, holds both ranks' scores
    saved = a["carry"]["state"]["scores"]["values"]
    assert torch.equal(saved.nan_to_num(-1), a["gather"]["state"]["scores"]["values"].nan_to_num(-1))
    assert int(torch.isfinite(saved).sum()) > N // 2


def _edge_worker(rank: int, out_dir: str) -> None:
    out: dict[str, Any] = {}
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    model, plain = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))
    carrier = ScoreCarrier(model)
    x = torch.randn(4, 3) + rank

    # edge values: any float32 loss and any index below 2**53 arrive exactly, in rank order
    idx = torch.tensor([2**53 - 1 - rank, 2**24 + rank, rank])
    loss = torch.tensor([[float("nan"), 3.0e38, 1e-45], [float("inf"), -float("inf"), 0.25]][rank])
    rows = carrier.post(idx, loss)
    with pytest.raises(RuntimeError, match="after loss.backward"):
        rows()  # read before the backward that carries them: an error, not a hang
    model(x).pow(2).sum().backward()
    plain(x).pow(2).sum().backward()
    out["edge"] = rows()
    out["grads"] = [
        (p.grad.clone(), q.grad.clone()) for p, q in zip(model.parameters(), plain.parameters(), strict=True)
    ]

    # a step that never ran backward: its rows go by an all-gather when the next ones are posted
    first = carrier.post(torch.tensor([10 + rank]), torch.tensor([1.0 + rank]))
    second = carrier.post(torch.tensor([20 + rank]), torch.tensor([3.0 + rank]))
    model(x).sum().backward()
    out["rescued"], out["next"] = first(), second()
    out["counts"] = (carrier.carried_rows, carrier.gathered_rows)

    # a table that blends (EMA) flushes a step's rows at the next store or read, after the backward
    table = ScoreTable(4, ema=0.5)
    exchange = ScoreExchange(table, carrier=carrier)
    for loss in (2.0, 4.0):
        exchange.send(torch.tensor([rank]), torch.tensor([loss + rank]))
        model(x).sum().backward()
    out["ema"] = table.values.clone()

    # the carrier keeps no replica alive: DDP's reducer holds the hook beyond the collector's reach,
    # so a strong reference back would leak the replica past its process group (abort at exit)
    spare = DDP(copy.deepcopy(net))
    alive = weakref.ref(spare)
    ScoreCarrier(spare)
    del spare
    gc.collect()
    out["leaked"] = alive() is not None

    # wrong use: scores over another process group than the model's (refused before any hook)
    other = dist.new_group([0, 1])
    fresh = DDP(copy.deepcopy(net))
    try:
        ScoreExchange(ScoreTable(4), other).carry(fresh)
    except ValueError as e:
        out["group"] = str(e)
    out["fresh_carries"] = ScoreCarrier(fresh) is not None  # the refusal registered nothing

    # once per model: asked again for the model it carries with (a second fit), the same carrier
    again = ScoreExchange(ScoreTable(4))
    twice = DDP(copy.deepcopy(net))
    out["same_carrier"] = again.carry(twice) is again.carry(twice) is again.carrier

    # wrong use: not a DDP model; a model that already has a comm hook
    for bad, err in ((net, TypeError), (model, RuntimeError)):
        try:
            ScoreCarrier(bad)
        except err as e:
            out.setdefault("errors", []).append(str(e))
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def test_any_loss_and_index_arrive_exactly_and_gradients_are_ddps_own():
    runs = _run(_edge_worker)
    for r in runs:
        idx, loss = r["edge"]
        assert idx.dtype == torch.int64 and idx.tolist() == [2**53 - 1, 2**24, 0, 2**53 - 2, 2**24 + 1, 1]
        expect = torch.tensor([float("nan"), 3.0e38, 1e-45, float("inf"), -float("inf"), 0.25])
        torch.testing.assert_close(loss, expect, equal_nan=True, rtol=0, atol=0)
        for g, h in r["grads"]:  # averaged as DDP's default hook averages them
            assert torch.equal(g, h)
        assert [t.tolist() for t in r["rescued"]] == [[10, 11], [1.0, 2.0]]
        assert [t.tolist() for t in r["next"]] == [[20, 21], [3.0, 4.0]]
        assert r["counts"] == (3 + 1, 1)
        assert r["ema"][:2].tolist() == [3.0, 4.0]
        assert not r["leaked"]
        assert (
            "another process group" in r["group"] and r["fresh_carries"]
        )  # 0.5 * first + 0.5 * second, both ranks' rows
        assert r["same_carrier"]
        not_ddp, hooked = r["errors"]
        assert "DistributedDataParallel" in not_ddp and "comm hook" in hooked
