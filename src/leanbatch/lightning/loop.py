"""What the adapter reads and sets in Lightning's fit loop (read from Lightning 2.6's source).

Lightning fixes three counts when it sets the train loader up - ``fit_loop.max_batches``
(``trainer.num_training_batches``), the combined loader's ``limits`` and
``trainer.val_check_batch`` - from the loader's length at that moment. With pruning every
epoch has its own length, so the adapter sets them again at every epoch start:

- ``max_batches`` ends the epoch loop (``batch_progress.current.ready == max_batches``) and,
  on a restart, decides whether the saved batch was the epoch's last;
- ``limits`` caps the length the data fetcher reads right after ``iter()``, which decides
  ``is_last_batch`` and so whether a last, partial gradient-accumulation group steps;
- ``val_check_batch`` (from a float ``val_check_interval``) is when validation runs:
  ``(batch_idx + 1) % val_check_batch == 0``, so a pruned epoch shorter than the first one
  would never validate.

At every other place the adapter uses public hooks.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import DataLoader

__all__ = ["batches_done", "set_epoch_length", "train_loader"]


def train_loader(trainer: Any, sampler: Any, dataset: Any) -> DataLoader:
    """The one train DataLoader that draws from ``sampler`` and loads ``dataset``, or a clear error."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    loaders = list(getattr(combined, "flattened", None) or [])
    if len(loaders) != 1 or not isinstance(loaders[0], DataLoader):
        raise RuntimeError(
            "leanbatch needs exactly one train DataLoader (drawing from lb.sampler), got "
            f"{len(loaders)} train loaders: combine other data inside the dataset instead"
        )
    dl = loaders[0]
    drawn = [dl.sampler, getattr(dl.batch_sampler, "sampler", None)]
    if any(
        isinstance(s, DistributedSamplerWrapper) and getattr(s.dataset, "_sampler", None) is sampler
        for s in drawn
    ):
        raise RuntimeError(
            "Lightning replaced the train DataLoader's sampler with a DistributedSamplerWrapper "
            "(Trainer(use_distributed_sampler=True), the default under a distributed strategy): it "
            "reshuffles and re-shards leanbatch's plan and pads it back to a fixed length, so scores would "
            "land on the wrong samples. Set Trainer(use_distributed_sampler=False): lb.sampler already "
            "gives every rank its own shard of the plan"
        )
    if not any(s is sampler for s in drawn):
        raise RuntimeError(
            "the train DataLoader does not draw from lb.sampler: build it with "
            "DataLoader(lb.dataset, sampler=lb.sampler, ...) or lb.dataloader(...)"
        )
    if dl.dataset is not dataset:
        raise RuntimeError(
            "the train DataLoader does not load lb.dataset (the wrapped dataset whose items carry their "
            "index): build it with DataLoader(lb.dataset, sampler=lb.sampler, ...) or lb.dataloader(...)"
        )
    return dl


def batches_done(trainer: Any) -> int:
    """Batches Lightning counts as started in its current epoch (restored from a checkpoint on resume)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)


def set_epoch_length(trainer: Any, num_batches: int, closing: bool = False) -> None:
    """Make Lightning run an epoch of ``num_batches`` batches (``limit_train_batches`` applied).

    ``closing``: Lightning restarts at the end of an epoch that was fully trained before the
    checkpoint; ``num_batches`` is then the batches it counts, so it closes that epoch (and
    skips the validation already run) without drawing another batch.
    """
    fit = trainer.fit_loop
    n = num_batches
    if not closing:
        limit = trainer.limit_train_batches
        n = min(n, limit) if isinstance(limit, int) else int(n * limit)
    fit.max_batches = n
    combined = getattr(fit, "_combined_loader", None)
    if combined is not None:
        combined.limits = [max(n, 1)]
    interval = trainer.val_check_interval
    if getattr(trainer, "_val_check_time_interval", None) is None and isinstance(interval, float):
        trainer.val_check_batch = max(1, n if closing else int(n * interval))
