"""Stale-SB memory: per-index selection losses and the epoch each was measured in.

Stale Selective Backprop (Jiang et al. 2019, section 5) runs the selection
forward pass for an example only every ``staleness`` epochs and reuses its last
loss in between. The losses live in a :class:`leanbatch.scores.ScoreTable` (the
table InfoBatch uses too, so both methods can share one memory); this module
adds the per-index epoch stamp that decides freshness.

An example is *fresh* in epoch ``e`` when it was scored in epoch ``e0`` with
``0 <= e - e0 < staleness``: with ``staleness=2`` an example scored in epoch 4
reuses that loss in epoch 5 and is scored again in epoch 6; ``staleness=1`` is
plain SB. The stamps live where the indices come from (the DataLoader yields
them on the CPU), so deciding which rows to score reads nothing from the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from leanbatch.scores import ScoreTable
from leanbatch.selection._checks import check_int

__all__ = ["StaleScores"]

_NEVER = -(2**62)  # epoch stamp of an index never scored (fails every freshness test)


class StaleScores:
    """Per-index losses (a ``ScoreTable``) plus the epoch each loss was measured in.

    Args:
        num_samples: dataset size (ignored when ``table`` is given).
        staleness: reuse a loss for this many epochs counting the one it was
            measured in (``1`` = never reuse).
        table: an existing ``ScoreTable`` to read and write (e.g. InfoBatch's).

    Example:
        >>> import torch
        >>> s = StaleScores(num_samples=6, staleness=2)
        >>> s.record(torch.tensor([0, 1]), torch.tensor([0.5, 2.0]), epoch=3)
        >>> s.fresh(torch.tensor([0, 1, 2]), epoch=4).tolist()
        [True, True, False]
        >>> s.fresh(torch.tensor([0, 1, 2]), epoch=5).tolist()
        [False, False, False]
        >>> s.losses(torch.tensor([1, 2])).tolist()  # never scored -> +inf (the hardest)
        [2.0, inf]
    """

    def __init__(self, num_samples: int | None = None, staleness: int = 2, table: ScoreTable | None = None):
        self.staleness = check_int(staleness, "staleness", 1)
        if table is None:
            if num_samples is None:
                raise ValueError(
                    "Stale-SB needs the dataset size: pass num_samples=len(dataset) or score_table="
                )
            table = ScoreTable(check_int(num_samples, "num_samples", 1))
        elif not isinstance(table, ScoreTable):
            raise TypeError(f"score_table must be a leanbatch.scores.ScoreTable, got {type(table).__name__}")
        self.table = table
        self.num_samples = table.num_samples
        self.scored_epoch = torch.full((self.num_samples,), _NEVER, dtype=torch.int64)

    @staticmethod
    def check_batch(indices: Any, epoch: Any, n: int) -> None:
        """Raise unless ``indices`` is a tensor of ``n`` dataset indices and ``epoch`` is given.

        Example:
            >>> import torch
            >>> StaleScores.check_batch(torch.arange(4), epoch=0, n=4)
            >>> try:
            ...     StaleScores.check_batch(None, epoch=0, n=4)
            ... except ValueError as e:
            ...     print(str(e).split(" needs")[0])
            Stale-SB (staleness >= 2)
        """
        if indices is None or epoch is None:
            raise ValueError(
                "Stale-SB (staleness >= 2) needs select(..., indices=dataset_indices, epoch=epoch)"
            )
        if not isinstance(indices, Tensor) or tuple(indices.shape) != (n,):
            shape = tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__
            raise ValueError(f"indices must be a tensor of shape ({n},) (one per example), got {shape}")

    def _stamps_for(self, indices: Tensor) -> Tensor:
        if not isinstance(indices, Tensor) or indices.dim() != 1 or indices.is_floating_point():
            raise TypeError("indices must be a 1-D integer tensor of dataset indices")
        if indices.device != self.scored_epoch.device:  # follow the indices (normally the CPU)
            self.scored_epoch = self.scored_epoch.to(indices.device)
        self.table.check_indices(indices)
        return self.scored_epoch

    def fresh(self, indices: Tensor, epoch: int) -> Tensor:
        """Bool mask: which ``indices`` hold a loss measured less than ``staleness`` epochs ago."""
        check_int(epoch, "epoch", 0)
        stamps = self._stamps_for(indices)[indices.long()]
        age = epoch - stamps
        return (age >= 0) & (age < self.staleness)

    def record(self, indices: Tensor, losses: Tensor, epoch: int) -> None:
        """Store ``losses`` of ``indices`` as measured in ``epoch``.

        Every index is stamped with ``epoch``, so this never reads the losses back
        from the device; a non-finite loss is not stored by the table, and until
        the stamp expires the index reuses its previous loss (``+inf`` if none).
        """
        check_int(epoch, "epoch", 0)
        stamps = self._stamps_for(indices)
        self.table.update(indices, losses)
        stamps.index_fill_(0, indices.long(), epoch)

    def losses(self, indices: Tensor) -> Tensor:
        """The remembered losses of ``indices`` (float32, on the table's device); never scored -> +inf."""
        values = self.table.get(indices)
        return torch.nan_to_num(values, nan=float("inf"))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "staleness": self.staleness,
            "scored_epoch": self.scored_epoch.cpu().clone(),
            "table": self.table.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the dataset size must match."""
        self.table.load_state_dict(state["table"])
        stamps = state["scored_epoch"]
        if tuple(stamps.shape) != (self.num_samples,):
            raise ValueError(f"state_dict is for {stamps.shape[0]} samples, not {self.num_samples}")
        self.scored_epoch = stamps.to(self.scored_epoch.device, torch.int64).clone()
