"""RHO-LOSS (Mindermann et al., ICML 2022): select the rows whose loss is reducible.

Each batch is scored by the model being trained (the no-grad selection forward) and each row's
*reducible* loss is its training loss minus its *irreducible* loss, the loss of a small model
trained on a holdout split (computed once, for every training sample, before training). The
hardest ``keep`` share by reducible loss is trained: rows that are hard because they are
noisy, ambiguous or already learned by the holdout model are skipped. The irreducible losses
are a tensor indexed by dataset index; training the holdout model and computing them is the
caller's (and its cost is the method's: the benchmark counts it).

Example:
    >>> import torch, torch.nn.functional as F
    >>> il = torch.tensor([0.0, 0.0, 5.0, 0.0])  # sample 2 is hard for the holdout model too
    >>> rho = RhoLoss(il, keep=0.5, loss_fn=F.cross_entropy)
    >>> model = torch.nn.Linear(2, 2)
    >>> x, y, idx = torch.zeros(4, 2), torch.tensor([0, 1, 1, 0]), torch.arange(4)
    >>> rho.select((x, y), model, progress=0.5, batch_idx=0, indices=idx).positions.numel()
    2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from leanbatch.selection.layout import Rows
from leanbatch.selection.rules import TopRule
from leanbatch.selection.schedule import Window
from leanbatch.selection.selector import Selector
from leanbatch.selection.sources import ForwardScores, Source, check_row_indices
from leanbatch.selection.stats import SelectionStats

__all__ = ["ReducibleScores", "RhoLoss"]


class ReducibleScores(Source):
    """``source``'s losses minus the irreducible losses of the rows' dataset indices.

    Example:
        >>> import torch
        >>> from leanbatch.selection.layout import read_rows
        >>> from leanbatch.selection.sources import ScorerScores
        >>> src = ReducibleScores(ScorerScores(lambda x, y: x.sum(1)), torch.tensor([0.5, 1.5]))
        >>> rows = read_rows((torch.ones(2, 2), torch.zeros(2)), (None, None), indices=torch.tensor([1, 0]))
        >>> src.scores(rows, None, None, SelectionStats()).tolist()
        [0.5, 1.5]
    """

    def __init__(self, source: Source, irreducible: Any):
        self.source = source
        self.irreducible = _irreducible(irreducible)
        self.runs_model = source.runs_model

    def check_batch(self, rows: Rows, loss_fn: Any) -> None:
        # The dataset's length is not known here, so each batch is checked: on the CPU (where a
        # DataLoader yields indices) by a min/max; on an accelerator by a device-side assert (no sync).
        why = "RhoLoss subtracts each row's irreducible loss, looked up by dataset index"
        indices = check_row_indices(rows, why)
        if indices.is_floating_point() or indices.dtype == torch.bool:
            raise TypeError(f"indices must be an integer tensor of dataset indices, got {indices.dtype}")
        n = int(self.irreducible.shape[0])
        fix = (
            f"indices must be in [0, {n}). irreducible must hold one loss per dataset sample: the holdout "
            "model's loss on every sample of the whole training set, shape (len(train_dataset),)"
        )
        if indices.numel() and indices.device.type != "cpu":
            msg = f"irreducible holds {n} losses but a dataset index of the batch has none: {fix}"
            torch._assert_async(((indices >= 0) & (indices < n)).all(), msg)
        elif indices.numel():
            lo, hi = (int(v) for v in torch.aminmax(indices))
            if lo < 0 or hi >= n:
                seen = f"the largest index of the batch is {hi}" if hi >= n else f"the batch has index {lo}"
                raise IndexError(f"irreducible holds {n} losses but {seen}: {fix}")
        self.source.check_batch(rows, loss_fn)

    def check(self, rows: Rows, model: Any, loss_fn: Any) -> None:
        self.source.check(rows, model, loss_fn)

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        assert rows.indices is not None
        losses = self.source.scores(rows, model, loss_fn, stats)
        if self.irreducible.device != losses.device:
            self.irreducible = self.irreducible.to(losses.device)
        return losses - self.irreducible.index_select(0, rows.indices.to(losses.device, non_blocking=True))


def _irreducible(value: Any) -> Tensor:
    """``value`` (a tensor, list or numpy array) as a finite float32 tensor ``(N,)``."""
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"irreducible must be a float tensor of shape (N,), one loss per dataset sample (a list or "
                f"numpy array of numbers is converted), got {type(value).__name__}: {err}"
            ) from err
    if value.dim() != 1 or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(
            f"irreducible must be a float tensor of shape (N,), one loss per dataset sample, got "
            f"{value.dtype} {tuple(value.shape)}"
        )
    t = value.detach().to(torch.float32)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(
            "irreducible must hold finite losses (no NaN or inf): recompute the holdout model's loss "
            "of every training sample"
        )
    return t


class RhoLoss(Selector):
    """RHO-LOSS: train the ``keep`` share of each batch with the largest reducible loss.

    Args:
        irreducible: float tensor ``(N,)`` (or a list or numpy array, converted to float32), each
            training sample's loss under the holdout model; a batch's dataset index ``>= N`` raises.
        keep: the share of each batch trained (the paper selects 10% of large batches).
        start, end, interrupt: the schedule (default: every batch).
        loss_fn, scale_factor, forward_fn, chunk_size, autocast, eval_mode: the selection
            forward, as in :class:`~leanbatch.selection.SelectiveBackprop` (no downsampling by default).
        seed, rank: the private generators (the rule itself is deterministic).
        scope, group: ``"global"`` keeps the hardest ``keep`` share of the whole step's rows of
            the ranks of ``group`` (default: the world); train on :meth:`step_loss`
            (:mod:`~leanbatch.selection.scope`).

    ``select(batch, model, progress=, batch_idx=, indices=)``; its uniform twin is
    ``SelectiveBackprop(keep=keep, rule="uniform", ...)`` with the same schedule.

    Example:
        >>> import torch
        >>> RhoLoss(torch.zeros(10), keep=0.1).keep
        0.1
    """

    def __init__(
        self,
        irreducible: Any,
        keep: float = 0.1,
        *,
        start: float = 0.0,
        end: float = 1.0,
        interrupt: int = 0,
        loss_fn: Callable[..., Tensor] | None = None,
        scale_factor: float = 1.0,
        forward_fn: Callable[[Any, Any], Any] | None = None,
        chunk_size: int | None = None,
        autocast: torch.dtype | bool | None = None,
        eval_mode: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        scope: str = "local",
        group: Any = None,
    ):
        forward = ForwardScores(
            scale_factor,
            loss_fn,
            forward_fn=forward_fn,
            chunk_size=chunk_size,
            autocast=autocast,
            eval_mode=eval_mode,
        )
        super().__init__(
            Window(start, end, interrupt),
            ReducibleScores(forward, irreducible),
            TopRule(keep),
            seed=seed,
            rank=rank,
            group=group,
            scope=scope,
        )
