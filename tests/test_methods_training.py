"""Short real training runs on scikit-learn's bundled digits (1,797 8x8 images, no download) with
every new policy, through the InfoBatch wrapper, and with the two forward-free / proxy selection
rules: each trains on fewer samples (or backpropagates fewer) and still learns the task."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import (
    EpsilonGreedyPolicy,
    InfoBatch,
    InfoBatchPolicy,
    ProxyScorer,
    RS2Policy,
    SelectiveBackprop,
    SeTaPolicy,
    UCBPolicy,
)

EPOCHS = 6


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return TensorDataset(x[:1400], y[:1400]), (x[1400:], y[1400:])


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def accuracy(model: nn.Module, test) -> float:
    x, y = test
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


POLICIES = {
    "infobatch-all": lambda: InfoBatchPolicy(0.3, EPOCHS, target="all", warmup_epochs=1),
    "rs2": lambda: RS2Policy(0.5, EPOCHS, seed=0),
    "epsilon-greedy": lambda: EpsilonGreedyPolicy(0.5, EPOCHS),
    "ucb": lambda: UCBPolicy(0.5, EPOCHS),
    "seta": lambda: SeTaPolicy(0.1, EPOCHS, num_groups=5, window_scale=0.9),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_each_policy_trains_on_fewer_samples_to_high_accuracy(digits, name):
    train_set, test = digits
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = InfoBatch(train_set, EPOCHS, seed=0, policy=POLICIES[name]())
    loader = DataLoader(ds, batch_size=64, sampler=ds.sampler)
    trained = 0
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        for x, y in loader:
            loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            trained += len(y)
    assert trained == EPOCHS * 1400 - ds.get_pruned_count() < 0.95 * EPOCHS * 1400
    assert accuracy(model, test) > 0.9


@pytest.mark.parametrize("rule", ["loss_rank", "proxy"])
def test_forward_free_and_proxy_selection_train_on_half_of_each_batch(digits, rule):
    train_set, test = digits
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rule == "loss_rank":
        sb = SelectiveBackprop(
            start=0.0, end=1.0, keep=0.5, interrupt=0, rule="loss_rank", num_samples=1400, seed=0
        )
    else:
        proxy = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
        scorer = ProxyScorer(
            proxy, torch.optim.SGD(proxy.parameters(), lr=0.1, momentum=0.9), F.cross_entropy
        )
        sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, rule="top", scorer=scorer, seed=0)
    x_all, y_all = train_set.tensors
    g = torch.Generator().manual_seed(0)
    for epoch in range(EPOCHS):
        order = torch.randperm(1400, generator=g)
        for i in range(0, 1400, 128):
            idx = order[i : i + 128]
            sel = sb.select(
                (x_all[idx], y_all[idx]), model, progress=epoch / EPOCHS, batch_idx=i, indices=idx
            )
            x, y = sel.batch
            per_sample = F.cross_entropy(model(x), y, reduction="none")
            if rule == "loss_rank":
                sb.record_losses(idx[sel.positions], per_sample.detach())  # the trained rows' losses
            opt.zero_grad()
            per_sample.mean().backward()
            opt.step()
    assert 0.49 < sb.stats.backprop_fraction < 0.51
    assert sb.stats.forwarded == (0 if rule == "loss_rank" else sb.stats.examples)
    assert accuracy(model, test) > 0.9
