"""Streams under real torch.distributed processes (gloo on CPU, 2 ranks, one spawn for every check).

Each rank reads its own shard of a Hugging Face stream (``split_dataset_by_node``, whose shards
move between the ranks from one pass to the next) with 2 loader workers. The ranks merge their
scores at each ``set_pass``, so every rank freezes the pass a single process reading the whole
stream freezes, and every sample's fate is the one its (seed, pass, key) gives, whichever rank
reads it. The losses depend on the key only, so the single process's run is the reference.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from datasets import IterableDataset as HFIterableDataset
from datasets.distributed import split_dataset_by_node
from ranks import in_process_group, spawn_ranks
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from leanbatch import StreamInfoBatch

WORLD, N, PASSES, BATCH = 2, 240, 4, 8
SHARDS = [list(range(s, N, 4)) for s in range(4)]  # 4 shards: 2 per rank, 1 per worker


def key(i: int) -> int:
    return 10_000 + 3 * i


def loss_of(k: int) -> float:
    return float((k * 37) % 11) / 4.0  # depends on the sample only


def items(shards):
    for shard in shards:
        for i in shard:
            yield {"id": key(i)}


def hf_shard(rank: int) -> HFIterableDataset:
    """This rank's part of a stream whose shard order is shuffled per pass (set_epoch)."""
    whole = HFIterableDataset.from_generator(items, gen_kwargs={"shards": SHARDS}).shuffle(
        seed=5, buffer_size=1
    )
    return split_dataset_by_node(whole, rank, WORLD)


def train(sib: StreamInfoBatch, batches) -> list[int]:
    seen: list[int] = []
    for batch in batches:
        keys = batch["id"]
        sib.update(torch.tensor([loss_of(int(k)) for k in keys]), keys)
        seen += keys.tolist()
    return seen


def sharded_run(rank: int) -> dict:
    """Passes 0-2 of 4 (0 keeps all: nothing scored yet), a checkpoint in pass 2, then a resumed copy
    finishing pass 2 from it (the annealing pass is the lockstep run's)."""

    def build() -> tuple[StreamInfoBatch, StatefulDataLoader]:
        sib = StreamInfoBatch(hf_shard(rank), PASSES, key="id", delta=0.75, seed=0)
        # workers by fork, as under torchrun (a spawned rank would spawn them: seconds of imports each)
        return sib, StatefulDataLoader(
            sib.dataset, batch_size=BATCH, num_workers=2, multiprocessing_context="fork"
        )

    sib, loader = build()
    kept, stats, saved = [], [], None
    for p in range(3):
        sib.set_pass(p)
        stats.append(sib.stats())
        seen: list[int] = []
        for step, batch in enumerate(loader):
            seen += train(sib, [batch])
            if p == 2 and step == 3:
                saved = {"sib": sib.state_dict(), "loader": loader.state_dict(), "at": len(seen)}
        kept.append(seen)
    end = sib.state_dict()
    del loader
    sib, loader = build()
    assert saved is not None
    sib.load_state_dict(saved["sib"])
    loader.load_state_dict(saved["loader"])
    sib.set_pass(2)  # the pass it is at: nothing to do
    resumed = train(sib, loader)
    return {"kept": kept, "stats": stats, "end": end, "at": saved["at"], "resumed": resumed,
            "resumed_end": sib.state_dict()}  # fmt: skip


def lockstep_run(rank: int) -> dict:
    """A budget of samples (no pass count) with a plain generator of this rank's part, the ranks
    stepping together: per pass as many updates as the rank with the most batches (an empty update
    where a rank has none left, as a rank that ran out still steps), until progress reaches 1."""
    shard = [i for s in SHARDS[rank::WORLD] for i in s]
    sib = StreamInfoBatch(lambda: ({"id": key(i)} for i in shard), key="id", num_samples=700, delta=0.5)
    loader = DataLoader(sib.dataset, batch_size=BATCH)
    empty = {"id": torch.empty(0, dtype=torch.int64)}
    trace, prunes, counts = [], [], []
    for p in range(20):
        sib.set_pass(p)
        prunes.append(sib.current.pruning)
        batches = list(loader)
        counts.append(len(batches))
        steps = torch.tensor(len(batches))
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        for s in range(int(steps)):
            train(sib, [batches[s] if s < len(batches) else empty])
            trace.append((p, s, sib.progress))
            if sib.progress >= 1.0:
                return {"trace": trace, "prunes": prunes, "batches": counts}
    raise AssertionError("the budget was never reached")


def refused(rank: int, **kw) -> str:
    """The error set_pass(1) raises on this rank when the ranks are set up wrongly."""
    shard = kw.pop("shard", True)
    part = [i for s in SHARDS[rank::WORLD] for i in s] if shard else range(N)
    sib = StreamInfoBatch(lambda: ({"id": key(i)} for i in part), PASSES, key="id", **kw)
    train(sib, DataLoader(sib.dataset, batch_size=BATCH))
    try:
        sib.set_pass(1)
    except ValueError as e:
        return str(e)
    return "nothing raised"


def _body(rank: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = {"sharded": sharded_run(rank), "lockstep": lockstep_run(rank)}
    out["seed"] = refused(rank, seed=rank)  # rank 1 built with another seed
    out["both"] = refused(rank, shard=False)  # every rank reads the whole stream
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def single_process_kept() -> tuple[list[set[int]], list[dict]]:
    """What one process reading the whole stream keeps in each pass, and its stats."""
    sib = StreamInfoBatch(lambda: items(SHARDS), PASSES, key="id", delta=0.75, seed=0)
    loader = DataLoader(sib.dataset, batch_size=BATCH)
    kept, stats = [], []
    for p in range(3):
        sib.set_pass(p)
        stats.append(sib.stats())
        kept.append(set(train(sib, loader)))
    return kept, stats


def test_ranks_reading_their_own_shards_decide_as_one_process_and_resume_and_end_together() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (WORLD, os.path.join(tmp, "init"), _body, tmp), WORLD)
        a, b = (torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(WORLD))

    # every sample's fate is the single process's (its seed, pass and key), whichever rank read it
    want, want_stats = single_process_kept()
    x, y = a["sharded"], b["sharded"]
    assert len(want[0]) == N and len(want[1]) < N and len(want[2]) < N  # 2 pruning passes
    for p in range(3):
        assert not set(x["kept"][p]) & set(y["kept"][p])  # no sample read twice
        assert set(x["kept"][p]) | set(y["kept"][p]) == want[p]
        for s in (x["stats"][p], y["stats"][p]):  # the same frozen pass on both ranks, and the process's
            assert (s["threshold"], s["candidates"]) == (
                want_stats[p]["threshold"],
                want_stats[p]["candidates"],
            )
    moved = set(x["kept"][0]) & set(y["kept"][2])
    assert moved  # the shards moved between the ranks: rank 1 decided samples only rank 0 had scored
    # each rank's table holds every rank's scores (merged at set_pass), the single process's
    for end in (x["end"], y["end"]):
        assert end["scores"]["keys"].tolist() == sorted(key(i) for i in range(N))
        assert end["scores"]["values"].tolist() == [loss_of(key(i)) for i in range(N)]

    # per-rank state_dict and loader state: the resumed ranks finish pass 2 as before
    for r in (x, y):
        assert r["resumed"] == r["kept"][2][r["at"] :] and 0 < r["at"] < len(r["kept"][2])
        assert r["resumed_end"]["scores"]["keys"].tolist() == r["end"]["scores"]["keys"].tolist()
        assert r["resumed_end"]["trained"] == r["end"]["trained"]

    # progress is the same on both ranks at every step, so the budget ends on the same step; annealing
    # starts at the same pass
    u, v = a["lockstep"], b["lockstep"]
    assert u["trace"] == v["trace"] and u["prunes"] == v["prunes"]
    assert u["prunes"][1] and not u["prunes"][-1]  # pruned, then annealed
    assert u["batches"] != v["batches"]  # though the ranks' pruned parts made different numbers of batches

    # ranks set up wrongly: the same error on every rank at the first set_pass, not a silent run
    for r in (a, b):
        assert r["seed"].startswith("StreamInfoBatch: rank 1 differs from rank 0 in seed")
        assert "ranks 0 and 1 both trained key 10000 in pass 0" in r["both"]
