"""A Lightning task: a LightningModule trained by a stock ``Trainer.fit``, the arm through its callback::

    leanbatch bench --task examples/lightning_task.py:train --metric val_acc --seeds 0,1,2 \\
        --methods 'baseline,infobatch,sb[scale_factor=1]' --controls

``run.callback(train_set, EPOCHS)`` is the arm's ``LeanBatchCallback`` (InfoBatch with the arm's
policy, or every sample for the others; the arm's Selective Backprop): the module builds its loader
with ``lb.dataloader``, calls ``lb.select`` and returns ``lb.loss`` as ``docs/lightning.md`` shows.
Validation is off the clock, and the value the module logs (``self.log("val_acc", ...)``) after each
validation is the arm's ``run.log``. The data: scikit-learn's bundled 8x8 digits, flattened.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import ProgressLR, cosine

EPOCHS = 6
_digits = load_digits()
_x = torch.tensor(_digits.data, dtype=torch.float32) / 16.0
_y = torch.tensor(_digits.target)
TRAIN, VAL = TensorDataset(_x[:1400], _y[:1400]), TensorDataset(_x[1400:], _y[1400:])


class Classifier(pl.LightningModule):
    def __init__(self, lb, batch_size: int):  # type: ignore[no-untyped-def]
        super().__init__()
        self.lb, self.batch_size = lb, batch_size
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def train_dataloader(self) -> DataLoader:
        return self.lb.dataloader(batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(VAL, batch_size=256)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y, idx = self.lb.select(batch, self.net, batch_idx)  # the hardest rows (Selective Backprop arms)
        return self.lb.loss(F.cross_entropy(self.net(x), y, reduction="none"), idx)

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean() * 100)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": ProgressLR(opt, self.lb, cosine(warmup=0.03)), "interval": "step"},
        }


def train(run) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(run.seed)
    lb = run.callback(TRAIN, EPOCHS, loss_fn=F.cross_entropy)
    module = Classifier(lb, run.batch_size(64))
    trainer = pl.Trainer(
        max_epochs=EPOCHS, callbacks=[lb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu", devices=1,
    )  # fmt: skip
    trainer.fit(module)
    return float(trainer.callback_metrics["val_acc"])
