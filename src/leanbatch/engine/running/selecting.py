"""The selection hook: ``run.select(batch, model, loss_fn, indices=idx)`` and the :class:`Pick` it returns.

A batch-level arm (``sb``, ``obs``, ``uniform``, ``sb-proxy``, ``rho-loss``, ``infobatch+sb``...)
picks the rows of each batch that get a training pass; every other arm returns the batch as it
is. The loop reads the same for every arm (AlgoPerf's ``data_selection`` hook, per batch)::

    pick = run.select((x, y), model, F.cross_entropy, indices=idx)
    x, y = pick.batch
    loss = pick.update(ds, F.cross_entropy(model(x), y, reduction="none"))

:meth:`Pick.update` hands the trained rows' losses to the arm's data (InfoBatch's scores and
weights; with ``stack_scores=selection`` the selection pass's losses of every row become the
scores), and to a memory of last trained losses (online batch selection).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from leanbatch import InfoBatch, ProxyScorer
from leanbatch.selection import MemoryScores, ScorerScores, Selector
from leanbatch.selection.rules import num_selected

__all__ = ["Pick", "smallest_trained"]


@dataclass(eq=False)
class Pick:
    """What :meth:`~leanbatch.engine.Run.select` returns: ``batch`` (the rows to train on, the input's
    structure), ``positions`` (their rows in the input batch; None: all of it), and :meth:`update`.

    Example:
        >>> import torch
        >>> from leanbatch.engine.running.data import Budget, CountedInfoBatch
        >>> ds, pick = CountedInfoBatch(list(range(4)), 1, budget=Budget()), Pick(torch.zeros(4, 2), None, None)
        >>> served = list(ds.sampler)
        >>> float(pick.update(ds, torch.tensor([1.0, 2.0, 3.0, 6.0])))
        3.0
    """

    batch: Any
    positions: Tensor | None
    indices: Tensor | None
    losses: Tensor | None = None  # the selection pass's losses of every row
    memory: Selector | None = None  # online batch selection's, which records the trained rows' losses
    stack: str = "trained"  # the arm's stack_scores

    def update(self, data: Any, per_sample_loss: Tensor) -> Tensor:
        """The loss to backpropagate, from the per-sample losses of :attr:`batch`'s rows: the arm's
        data stores them (``data.update``) and weighs them."""
        idx, pos = self.indices, self.positions
        if pos is None:
            return data.update(per_sample_loss) if idx is None else data.update(per_sample_loss, idx)
        if idx is None:
            raise TypeError("a selected batch goes back with its indices: run.select(..., indices=idx)")
        if self.memory is not None:  # online batch selection ranks later batches by these
            self.memory.record_losses(idx[pos], per_sample_loss.detach())
        if self.stack == "selection" and self.losses is not None and isinstance(data, InfoBatch):
            w = data.weights(idx[pos])  # the trained rows' weights in this batch's plan
            data.update(self.losses, idx)  # the selection pass scored every row of the batch
            return (per_sample_loss * w).mean()
        return data.update(per_sample_loss, idx, positions=pos)


def smallest_trained(selector: Selector, n: int) -> int:
    """The fewest rows any training pass takes from a batch of ``n`` under ``selector``: the kept rows,
    and a proxy scorer's own training share.

    Example:
        >>> from leanbatch import SelectiveBackprop
        >>> smallest_trained(SelectiveBackprop(keep=0.5), 3), smallest_trained(SelectiveBackprop(keep=0.5), 8)
        (1, 4)
    """
    keep = selector.keep
    rows = n if keep is None else num_selected(n, keep)
    scorer = selector.source.scorer if isinstance(selector.source, ScorerScores) else None
    if isinstance(scorer, ProxyScorer) and scorer.train:
        rows = min(rows, num_selected(n, scorer.train_keep))
    return rows


def _rows(batch: Any) -> int:
    """The rows of a batch: a tensor's first dimension, that of a tuple's or a dict's first entry."""
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values())))
    return len(batch[0] if isinstance(batch, (tuple, list)) else batch)


def select(
    selector: Selector,
    settings: Mapping[str, Any],
    batch: Any,
    model: Any,
    loss_fn: Callable[..., Tensor] | None,
    progress: float,
    batch_idx: int,
    indices: Tensor | None,
    min_rows: int,
    lr: float | None,
) -> Pick:
    """One batch through an arm's selector: the window, then the rows a model needs (``min_rows``),
    then the proxy's learning rate (``lr``: the main run's), then the selection."""
    memory = isinstance(selector.source, MemoryScores)
    whole = Pick(batch, None, indices)
    if not selector.is_active(progress, batch_idx):
        return whole
    if min_rows > 1 and smallest_trained(selector, _rows(batch)) < min_rows:
        return whole
    if memory and indices is None:
        raise TypeError(
            "online batch selection ranks by each sample's last loss: pass run.select(..., indices=idx)"
        )
    scorer = selector.source.scorer if isinstance(selector.source, ScorerScores) else None
    if lr is not None and isinstance(scorer, ProxyScorer):  # the proxy follows the main schedule
        for group in scorer.optimizer.param_groups:
            group["lr"] = lr
    sel = selector.select(batch, model, loss_fn, progress=progress, batch_idx=batch_idx, indices=indices)
    if sel.positions is None:
        return whole
    stack = str(settings.get("stack_scores", "trained"))
    return Pick(sel.batch, sel.positions, indices, sel.losses, selector if memory else None, stack)
