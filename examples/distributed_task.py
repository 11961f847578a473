"""A distributed task: the same loop under torch.distributed (DDP, gloo on CPU, nccl on GPUs).

Each arm of a big study is a real training job. Run one ``torchrun`` job per arm (or per seed),
on as many machines as you have, each into its own folder, then merge the parts::

    torchrun --nproc_per_node=2 -m leanbatch bench --task examples/distributed_task.py:train \\
        --methods baseline --budgets 0.5,1 --batch-budgets 0.5 --seeds 0,1,2 --out part-baselines
    torchrun --nproc_per_node=2 -m leanbatch bench --task examples/distributed_task.py:train \\
        --methods infobatch --budgets none --batch-budgets none --seeds 0,1,2 --out part-infobatch
    leanbatch report part-baselines part-infobatch --out study

Every process runs the same arms in the same turns; the first (``RANK`` 0) prints and writes. The
arm's data shards itself across the processes (InfoBatch's sampler, or every sample's order dealt
out ``rank, rank + world, ...``); its counts, the budgets and the work fractions are per process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import ProgressLR, cosine

EPOCHS = 4
_g = torch.Generator().manual_seed(0)
_x = torch.randn(2400, 16, generator=_g)
_y = (_x[:, :5].argmax(1) + (torch.rand(2400, generator=_g) < 0.1).long()) % 5
TRAIN, X_TEST, Y_TEST = TensorDataset(_x[:2000], _y[:2000]), _x[2000:], _y[2000:]


def train(run) -> float:  # type: ignore[no-untyped-def]
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # torchrun set the rendezvous in the environment
    torch.manual_seed(run.seed)  # the same initial weights on every process
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = run.wrap(TRAIN, EPOCHS)
    loader = DataLoader(ds, batch_size=run.batch_size(32), sampler=ds.sampler)
    sched = ProgressLR(opt, ds, cosine(warmup=0.05))
    acc = 0.0
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, y in loader:
            loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        with run.untimed(), torch.no_grad():
            acc = float((net(X_TEST).argmax(1) == Y_TEST).float().mean()) * 100
        run.log(epoch=epoch, accuracy=acc)
    return acc
