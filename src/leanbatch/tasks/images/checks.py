"""The image task's checks before anything trains: batches the model can train under every arm
(BatchNorm's two rows, a selection's smallest batch), budgets that fit the training set, images
large enough. Each refusal is a :class:`~leanbatch.tasks.images.data.DataError` naming the option
and the fix.

Example:
    >>> from types import SimpleNamespace as Fake
    >>> try:
    ...     check_batches(Fake(num_train=10), [], Fake(batch_size=64))
    ... except DataError as e:
    ...     print(e)
    --batch-size 64 is larger than the training set (10 samples)
"""

from __future__ import annotations

from leanbatch.arms.methods import Arm
from leanbatch.engine.running.data import Budget
from leanbatch.engine.running.selecting import smallest_trained
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import DataError, DataSplit, check_image_size
from leanbatch.tasks.images.irreducible import holdout_split

__all__ = ["check_batches"]


def check_batches(data: DataSplit, arms: list[Arm], cfg: TrainConfig) -> bool:
    """Refuse batches the model cannot train; whether a full epoch's last batch of one is left out
    (with BatchNorm in the model, which cannot normalise a single sample), said on the terminal."""
    bs = cfg.batch_size
    if bs > data.num_train:
        raise DataError(f"--batch-size {bs} is larger than the training set ({data.num_train} samples)")
    scales = [a.settings["scale_factor"] for a in arms if "scale_factor" in a.settings]
    check_image_size(data, cfg.resolved_augment(data), scales)
    for arm in arms:
        rows = Budget(batch=arm.batch).rows(bs)
        if arm.batch != 1.0 and not 2 <= rows <= data.num_train:
            raise DataError(
                f"{arm.label}: a batch of round({arm.batch:g} x {bs}) = {rows} rows; a batch budget needs 2 rows "
                f"or more and at most the training set's {data.num_train} (change it or --batch-size)"
            )
        if arm.kind == "rho-loss" and holdout_split(data.y_train, arm.settings["holdout"], 0).numel() < 2:
            raise DataError(
                f"{arm.label}: holdout={arm.settings['holdout']:g} of {data.num_train} samples leaves fewer than 2 "
                "for the holdout model to train on"
            )
    if not cfg.batchnorm(data):
        return False
    if bs == 1:
        raise DataError(
            f"--batch-size {bs}: the model normalises by batch statistics (BatchNorm), which needs 2 rows or more"
        )
    for arm in arms:
        if arm.selects and smallest_trained(arm.probe_selector(), bs) < 2:
            raise DataError(
                f"{arm.label} trains one row of a batch of {bs}, and the model's BatchNorm cannot normalise one: "
                "use a larger --batch-size or keep"
            )
    if data.num_train % bs != 1:
        return False
    print(
        f"leanbatch: note: {data.num_train} training samples in batches of {bs} leave a last batch of one, which "
        "BatchNorm cannot normalise: it is left out of each epoch (results.json: runs[].epochs[].dropped)",
        flush=True,
    )
    return True
