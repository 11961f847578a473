"""Selection under real torch.distributed processes (gloo on CPU): every rank draws its own
pattern, reproducibly from (seed, rank, step), and a checkpoint from one rank resumes another."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from ranks import spawn_ranks

from leanbatch import SelectiveBackprop, select_using_loss
from leanbatch.rng import DEFAULT_SEED
from leanbatch.selection.rules import seed_selection

WORLD, STEPS, N, SEED = 2, 50, 32, 11


def loss_of_value(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return out[:, 0]  # the input is the loss: identical losses on every rank


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(N, 1, generator=torch.Generator().manual_seed(0)), torch.arange(N)  # target: row ids


def make_sb(rank: int | None = None) -> SelectiveBackprop:
    return SelectiveBackprop(
        start=0.0,
        end=1.0,
        keep=0.5,
        scale_factor=1.0,
        interrupt=0,
        loss_fn=loss_of_value,
        seed=SEED,
        rank=rank,
    )


def run_steps(sb: SelectiveBackprop, steps: range) -> list[torch.Tensor]:
    out = []
    for t in steps:
        positions = sb.select(batch(), nn.Identity(), progress=0.5, batch_idx=t).positions
        assert positions is not None
        out.append(positions)
    return out


def run_functional(steps: int) -> list[torch.Tensor]:
    x, y = batch()
    return [select_using_loss(x, y, nn.Identity(), loss_of_value, keep=0.5)[1] for _ in range(steps)]


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    sb = make_sb()  # built before the process group exists, as Lightning builds its objects
    early = run_functional(1)  # the module's default generator is first used before the group exists too
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        x, _ = batch()
        same = [torch.zeros(1) for _ in range(WORLD)]
        dist.all_gather(same, x.sum().reshape(1))
        assert all(torch.equal(s, same[0]) for s in same)  # the ranks really see identical losses
        first = run_steps(sb, range(STEPS // 2))
        state = sb.state_dict()
        second = run_steps(sb, range(STEPS // 2, STEPS))
        torch.save(
            {
                "sb": torch.stack(first + second),
                "state": state,
                "functional": torch.stack(early + run_functional(STEPS)),
            },
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_draw_their_own_patterns_reproducibly_and_resume_from_any_rank() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(_worker, (os.path.join(tmp, "init"), tmp), WORLD)
        runs = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]
    a, b = runs
    # identical losses on both ranks, yet the kept positions differ on (essentially) every step
    differ = sum(not torch.equal(pa, pb) for pa, pb in zip(a["sb"], b["sb"], strict=True))
    assert differ >= STEPS - 2, differ
    # each rank's draws are reproducible from (seed, rank, step): a fresh process, no process group,
    # the explicit rank= gives the same 50 draws as the rank read lazily from torch.distributed
    for r, run in enumerate(runs):
        assert torch.equal(torch.stack(run_steps(make_sb(rank=r), range(STEPS))), run["sb"])
    # rank 0's checkpoint, loaded on rank 1, continues rank 1's own draws (not rank 0's)
    assert a["state"] == b["state"]  # the state does not depend on the rank
    resumed = make_sb(rank=1)
    resumed.load_state_dict(a["state"])
    assert torch.equal(torch.stack(run_steps(resumed, range(STEPS // 2, STEPS))), b["sb"][STEPS // 2 :])

    # select_using_loss without generator= (module-level default generators): same independence
    fa, fb = a["functional"][1:], b["functional"][1:]
    assert sum(not torch.equal(p, q) for p, q in zip(fa, fb, strict=True)) >= STEPS - 2
    try:
        for r, run in enumerate(runs):
            seed_selection(DEFAULT_SEED, rank=r)
            # rank 0 kept its pre-group stream (its rank did not change); rank 1 was reseeded for rank 1
            replay = run_functional(STEPS + 1)[1:] if r == 0 else run_functional(STEPS)
            assert torch.equal(torch.stack(replay), run["functional"][1:])
    finally:
        seed_selection(DEFAULT_SEED)
