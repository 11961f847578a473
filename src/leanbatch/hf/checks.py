"""What the adapter refuses, at construction, with the argument to change and how.

(And :func:`wrap_train_dataset`, which builds the InfoBatch from ``infobatch=`` settings.)

Each refusal stands for a Trainer or accelerate setting that would make training silently
different from what InfoBatch or Selective Backprop promise (a second sharding, a step-count
schedule that never ends, samples trained twice or never, a loss the weights cannot reach).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.optim.lr_scheduler import ReduceLROnPlateau

from leanbatch.infobatch import InfoBatch
from leanbatch.schedule import ProgressLR
from leanbatch.selection.selective_backprop import SelectiveBackprop
from leanbatch.stream_data import PrunedStream
from leanbatch.streams import StreamInfoBatch

__all__ = ["check_cross_entropy_args", "check_setup", "wrap_train_dataset"]


def wrap_train_dataset(trainer: Any, settings: Any) -> InfoBatch:
    """``InfoBatch(trainer.train_dataset, num_epochs=args.num_train_epochs, shard=False, **settings)``:
    for ``infobatch={...}``, the training set as the trainer's ``__init__`` prepared it."""
    if not isinstance(settings, Mapping):
        raise TypeError(
            f"infobatch must be a dict of InfoBatch settings, e.g. {{'prune_ratio': 0.5, 'delta': 0.875}}, got "
            f"{type(settings).__name__}; or pass train_dataset=InfoBatch(..., shard=False) instead"
        )
    for key in ("num_epochs", "shard", "dataset"):
        if key in settings:
            raise ValueError(f"infobatch={{..., {key!r}: ...}}: the trainer sets {key} itself; leave it out")
    if isinstance(trainer.train_dataset, InfoBatch):
        raise ValueError("train_dataset is already an InfoBatch: pass it or infobatch={...}, not both")
    epochs = trainer.args.num_train_epochs
    if float(epochs) != int(epochs):
        raise ValueError(f"args.num_train_epochs={epochs}: InfoBatch plans whole epochs; use an integer")
    return InfoBatch(trainer.train_dataset, int(epochs), shard=False, **settings)


def check_setup(trainer: Any, infobatch: InfoBatch | None, sb: Any) -> None:
    """Raise a ``ValueError``/``TypeError`` naming the argument and the fix for an unsupported setup.

    Example:
        >>> class Args:  # the few fields read when there is nothing to do
        ...     n_gpu = 1
        >>> class T:
        ...     args = Args()
        >>> try:
        ...     check_setup(T(), None, None)
        ... except ValueError as e:
        ...     print(str(e).split(":")[0])
        nothing to do
    """
    args = trainer.args
    if isinstance(getattr(trainer, "train_dataset", None), (StreamInfoBatch, PrunedStream)):
        raise ValueError(
            "train_dataset: a StreamInfoBatch (or its .dataset) is not driven by the Trainer adapter, whose "
            "loader would drop its key column (remove_unused_columns) and whose epochs are an index's; "
            "train a stream in your own loop with sib.update(loss, keys) (docs/streams.md), or pass a "
            "map-style dataset with infobatch={...}"
        )
    if infobatch is None and sb is None:
        raise ValueError(
            "nothing to do: pass train_dataset=InfoBatch(train_set, num_epochs, ..., shard=False) (InfoBatch or "
            "policy='random' pruning) and/or selective_backprop=SelectiveBackprop(..., scale_factor=1.0)"
        )
    if getattr(args, "n_gpu", 1) > 1:
        raise ValueError(
            f"args.n_gpu={args.n_gpu}: one process driving several GPUs (torch DataParallel) is not supported; "
            "launch one process per GPU with torchrun or accelerate launch"
        )
    if sb is not None:
        _check_selective_backprop(sb)
    if infobatch is not None:
        _check_infobatch(trainer, infobatch)


def _check_selective_backprop(sb: Any) -> None:
    if not isinstance(sb, SelectiveBackprop):
        raise TypeError(f"selective_backprop must be a leanbatch.SelectiveBackprop, got {type(sb).__name__}")
    if sb.scale_factor < 1.0:
        raise ValueError(
            f"SelectiveBackprop(scale_factor={sb.scale_factor}): token inputs cannot be downsampled for the "
            "selection pass; build it with scale_factor=1.0"
        )
    if sb.staleness > 1:
        raise ValueError(
            f"SelectiveBackprop(staleness={sb.staleness}): Stale-SB is not supported by the Trainer adapter; "
            "use staleness=1"
        )


def _check_infobatch(trainer: Any, ds: InfoBatch) -> None:
    args = trainer.args
    if ds.sampler.shard:
        raise ValueError(
            "train_dataset=InfoBatch(..., shard=True): accelerate shards the batches across processes itself, "
            "so the sampler must serve the whole plan on every process; build it with InfoBatch(..., shard=False)"
        )
    if args.max_steps > 0:
        raise ValueError(
            f"args.max_steps={args.max_steps}: InfoBatch plans by epochs (its epochs are shorter than a full "
            "pass); set max_steps=-1 and num_train_epochs to InfoBatch's num_epochs"
        )
    if float(args.num_train_epochs) != float(ds.num_epochs):
        raise ValueError(
            f"args.num_train_epochs={args.num_train_epochs} but InfoBatch(num_epochs={ds.num_epochs}): the "
            "annealing epochs are placed by num_epochs, so the two must be equal"
        )
    if getattr(trainer, "compute_loss_func", None) is not None:  # the loss is the adapter's
        raise ValueError(
            "compute_loss_func: InfoBatch needs per-sequence losses to score and weight, so the adapter "
            "computes the loss itself; drop compute_loss_func"
        )
    check_cross_entropy_args(args, "InfoBatch")
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy != "random":
        raise ValueError(
            f"args.train_sampling_strategy={strategy!r}: the InfoBatch sampler decides the order of every "
            "epoch; leave it at 'random'"
        )
    if args.auto_find_batch_size:
        raise ValueError(
            "args.auto_find_batch_size=True restarts training with the pruning state already advanced; "
            "set per_device_train_batch_size yourself"
        )
    acc = trainer.accelerator
    if not getattr(acc, "even_batches", True):
        raise ValueError(
            "accelerator_config even_batches=False: processes would train different numbers of batches and "
            "the epoch could not be counted; keep even_batches=True"
        )
    if getattr(getattr(acc, "dataloader_config", None), "dispatch_batches", None):
        raise ValueError(
            "accelerator_config dispatch_batches=True: batches are fetched on process 0 and sliced; the "
            "indices that travel with them cannot be; leave dispatch_batches unset"
        )
    sched = getattr(trainer, "lr_scheduler", None)
    if sched is not None and not isinstance(sched, (ProgressLR, ReduceLROnPlateau)):
        raise ValueError(
            f"optimizers=(optimizer, {type(sched).__name__}): a schedule fixed in optimizer steps ends early "
            "once epochs are pruned; pass optimizers=(optimizer, None) and choose args.lr_scheduler_type "
            "(the adapter drives it by training progress), or a leanbatch.ProgressLR"
        )


def check_cross_entropy_args(args: Any, method: str) -> None:
    """Refuse TRL's ``loss_type`` other than ``"nll"`` and label smoothing: ``method`` (InfoBatch,
    token selection) computes the token cross-entropy itself, so either would be silently replaced."""
    loss_type = getattr(args, "loss_type", "nll")  # TRL's SFTConfig
    if loss_type != "nll":
        raise ValueError(
            f"args.loss_type={loss_type!r}: {method} computes each token's cross-entropy itself (TRL's "
            "loss would be silently replaced); set loss_type='nll'"
        )
    if args.label_smoothing_factor != 0:
        raise ValueError(
            f"args.label_smoothing_factor={args.label_smoothing_factor} is not supported with {method} (it "
            "computes the plain cross-entropy itself, so the smoothing would be silently ignored); set it to 0"
        )
