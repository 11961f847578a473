"""The ``leanbatch bench`` checks that need the data and the rows: batches the model can train under
every row (BatchNorm's two rows, torchrun's equal shares, a selection's smallest batch), and budget
rows that fit the training set. Each refusal is a :class:`~leanbatch.cli_args.CLIError` naming the
option and the fix. Torch loads inside these functions, never at import.

Example:
    >>> from types import SimpleNamespace as Fake
    >>> from leanbatch.bench.world import ALONE
    >>> try:
    ...     check_batches(Fake(num_train=10), [], Fake(batch_size=64), ALONE)
    ... except CLIError as e:
    ...     print(e)
    --batch-size 64 is larger than the training set (10 samples)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from leanbatch.cli_args import CLIError

if TYPE_CHECKING:  # torch loads inside the functions: these are for the types only
    from leanbatch.bench.config import TrainConfig
    from leanbatch.bench.data import DataSplit
    from leanbatch.bench.methods import MethodRow
    from leanbatch.bench.world import World

__all__ = ["check_batches", "check_budget_rows"]


def check_batches(data: DataSplit, rows: list[MethodRow], cfg: TrainConfig, world: World) -> bool:
    """Refuse batches the model cannot train; whether a full epoch's last batch of one is left out
    (with BatchNorm in the model, which cannot normalise a single sample), said on the terminal.
    Under torchrun each rank trains ``batch_size / world`` rows of a step, which must divide."""
    from leanbatch.bench.data import check_image_size
    from leanbatch.bench.selecting import smallest_trained

    bs, w = cfg.batch_size, world.size
    if bs > data.num_train:
        raise CLIError(f"--batch-size {bs} is larger than the training set ({data.num_train} samples)")
    if bs % w:
        raise CLIError(
            f"--batch-size {bs} does not split into {w} equal shares, one per torchrun process: use a multiple of {w}"
        )
    scales = [r.settings["scale_factor"] for r in rows if "scale_factor" in r.settings]
    check_image_size(data, cfg.resolved_augment(data), scales)
    check_budget_rows(data, rows, bs)
    if not cfg.batchnorm(data):
        return False
    local, share = bs // w, world.share(data.num_train)
    per_rank = f" ({w} processes: {local} rows each)" if w > 1 else ""
    if local == 1:
        raise CLIError(
            f"--batch-size {bs}{per_rank}: the model normalises by batch statistics (BatchNorm), which needs 2 rows or more"
        )
    for row in rows:
        if row.selects and smallest_trained(row.probe_selector(), local) < 2:
            raise CLIError(
                f"{row.label} trains one row of a batch of {local}{per_rank}, and the model's BatchNorm cannot "
                "normalise one: use a larger --batch-size or keep"
            )
        if row.batch != 1.0 and world.local(cfg.at_batch(row.batch)).batch_size < 2:
            raise CLIError(
                f"{row.label}: fewer than 2 rows per process{per_rank}, which BatchNorm cannot normalise"
            )
    if share % local != 1:
        return False
    print(
        f"leanbatch: note: {share} training samples in batches of {local}{per_rank} leave a last batch of one, which "
        "BatchNorm cannot normalise: it is left out of each epoch (results.json: runs[].epochs[].dropped)",
        flush=True,
    )
    return True


def check_budget_rows(data: DataSplit, rows: list[MethodRow], bs: int) -> None:
    """Refuse a batch budget of fewer than 2 rows or more than the training set, and a rho-loss
    holdout of fewer than 2 samples."""
    from leanbatch.bench.config import batch_rows
    from leanbatch.bench.irreducible import holdout_split

    for row in rows:
        if row.batch != 1.0 and not 2 <= (n := batch_rows(row.batch, bs)) <= data.num_train:
            raise CLIError(
                f"{row.label}: a batch of round({row.batch:g} x {bs}) = {n} rows; a batch budget needs 2 rows "
                f"or more and at most the training set's {data.num_train} (change it or --batch-size)"
            )
        if row.kind == "rho-loss" and holdout_split(data.y_train, row.settings["holdout"], 0).numel() < 2:
            raise CLIError(
                f"{row.label}: holdout={row.settings['holdout']:g} of {data.num_train} samples leaves fewer than 2 "
                "for the holdout model to train on"
            )
