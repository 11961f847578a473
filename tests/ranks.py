"""Start real processes for a distributed test, and fail the test (not hang it) if they outlive a deadline."""

from __future__ import annotations

import datetime
import gc
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE = 240.0  # seconds: far above any of these tests' run, far below a CI job's limit


def spawn_ranks(
    worker: Callable[..., None], args: tuple[Any, ...], nprocs: int, deadline: float = DEADLINE
) -> None:
    """``worker(rank, *args)`` on ``nprocs`` processes; an error in one is raised here, and processes
    still running after ``deadline`` seconds (a collective that never completes) fail the test."""
    ctx = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    end = time.monotonic() + deadline
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > end:
                pytest.fail(f"the ranks still ran after {deadline} s: a collective hangs")
    finally:
        for p in ctx.processes:  # only the processes this test started
            if p.is_alive():
                p.kill()


def in_process_group(rank: int, world: int, init_file: str, body: Callable[..., None], *args: Any) -> None:
    """Spawn target: ``body(rank, *args)`` inside a gloo group of ``world`` processes, left the way
    ``World.close`` leaves it. ``body``'s locals (a DDP reducer, FSDP's hooks) die when it returns and
    ``gc.collect`` takes those in reference cycles while the group still lives: one destroyed after its
    group aborts the process at exit (``terminate called without an active exception``)."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),  # a collective nobody joins errors instead of hanging
    )
    try:
        body(rank, *args)
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


class CountedGathers:
    """While installed (``with CountedGathers() as g``): torch's all-gather into one tensor (both
    spellings are the same collective), counting its calls and the waits on their work."""

    def __init__(self) -> None:
        self.name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
        self.gather, self.calls, self.waited = getattr(dist, self.name), 0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        work = self.gather(*args, **kwargs)
        counter = self

        class Work:
            def wait(self) -> bool:
                counter.waited += 1
                return work.wait() if work is not None else True

        return Work()

    def __enter__(self) -> CountedGathers:
        setattr(dist, self.name, self)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(dist, self.name, self.gather)
