"""Runs of one seed: :func:`train_run` trains one method row, :func:`train_interleaved` several
side by side, an epoch of each in turn (each a :class:`~leanbatch.bench.train.Trainer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.data import DataSplit
from leanbatch.bench.methods import MethodRow
from leanbatch.bench.records import RunResult
from leanbatch.bench.train import Trainer
from leanbatch.bench.world import ALONE, World

__all__ = ["train_interleaved", "train_run"]


def train_run(
    data: DataSplit,
    row: MethodRow,
    seed: int,
    cfg: TrainConfig,
    progress_bar: Callable[..., Any] | None = None,
    world: World = ALONE,
) -> RunResult:
    """Train one fresh model with ``row`` and ``seed``; evaluate after every epoch.

    ``progress_bar(total=..., desc=...)`` makes a tqdm-like bar (``update``, ``set_postfix_str``,
    ``close``); None shows nothing. A ``KeyboardInterrupt`` propagates: the run is discarded.

    Example:
        >>> from leanbatch.bench.data import load_data
        >>> from leanbatch.bench.methods import parse_methods
        >>> run = train_run(load_data("digits", 64, 16), parse_methods("sb")[0], 0, TrainConfig(epochs=2, batch_size=16, widths=(4,)))
        >>> len(run.epochs), run.totals()["backward_fraction"] < 1.0
        (2, True)
        >>> import torch; torch.set_flush_denormal(False)
        True
    """
    return train_interleaved(data, [row], seed, cfg, progress_bar, world)[0]


def train_interleaved(
    data: DataSplit,
    rows: list[MethodRow],
    seed: int,
    cfg: TrainConfig,
    progress_bar: Callable[..., Any] | None = None,
    world: World = ALONE,
) -> list[RunResult]:
    """Train one run per row at ``seed``, alternating between them epoch by epoch.

    On a machine that also runs other work, a slow spell then slows every method alike instead
    of the one that happened to be running. Results are those of separate runs.

    Runs of different lengths (budget baselines) are spread over the same span: the next epoch
    always goes to the run whose next epoch is the least far along its own training (by the
    middle of that epoch, as a fraction of the run's length), so a run half as long trains about
    every other round, from the start of the seed to its end, instead of all of its epochs
    first; with equal lengths this is plain round-robin in the given order. Under torchrun
    (``world``, :mod:`~leanbatch.bench.world`) every rank trains the same sequence of epochs.

    Example:
        >>> from leanbatch.bench.data import load_data
        >>> from leanbatch.bench.methods import parse_methods
        >>> rows = parse_methods("baseline,baseline[budget=0.5],random")
        >>> runs = train_interleaved(load_data("digits", 64, 16), rows, 0, TrainConfig(epochs=2, batch_size=16, widths=(4,)))
        >>> [(r.label, sum(e.steps for e in r.epochs)) for r in runs]
        [('baseline', 8), ('baseline[budget=0.5]', 4), ('random', 8)]
        >>> import torch; torch.set_flush_denormal(False)
        True
    """
    trainers = [Trainer(data, row, seed, cfg, world) for row in rows]
    bars = [
        progress_bar(total=t.num_epochs, desc=f"{t.row.label} seed {seed}", position=k)
        if progress_bar
        else None
        for k, t in enumerate(trainers)
    ]
    try:
        while not all(t.done for t in trainers):
            k = min(
                (k for k, t in enumerate(trainers) if not t.done), key=lambda k: trainers[k].next_midpoint
            )
            bar = bars[k]
            rec = trainers[k].run_epoch(None if bar is None else bar.update)
            if bar is not None:
                bar.set_postfix_str(f"acc {rec.test_acc:.2f}%")
    finally:
        for bar in bars:
            if bar is not None:
                bar.close()
    return [t.result() for t in trainers]
