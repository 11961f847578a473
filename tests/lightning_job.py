"""A tiny Lightning fit whose losses identify their samples, shared by the Lightning tests.

Also a script: ``python tests/lightning_job.py OUT_DIR [options]`` runs the same fit under
``strategy="ddp"`` on 2 CPU processes (Lightning launches the second one by re-running this
script) and saves what each rank trained to ``OUT_DIR/rank{r}.pt``.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N, EPOCHS, BS = 240, 4, 16


def identity_loss(x: torch.Tensor, epoch: int) -> torch.Tensor:
    """A per-sample loss that names its sample (x[:, 0] is the index) and changes every epoch."""
    return torch.sin(x[:, 0] * (epoch + 1)).abs() + 0.01


def make_data(n: int = N) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(n, dtype=torch.float32)
    x = torch.stack([ids, torch.randn(n, generator=g)], 1)
    return TensorDataset(x, torch.arange(n) % 3)


def quiet() -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*is smaller than the logging interval.*")
    warnings.filterwarnings("ignore", ".*Checkpoint directory.*exists and is not empty.*")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)


def make_module(
    lb: Any, *, loss: str = "identity", workers: int = 0, val: bool = False, lr: float = 0.05
) -> Any:
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(2, 3)
            self.lb = lb
            self.rows: list[tuple] = []  # (epoch, batch_idx, batch indices, trained indices, returned loss)
            self.steps_at_epoch_end: list[int] = []
            self.grads_at_epoch_start: list[float] = []
            self.val_runs = 0

        def train_dataloader(self) -> DataLoader:
            return self.lb.dataloader(batch_size=BS, num_workers=workers, persistent_workers=workers > 0)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(make_data(32), batch_size=16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x / N)

        def per_sample(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = self(x)
            if loss == "identity":
                return identity_loss(x, self.current_epoch) + 0.0 * out.sum(1)
            return F.cross_entropy(out, y, reduction="none")

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            full = batch[-1].tolist()
            if self.lb.selective_backprop is not None:
                batch = self.lb.select(batch, self, batch_idx, loss_fn=self.sb_loss)
            x, y, idx = batch
            out = self.lb.loss(self.per_sample(x, y), idx)
            kept = idx.tolist()
            self.rows.append((self.current_epoch, batch_idx, full, kept, round(float(out.detach()), 6)))
            return out

        def sb_loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "none") -> torch.Tensor:
            return F.cross_entropy(out, y, reduction=reduction)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                self.val_runs += 1

        def on_train_epoch_start(self) -> None:
            grads = [p.grad.abs().sum().item() for p in self.parameters() if p.grad is not None]
            self.grads_at_epoch_start.append(sum(grads))

        def on_train_epoch_end(self) -> None:
            self.steps_at_epoch_end.append(self.trainer.global_step)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9)

    if not val:  # Lightning validates only when these are overridden
        Tiny.val_dataloader = pl.LightningModule.val_dataloader  # type: ignore[method-assign]
        Tiny.validation_step = pl.LightningModule.validation_step  # type: ignore[method-assign]
    return Tiny()


def make_trainer(callbacks: list, tmp: str | None = None, **kw: Any) -> Any:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    args: dict[str, Any] = dict(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp,
    )
    args.update(kw)
    if any(isinstance(c, ModelCheckpoint) for c in callbacks):
        args["enable_checkpointing"] = True
    return pl.Trainer(callbacks=callbacks, **args)


def ddp_main(out_dir: str, resume: str | None = None, carry: bool = False) -> None:
    """Both methods stacked under ``strategy="ddp"``, 2 CPU processes (gloo); one file per rank.

    Losses name their sample and the rank that trained it (``identity_loss + rank``), and the
    selection losses are all equal, so which rows Selective Backprop keeps is its random draw
    alone: equal on two ranks only if they drew the same numbers. A checkpoint is saved after
    every step (rank 0 writes it; saving merges the ranks' scores); with ``resume`` the fit
    resumes from one and saves on the same schedule. ``carry``: the scores ride DDP's gradient
    all-reduce (``carry_scores=True``) instead of each step's all-gather.
    """
    import os

    import torch.distributed as dist
    from lightning.pytorch.callbacks import ModelCheckpoint

    from leanbatch import InfoBatch, SelectiveBackprop
    from leanbatch.lightning import LeanBatchCallback

    quiet()
    torch.set_num_threads(1)
    n = 203  # odd: the plans of pruned epochs are padded to equal shards that end on a short batch
    ib = InfoBatch(make_data(n), EPOCHS, prune_ratio=0.5, delta=0.75, seed=5)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0, seed=3)
    lb = LeanBatchCallback(ib, sb, carry_scores=carry)
    module = make_module(lb, loss="identity")
    module.sb_loss = lambda out, y, reduction="none": 0.0 * out.sum(1)  # ties: the draw decides
    scores: list[torch.Tensor] = []
    per_sample = module.per_sample
    module.per_sample = lambda x, y: per_sample(x, y) + float(dist.get_rank())
    module.on_train_epoch_end = lambda: scores.append(ib.scores.values.clone())
    saves = os.path.join(out_dir, "resumed" if resume else "saved")
    saver = ModelCheckpoint(dirpath=saves, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    trainer = make_trainer([lb, saver], strategy="ddp", devices=2, use_distributed_sampler=False)
    trainer.fit(module, ckpt_path=resume)
    torch.save(
        {
            "rows": module.rows,
            "scores": scores,
            "stats": ib.epoch_stats,
            "world": trainer.world_size,
            "carried": None if (c := lb.score_carrier) is None else (c.carried_rows, c.gathered_rows),
        },
        os.path.join(out_dir, f"{'resumed' if resume else 'rank'}{trainer.global_rank}.pt"),
    )


def record_collectives(strategy: Any) -> list[str]:
    """The Lightning strategy's reduces and barriers, in order: ``log-sync`` for a reduce that syncs
    a logged value (called from Lightning's logger connector), ``reduce`` for any other."""
    import traceback

    events: list[str] = []
    reduce, barrier = strategy.reduce, strategy.barrier

    def reduced(*args: Any, **kwargs: Any) -> Any:
        logging = any("logger_connector" in f.filename for f in traceback.extract_stack())
        events.append("log-sync" if logging else "reduce")
        return reduce(*args, **kwargs)

    def barred(name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        events.append(f"barrier:{name}")
        return barrier(name, *args, **kwargs)

    strategy.reduce, strategy.barrier = reduced, barred
    return events


def world_main(out_dir: str, devices: int, resume: str | None = None) -> None:
    """InfoBatch under ``strategy="ddp"`` on ``devices`` CPU processes, a rank-independent loss, a
    checkpoint after every step: for resuming a run saved on one number of processes on another."""
    import os

    from lightning.pytorch.callbacks import ModelCheckpoint

    from leanbatch import InfoBatch
    from leanbatch.lightning import LeanBatchCallback

    quiet()
    torch.set_num_threads(1)
    ib = InfoBatch(make_data(203), EPOCHS, prune_ratio=0.5, delta=0.75, seed=5)
    lb = LeanBatchCallback(ib)
    module = make_module(lb, loss="identity")
    tag = f"w{devices}" + ("r" if resume else "")
    saver = ModelCheckpoint(
        dirpath=os.path.join(out_dir, tag), filename="{step}", every_n_train_steps=1, save_top_k=-1
    )
    trainer = make_trainer([lb, saver], strategy="ddp", devices=devices, use_distributed_sampler=False)
    collectives = record_collectives(trainer.strategy)
    trainer.fit(module, ckpt_path=resume)
    torch.save(
        {
            "rows": module.rows,
            "stats": ib.epoch_stats,
            "scores": ib.scores.values.clone(),
            "progress": lb.progress,
            "collectives": collectives,
        },
        os.path.join(out_dir, f"{tag}-{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    if sys.argv[1] == "world":
        world_main(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        args = [a for a in sys.argv[1:] if a != "--carry"]
        ddp_main(args[0], args[1] if len(args) > 1 else None, carry="--carry" in sys.argv)
