"""The bench under ``torchrun``: the data-parallel world a run trains in, and what it shares.

``torchrun --nproc_per_node=W -m leanbatch bench ...`` starts ``W`` processes that run the same
comparison as one process would, with the same tables and results.json (written by rank 0):

- every step trains one global batch of ``--batch-size`` rows, ``batch_size / W`` on each rank,
  the model wrapped in ``DistributedDataParallel`` (gradients averaged, so a step's update is the
  one process's, up to the order of floating-point sums);
- a pruning row serves each rank its shard of the plan through the library's sampler, and
  :meth:`~leanbatch.InfoBatch.update` shares every rank's scores at every step, as in a user's
  DDP loop: the rows ride DDP's gradient all-reduce (:meth:`~leanbatch.InfoBatch.carry_scores`);
  the other rows shuffle one permutation and deal it out the same way (rank ``r`` takes
  positions ``r, r + W, ...``), so a step's ``W`` local batches are one process's global batch;
- the counts of an epoch are summed over the ranks, its time is the slowest rank's, and the test
  split is evaluated in ``W`` slices, summed.

:class:`World` is that world: ``World()`` is one process (every method a no-op), which is what
the bench is without torchrun.

Example:
    >>> import torch
    >>> w = World()
    >>> w.size, w.main, w.shard(torch.arange(5)).tolist(), w.sum([1.0, 2.0])
    (1, True, [0, 1, 2, 3, 4], [1.0, 2.0])
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn

from leanbatch.bench.config import TrainConfig
from leanbatch.rng import gather_step

if TYPE_CHECKING:
    from leanbatch.carrier import ScoreCarrier

__all__ = ["ALONE", "World"]


@dataclass(frozen=True)
class World:
    """``size`` processes, this one ``rank`` (one process: ``World()``)."""

    size: int = 1
    rank: int = 0

    @classmethod
    def from_env(cls, device: str = "cpu") -> World:
        """The world torchrun started (``WORLD_SIZE``/``RANK`` in the environment), its process group
        initialised (gloo on CPU, NCCL on CUDA); one process without torchrun.

        Example:
            >>> World.from_env() if "WORLD_SIZE" not in os.environ else World()
            World(size=1, rank=0)
        """
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size <= 1:
            return cls()
        if not dist.is_initialized():
            cuda = torch.device(device).type == "cuda"
            if cuda:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(dist.get_world_size(), dist.get_rank())

    @property
    def main(self) -> bool:
        """This process prints and writes the results (rank 0)."""
        return self.rank == 0

    def local(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with each rank's share of a global batch: ``round(batch_size / size)`` rows (the
        bench checks that the full batch divides; a batch budget's batch is rounded to whole rows
        per rank)."""
        if self.size == 1:
            return cfg
        return replace(cfg, batch_size=max(1, round(cfg.batch_size / self.size)))

    def share(self, n: int) -> int:
        """Samples each rank serves of ``n`` dealt out in turn (the last round padded)."""
        return math.ceil(n / self.size)

    def shard(self, order: Tensor) -> Tensor:
        """This rank's positions ``rank, rank + size, ...`` of ``order``, wrapped to equal shards."""
        if self.size == 1:
            return order
        padded = torch.cat([order, order[: self.share(order.numel()) * self.size - order.numel()]])
        return padded[self.rank :: self.size]

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in ``DistributedDataParallel`` (its gradients averaged over the ranks); itself alone."""
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over the ranks (one collective, float64)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        """The largest of each of ``values`` over the ranks (one collective, float64)."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
        if self.size == 1:
            return list(values)
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def time_gather(self, rows: int, repeats: int = 50) -> float:
        """Seconds of one step's score gather of ``rows`` rows a rank (the all-gather of
        :meth:`~leanbatch.InfoBatch.update`, :func:`~leanbatch.rng.gather_step`, started and waited
        for at once: none of it overlapped), the ranks aligned first: the collective alone, without
        the wait for a slower rank (0 alone). The slowest rank's mean over ``repeats``.
        """
        if self.size == 1:
            return 0.0
        indices, scores = torch.zeros(rows, dtype=torch.int64), torch.zeros(rows)
        self.barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            gather_step(indices, scores)()
        (elapsed,) = self.max([time.perf_counter() - t0])  # NCCL: max reads the result, so it waits
        return elapsed / repeats

    def time_overlap(
        self, step: Callable[[], object], rows: int, carrier: ScoreCarrier | None = None, pairs: int = 200
    ) -> float:
        """Seconds one step's score rows (``rows`` a rank) add to a training ``step`` (a forward and
        backward through the DDP model, its all-reduce included) when they travel as in training:
        inside the all-reduce by ``carrier``, else by the all-gather of
        :func:`~leanbatch.rng.gather_step`, started before the step; awaited after it.

        ``step`` runs ``pairs`` times alone and as many times with the rows, in the order alone,
        with, with, alone (so neither arm always follows the other), the ranks aligned before
        each; each run counts as its slowest rank's time, and the result is the difference of the
        two arms' medians (robust to the stalls two processes on two cores meet; within noise it
        can come out below 0). 0 alone.
        """
        if self.size == 1:
            return 0.0
        send = gather_step if carrier is None else carrier.post
        indices, scores = torch.zeros(rows, dtype=torch.int64), torch.zeros(rows)
        with_rows = [(i + i // 2) % 2 == 1 for i in range(2 * pairs)]
        times = []
        for sends in with_rows:
            self.barrier()
            t0 = time.perf_counter()
            result = send(indices, scores) if sends else None
            step()
            if result is not None:
                result()
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(self.max(times), dtype=torch.float64)
        arm = torch.tensor(with_rows)
        return float(slowest[arm].median() - slowest[~arm].median())

    def check_same(self, model: nn.Module, what: str) -> None:
        """``RuntimeError`` unless ``model``'s parameters agree on every rank (a float64 checksum compared
        by one collective): data-parallel replicas that drifted apart would make the results wrong."""
        if self.size == 1:
            return
        with torch.no_grad():
            total = sum(float(p.double().sum()) for p in model.parameters())
        high, neg_low = self.max([total, -total])
        if high != -neg_low:
            raise RuntimeError(
                f"{what}: the model's parameters differ between ranks ({-neg_low!r} to {high!r})"
            )

    def barrier(self) -> None:
        """Wait for every rank (nothing alone)."""
        if self.size > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group this world started (nothing alone), every rank together, after
        collecting the DDP replicas left in reference cycles: a replica's reducer destroyed after
        its process group aborted the process at exit (``terminate called without an active
        exception``, about one run in two)."""
        if self.size > 1 and dist.is_initialized():
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()


ALONE = World()  # one process: the bench without torchrun
