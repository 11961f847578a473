"""The new policies under real torch.distributed (gloo, 2 processes): every rank merges the same
scores (the EMA variance too), plans the same epochs and serves its own disjoint shard."""

import os

import torch
import torch.distributed as dist
from test_distributed import WORLD, check_shards, run_ranks
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import EpsilonGreedyPolicy, InfoBatch, InfoBatchPolicy, RS2Policy, SeTaPolicy, UCBPolicy
from leanbatch.distributed import merge_scores

N, EPOCHS = 211, 4


def policies():
    return {
        "infobatch-all": InfoBatchPolicy(0.3, EPOCHS, 0.75, target="all", warmup_epochs=1, max_weight=1.5),
        "rs2": RS2Policy(0.6, EPOCHS, seed=3),
        "epsilon-greedy": EpsilonGreedyPolicy(0.4, EPOCHS, epsilon=0.2),
        "ucb": UCBPolicy(0.4, EPOCHS, c=2.0),
        "seta": SeTaPolicy(0.2, EPOCHS, num_groups=3, window_scale=0.67, delta=0.75),
    }


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
        out = {}
        for name, policy in policies().items():
            ds = InfoBatch(data, EPOCHS, seed=11, policy=policy)
            loader = DataLoader(ds, batch_size=8, sampler=ds.sampler)
            served = []
            for epoch in range(EPOCHS):
                ds.set_epoch(epoch)
                mine = []
                for x, i in loader:
                    mine.extend(i.tolist())
                    # ranks see different losses on purpose; they vary with the epoch (a variance to merge)
                    ds.update(((x * 7919) % 97 / 97 + rank + epoch % 2).requires_grad_())
                served.append(mine)
            merge_scores(ds.scores)
            var = ds.scores.variances.clone() if ds.scores.tracks_variance else None
            out[name] = {
                "served": served,
                "stats": ds.epoch_stats,
                "scores": ds.scores.values.clone(),
                "var": var,
            }
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_new_policies_plan_identically_on_every_rank():
    a, b = run_ranks(_worker)
    for name in policies():
        ra, rb = a[name], b[name]
        assert ra["stats"] == rb["stats"], name  # identical plans (kept, pruned, threshold per epoch)
        # identical tables (NaN where a sample was never kept: equal too)
        torch.testing.assert_close(ra["scores"], rb["scores"], rtol=0, atol=0, equal_nan=True, msg=name)
        if ra["var"] is not None:
            assert torch.equal(ra["var"], rb["var"]) and bool((ra["var"] > 0).any()), name
        assert any(s["pruning"] and s["kept"] < N for s in ra["stats"]), name
        check_shards(ra["stats"], ra["served"], rb["served"])
