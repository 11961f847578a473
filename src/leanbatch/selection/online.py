"""Online batch selection (Loshchilov & Hutter, 2015), batch-level and forward-free.

Every example of a loaded batch is ranked by the loss its dataset index had *the last time it was
trained* (a memory of last losses: no extra forward pass), and ``max(1, int(keep * N))`` are drawn
with probabilities falling exponentially with the hardness rank: the hardest is ``pressure``
times as likely as the easiest (:func:`~leanbatch.selection.rules.select_by_loss_rank`). Examples
never trained count as the hardest; ties are broken at random.
"""

from __future__ import annotations

from typing import Any

from leanbatch.ranking import check_pressure
from leanbatch.scores import ScoreTable
from leanbatch.selection.rules import LossRankRule
from leanbatch.selection.schedule import Window
from leanbatch.selection.selector import Selector
from leanbatch.selection.sources import MemoryScores

__all__ = ["OnlineBatchSelection"]


class OnlineBatchSelection(Selector):
    """Online batch selection: keep the rows whose last trained loss ranks highest, no forward pass.

    Args:
        num_samples: dataset size, for the memory of last losses (or pass ``score_table``).
        score_table: a :class:`~leanbatch.scores.ScoreTable` to keep them in (share InfoBatch's:
            its ``update`` stores the trained losses, so :meth:`record_losses` is not needed).
        keep: fraction of each batch kept, ``max(1, int(keep * N))``, in (0, 1].
        pressure: the hardest example's odds over the easiest (Loshchilov & Hutter's ``s_e``;
            100 = their ``s_e0``; 1 = uniform), finite, >= 1.
        final_pressure: decay the pressure exponentially to this value at the end of training
            (default None: constant).
        start, end, interrupt: the schedule, as in :class:`~leanbatch.selection.SelectiveBackprop`
            (default: every batch of the run).
        seed, rank: the private generators, as in :class:`~leanbatch.selection.SelectiveBackprop`.
        scope, group: ``"global"`` ranks the whole step's rows of the ranks of ``group`` (default:
            the world) together; train on :meth:`step_loss` (:mod:`~leanbatch.selection.scope`).

    ``select(batch, progress=, batch_idx=, indices=)`` needs no model; ``indices`` are the rows'
    dataset indices (on the CPU, as a DataLoader yields them). After the training step,
    :meth:`record_losses` stores the trained rows' losses, which later batches are ranked by.
    ``SelectiveBackprop(rule="loss_rank", selection_pressure=...)`` is the same method (same draws).

    Example:
        >>> import torch
        >>> obs = OnlineBatchSelection(num_samples=100, keep=0.25, pressure=1e9, seed=0)
        >>> x, idx = torch.randn(8, 3), torch.arange(10, 18)
        >>> obs.record_losses(idx[:6], torch.tensor([0.1, 0.2, 5.0, 0.3, 4.0, 0.4]))  # 16, 17: never trained
        >>> (x_kept, idx_kept), rows, _ = obs.select((x, idx), progress=0.3, batch_idx=0, indices=idx)
        >>> rows.tolist(), idx_kept.tolist()
        ([6, 7], [16, 17])
        >>> obs.record_losses(idx_kept, torch.tensor([0.01, 0.02]))
        >>> obs.select((x, idx), progress=0.3, batch_idx=1, indices=idx).positions.tolist()
        [2, 4]
    """

    def __init__(
        self,
        num_samples: int | None = None,
        *,
        score_table: ScoreTable | None = None,
        keep: float = 0.5,
        pressure: float = 100.0,
        final_pressure: float | None = None,
        start: float = 0.0,
        end: float = 1.0,
        interrupt: int = 0,
        seed: int | None = None,
        rank: int | None = None,
        scope: str = "local",
        group: Any = None,
    ):
        super().__init__(
            Window(start, end, interrupt),
            MemoryScores(num_samples, score_table, method="OnlineBatchSelection"),
            LossRankRule(keep, check_pressure(pressure, "pressure"), final_pressure),
            keys=None,
            seed=seed,
            rank=rank,
            group=group,
            scope=scope,
        )

    def __repr__(self) -> str:
        rule = self.selection_rule
        assert isinstance(rule, LossRankRule)
        return (
            f"OnlineBatchSelection(keep={rule.keep}, pressure={rule.pressure}, final_pressure={rule.final_pressure}, "
            f"start={self.start}, end={self.end}, interrupt={self.interrupt}{self.selection_scope.suffix})"
        )
