"""Real processes for the sharded-scores tests: gloo on CPU, a file rendezvous in a temporary
folder, and a deadline that fails the test instead of hanging it."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 240.0


def spawn(worker: Callable[..., None], world: int, *args: Any, timeout: float = DEADLINE_S) -> list[Any]:
    """Run ``worker(rank, world, init_file, out_dir, *args)`` on ``world`` processes; each rank's
    ``rank{r}.pt``. A process still running after ``timeout`` seconds fails the test."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(
            worker, args=(world, os.path.join(tmp, "init"), tmp, *args), nprocs=world, join=False
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"{world} ranks did not finish in {timeout} s (a collective hangs?)")
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def init(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def done() -> None:
    dist.destroy_process_group()
