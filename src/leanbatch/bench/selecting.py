"""Batch-level selection in the benchmark loop: the row's selector, and what the loop asks of it.

:class:`Selection` is what :class:`~leanbatch.bench.train.Trainer` calls on every batch of a
selecting row (``sb``, ``infobatch+sb``, ``obs``, ``sb-proxy``). The selector itself is the
library's, built by the registry (:mod:`leanbatch.bench.registry`) from the row's settings.

>>> from leanbatch.bench.data import load_data
>>> from leanbatch.bench.methods import parse_methods
>>> sel = Selection(parse_methods("sb")[0], 0, load_data("digits", 64, 16), TrainConfig())
>>> sel.forwards, sel.memory
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.data import DataSplit
from leanbatch.bench.irreducible import train_irreducible
from leanbatch.bench.methods import MethodRow
from leanbatch.bench.registry import SelectorContext
from leanbatch.selection import MemoryScores, ProxyScorer, ScorerScores, Selector, num_selected

__all__ = ["Picked", "Selection", "smallest_trained"]


class Picked(NamedTuple):
    """The rows of a batch a selection kept: their inputs and targets, their positions in the batch,
    and the selection's loss of every row of the batch (``None`` when it scores none).

    Example:
        >>> import torch
        >>> Picked(torch.zeros(2, 3), torch.zeros(2), torch.tensor([0, 3]), None).positions.tolist()
        [0, 3]
    """

    x: Tensor
    y: Tensor
    positions: Tensor
    losses: Tensor | None


class Selection:
    """The row's selector, as the loop calls it: decides per batch and picks the rows to train on.

    ``forwards``: selection runs a scoring forward of its own (the model downsampled, or a proxy),
    counted in the work; ``memory``: it ranks by the last trained losses, which :meth:`record`
    stores; ``setup``: what a holdout model trained here cost (``rho-loss``:
    :func:`~leanbatch.bench.irreducible.train_irreducible`), else None. A proxy model (``sb-proxy``) is built here with the main run's optimiser settings and
    follows its learning rate. With BatchNorm in the model, a batch on which selection would train
    a single row (of the model or of the proxy) trains in full instead: BatchNorm cannot
    normalise one row. Selection leaves the model's BatchNorm statistics untouched.

    Example:
        >>> from leanbatch.bench.data import load_data
        >>> from leanbatch.bench.methods import parse_methods
        >>> data, cfg = load_data("digits", 64, 16), TrainConfig(widths=(4,))
        >>> sel = Selection(parse_methods("obs")[0], 0, data, cfg)
        >>> picked = sel(cfg.make_model(data), data.x_train[:8], data.y_train[:8], 0.5, 0, torch.arange(8), 0.1)
        >>> sel.memory, sel.forwards, picked.positions.shape[0]
        (True, False, 4)
    """

    def __init__(self, row: MethodRow, seed: int, data: DataSplit, cfg: TrainConfig, batchnorm: bool = True):
        self.proxy_opt: torch.optim.Optimizer | None = None
        self.setup: dict[str, float] | None = None  # what a holdout model cost (rho-loss)

        def proxy(width: float) -> tuple[nn.Module, torch.optim.Optimizer]:
            model = cfg.make_model(data, cfg.scaled_widths(data, width))
            self.proxy_opt = cfg.optimizer(model)
            return model, self.proxy_opt

        def irreducible(settings: Mapping[str, Any]) -> Tensor:
            losses, self.setup = train_irreducible(data, cfg, seed, settings)
            return losses

        context = SelectorContext(seed, data.num_train, proxy, irreducible)
        self.selector: Selector = row.make_selector(context)
        source = self.selector.source
        self.memory = isinstance(source, MemoryScores)
        self.forwards = source is not None and not self.memory
        self.batchnorm = batchnorm

    def record(self, indices: Tensor, losses: Tensor) -> None:
        """A memory of losses (``obs``): store the trained rows' losses, which later batches are ranked by."""
        self.selector.record_losses(indices, losses.detach())

    def __call__(
        self, model: nn.Module, x: Tensor, y: Tensor, progress: float, step: int, indices: Tensor, lr: float
    ) -> Picked | None:
        """The rows of batch ``(x, y)`` to train on at ``progress`` (``step``: the batch's index in its
        epoch, ``indices``: its dataset indices, ``lr``: the main run's learning rate); ``None``: all."""
        if not self.selector.is_active(progress, step):
            return None
        if self.batchnorm and smallest_trained(self.selector, x.shape[0]) < 2:
            return None
        if self.proxy_opt is not None:  # the proxy follows the main schedule
            for g in self.proxy_opt.param_groups:
                g["lr"] = lr
        sel = self.selector.select(
            (x, y), model, F.cross_entropy, progress=progress, batch_idx=step, indices=indices
        )
        if sel.positions is None:
            return None
        x_sel, y_sel = sel.batch
        return Picked(x_sel, y_sel, sel.positions, sel.losses)


def smallest_trained(selector: Selector, n: int) -> int:
    """The fewest rows any training pass takes from a batch of ``n`` under ``selector``: the kept
    rows, and a proxy scorer's own training share.

    Example:
        >>> from leanbatch.bench.methods import parse_methods
        >>> smallest_trained(parse_methods("sb")[0].probe_selector(), 3), smallest_trained(parse_methods("sb")[0].probe_selector(), 8)
        (1, 4)
    """
    keep = selector.keep
    rows = n if keep is None else num_selected(n, keep)
    scorer = selector.source.scorer if isinstance(selector.source, ScorerScores) else None
    if isinstance(scorer, ProxyScorer) and scorer.train:
        rows = min(rows, num_selected(n, scorer.train_keep))
    return rows
