"""What a step's score rows add to a DDP training step: carried in the gradient all-reduce, or by
an all-gather of their own. Run it under torchrun (gloo on CPU, NCCL on GPUs):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/sync_cost.py
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/sync_cost.py --shape 1,28,28

The bench's small CNN on random images of ``--shape`` (CIFAR-10's by default), ``--batch`` rows a
rank. Four arms, each a forward and backward through a DDP model (its all-reduce included), run
``--steps`` times each in a shuffled order, the ranks aligned before every step, each step timed
as its slowest rank's:

- ``ddp``: DDP's own all-reduce, no rows;
- ``gather``: the same, and the rows by :func:`leanbatch.distributed.collectives.gather_step` (started before the
  step, awaited after it): what ``update()`` does without a carrier;
- ``hook``: a model with :class:`leanbatch.distributed.ScoreCarrier` registered, no rows (the hook's
  own cost);
- ``carried``: the same, and the rows posted before the step and read after it.

It prints each arm's median step and the rows' cost (``gather - ddp``, ``carried - hook``, and
``carried - ddp`` with the hook's cost in it), in ms and as a share of the median ``ddp`` step (a
forward and backward only: a whole training step, with the optimizer and the data, is longer, so
the share is an upper bound).
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from leanbatch.distributed import ScoreCarrier
from leanbatch.distributed.collectives import gather_step
from leanbatch.tasks.images.models import SmallCNN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="3,32,32", help="C,H,W of the images (default CIFAR-10's)")
    parser.add_argument("--batch", type=int, default=64, help="rows a rank, a step (default 64)")
    parser.add_argument("--steps", type=int, default=600, help="steps of each arm (default 600)")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    dev = (
        torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        if torch.cuda.is_available()
        else None
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    shape = tuple(int(s) for s in args.shape.split(","))
    base = SmallCNN(shape[0], 10).to(dev or "cpu")
    plain, hooked = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    carrier = ScoreCarrier(hooked)
    x = torch.randn(args.batch, *shape, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    idx, loss = torch.arange(args.batch), torch.rand(args.batch, device=dev)

    def step(net: torch.nn.Module) -> None:
        F.cross_entropy(net(x), y).backward()
        net.zero_grad(set_to_none=True)

    def with_rows(send, net):  # noqa: ANN001, ANN202
        def run() -> None:
            rows = send(idx, loss)
            step(net)
            rows()

        return run

    arms = {
        "ddp": lambda: step(plain),
        "gather": with_rows(gather_step, plain),
        "hook": lambda: step(hooked),
        "carried": with_rows(carrier.post, hooked),
    }
    times = {name: [] for name in arms}
    order = random.Random(0)
    for i in range(args.steps + 10):
        names = list(arms)
        order.shuffle(names)
        for name in names:
            dist.barrier()
            t0 = time.perf_counter()
            arms[name]()
            if dev is not None:
                torch.cuda.synchronize(dev)
            if i >= 10:  # the first rounds warm up
                times[name].append(time.perf_counter() - t0)
    slowest = torch.tensor([times[name] for name in arms], dtype=torch.float64, device=dev) * 1000
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    med = dict(zip(arms, slowest.median(1).values.tolist(), strict=True))
    if dist.get_rank() == 0:
        world, step_ms = dist.get_world_size(), med["ddp"]
        print(
            f"{world} processes, {dist.get_backend()}, images {args.shape}, {args.batch} rows a rank, "
            f"{args.steps} steps an arm (medians of the slowest rank)"
        )
        print("| arm | step ms |\n|---|---:|")
        for name in arms:
            print(f"| {name} | {med[name]:.3f} |")
        print("\n| the rows' cost | ms | share of the ddp step |\n|---|---:|---:|")
        for label, a, b in (
            ("by an all-gather (gather - ddp)", "gather", "ddp"),
            ("carried (carried - hook)", "carried", "hook"),
            ("carried, the hook included (carried - ddp)", "carried", "ddp"),
        ):
            cost = med[a] - med[b]
            print(f"| {label} | {cost:.3f} | {100 * cost / step_ms:.2f}% |")
    arms.clear()  # the DDP replicas die before their process group
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
