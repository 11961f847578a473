"""The official InfoBatch example's training loop, with only the import changed.

``examples/cifar_example.py`` of NUS-HPC-AI-Lab/InfoBatch (at ``8bbb012``) never calls
``set_epoch`` outside DDP and rebuilds its ``OneCycleLR`` at the top of every epoch from
``len(trainloader)`` read before iterating; it trains through ``DataParallel`` with a
``GradScaler`` and returns ``trainset.update(loss)`` on a ``reduction='none'`` loss. Its loop is
written here the same way (a small model on sklearn's digits instead of ResNet-18 on CIFAR-100),
beside the README's loop on the same data.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ProgressLR, cosine

EPOCHS = 8  # delta 0.875: epochs 1-6 prune (0 has no scores yet), epoch 7 anneals


def digits() -> tuple[TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    return TensorDataset(x[:1500], y[:1500]), (x[1500:], y[1500:])  # 1500 = 23 x 64 + 28: short last batch


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def accuracy(net: nn.Module, test: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return (net(test[0]).argmax(1) == test[1]).float().mean().item()


def official_loop(num_workers: int = 0) -> tuple[InfoBatch, list[tuple[int, int, int]], float]:
    """The official example's loop; per epoch (len() at its top, batches trained, len() in its log)."""
    train_set, test = digits()
    trainset = InfoBatch(train_set, EPOCHS, 0.5, 0.875)
    trainloader = DataLoader(
        trainset, batch_size=64, shuffle=False, num_workers=num_workers, sampler=trainset.sampler
    )
    net = nn.DataParallel(model())  # on the CPU it calls the module itself
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    epochs = []
    for epoch in range(EPOCHS):
        lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            0.05,
            steps_per_epoch=len(trainloader),
            epochs=EPOCHS,
            div_factor=25,
            final_div_factor=10000,
            pct_start=0.3,
            last_epoch=epoch * len(trainloader) - 1,
        )
        top = len(trainloader)
        train_loss, steps = 0.0, 0
        for inputs, targets in trainloader:
            optimizer.zero_grad()
            with torch.autocast("cpu", enabled=False):
                outputs = net(inputs)
                loss = criterion(outputs, targets)
                loss = trainset.update(loss)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            lr_scheduler.step()
            train_loss += loss.item()
            steps += 1
        round(train_loss / len(trainloader), 4)  # the example's log line divides by it
        epochs.append((top, steps, len(trainloader)))
    return trainset, epochs, accuracy(net, test)


def readme_loop() -> tuple[InfoBatch, float]:
    train_set, test = digits()
    ds = InfoBatch(train_set, EPOCHS, prune_ratio=0.5, delta=0.875, seed=0)
    loader = DataLoader(ds, batch_size=64, sampler=ds.sampler)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = ProgressLR(opt, ds, cosine(warmup=0.03))
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        for x, y in loader:
            loss = ds.update(F.cross_entropy(net(x), y, reduction="none"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    return ds, accuracy(net, test)


def test_the_official_example_loop_trains_every_epoch_with_only_the_import_changed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and says nothing: this loop is right
        trainset, epochs, acc = official_loop()
    batches = [steps for _, steps, _ in epochs]
    stats = trainset.epoch_stats
    assert [s["epoch"] for s in stats] == list(range(EPOCHS))
    assert [s["pruning"] for s in stats] == [False] + [True] * 6 + [False]  # pruned, then annealed
    assert batches[0] == batches[7] == 24 and max(batches[1:7]) < 24
    # The schedule was built from each epoch's own length, read at its top, before iterating.
    assert [top for top, _, _ in epochs] == batches
    # The log line after the loop reads the coming epoch's length (the last epoch keeps its own).
    assert [after for _, _, after in epochs] == batches[1:] + batches[-1:]
    assert trainset.get_pruned_count() == sum(1500 - s["kept"] for s in stats) > 0
    assert trainset.progress == 1.0
    ds, readme_acc = readme_loop()
    assert [s["pruning"] for s in ds.epoch_stats] == [s["pruning"] for s in stats]
    assert acc > 0.85 and readme_acc > 0.85


def test_with_worker_processes_the_official_loop_is_told_at_epoch_1_to_call_set_epoch() -> None:
    """Workers read ahead, so the end of the loop's pass is invisible: the length read at the top of
    epoch 1 is epoch 0's, and the first ``iter()`` of epoch 1 says so (a warning, made an error here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"len\(\) read after epoch 0")
        with pytest.raises(UserWarning, match=r"epoch 1, which begins now.*ds\.set_epoch\(epoch\)"):
            official_loop(num_workers=2)


@pytest.mark.parametrize("n", [64, 70])  # the last batch full, short
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_is_the_coming_epochs_once_the_loop_asks_past_its_trained_end(n: int, drop_last: bool) -> None:
    """Once the loader asks for more after the epoch's last update, ``len()`` is the next epoch's. A
    loader that dropped samples it served (``drop_last`` with a remainder) never trained them, so the
    end stays invisible: the length read then is the finished epoch's, warned at the next epoch."""
    data = TensorDataset(torch.arange(n))
    ds = InfoBatch(data, num_epochs=3, prune_ratio=0.9, delta=0.67, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=ds.sampler, drop_last=drop_last)
    tops, afters = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            tops.append(len(loader))
            for (idx,) in loader:
                ds.update(idx.float() + 1.0)
            afters.append(len(loader))
    kept = [s["kept"] for s in ds.epoch_stats]
    assert kept[0] == kept[2] == n and kept[1] < n  # the epochs differ in length: the check bites
    lengths = [k // 16 if drop_last else -(-k // 16) for k in kept]
    seen = [not (drop_last and k % 16) for k in kept]  # every served sample trained: the end is seen
    assert afters == [lengths[e + 1] if seen[e] else lengths[e] for e in range(2)] + lengths[2:]
    assert tops == lengths[:1] + afters[:2]
    stale = [w for w in caught if "len() read after" in str(w.message)]
    assert len(stale) == int(tops != lengths)


def test_inside_the_last_batch_len_is_still_the_epochs_without_set_epoch() -> None:
    """The ``no_trainer`` idiom (``step == len(loader) - 1`` after update()) in a loop that never
    calls ``set_epoch``."""
    data = TensorDataset(torch.arange(70))
    ds = InfoBatch(data, num_epochs=3, prune_ratio=0.9, delta=0.67, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=ds.sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a right loop: the pass's end is seen, nothing to warn of
        for _ in range(3):
            steps = 0
            for step, (idx,) in enumerate(loader):
                ds.update(idx.float() + 1.0)
                if step % 4 == 3 or step == len(loader) - 1:
                    steps += 1
            assert steps == -(-(step + 1) // 4)
    assert ds.progress == 1.0
