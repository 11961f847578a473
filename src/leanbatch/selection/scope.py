"""Global selection: one choice over the whole step's batch, split among the data-parallel ranks.

By default (``scope="local"``) each rank of a data-parallel job selects within its own batch: it
keeps ``max(1, int(keep * n))`` of its ``n`` rows whatever the other ranks' rows are. With
``scope="global"`` the ``W * n`` rows of a step (``W`` ranks of the process group, ``n`` rows
each) are ranked together, as if one process had loaded the step's whole batch: every rank
gathers the step's scores (float32, one all-gather), draws the same choice from a generator
seeded alike on every rank (:meth:`leanbatch.rng.Generators.shared`, keyed by the draw count) and
keeps the chosen rows that fall in its own slice ``[rank * n, (rank + 1) * n)``.

- **Counts vary.** Each rank keeps as many rows as the choice gives it (a fixed-count rule's
  sum to ``max(1, int(keep * W * n))``). Turning the choice into this rank's rows reads the ``W``
  per-rank counts from the device once per step (:meth:`Scope.choose`): a tensor's length is host
  metadata, and how many of its rows were chosen depends on every rank's scores, so that one
  small read cannot be avoided. It is the only one (the history rule's own is folded into it).
- **An empty rank trains one row with weight 0.** A rank the choice leaves empty trains its
  single highest-scoring row (its first row under the uniform rule, which reads no scores):
  DDP needs a forward and a backward on every rank at every step (else its gradient all-reduce
  waits forever), and an empty batch breaks BatchNorm and makes a mean NaN. The row is counted
  in ``stats.filled`` (and in ``backpropagated``: it was computed), and
  :meth:`~leanbatch.selection.Selector.step_loss` gives it weight 0, so the step's gradient is
  exactly the chosen rows'.
- **The loss.** Ranks train different numbers of rows, so DDP's average of per-rank means would
  weigh a row of a rank with few rows more. ``step_loss`` returns ``losses.sum() * W / K``
  (``K`` rows chosen over the group): DDP's average of that is the mean over the chosen rows.
- **Equal batch sizes.** Every rank must pass the same number of rows at each step (as
  ``DistributedSampler``, leanbatch's sampler and accelerate's even batches do). It is checked
  once, at the first global draw (:meth:`Scope.choose`): checking every step would cost a second
  read, and a gather of unequal sizes does not fail cleanly (gloo aborts one process and leaves
  garbage in the other's result).
- The scores are gathered on their own device: under NCCL keep them on the GPU.
- Outside an initialised process group of more than one process, ``"global"`` is ``"local"``:
  the same draws.

Example:
    >>> Scope("global").world, Scope("local").name  # no process group here: local selection
    (1, 'local')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leanbatch.checks import check_choice, check_per_sample_loss
from leanbatch.ranks import is_distributed, process_rank, world_size
from leanbatch.rng import Generators
from leanbatch.selection.rules import Draw, Rule

__all__ = ["Scope", "gather"]

_HINT = "'local' selects within each rank's batch, 'global' over the whole step's batch of the group"
# all_gather_into_tensor is deprecated from PyTorch 2.13 in favour of all_gather_single
_ALL_GATHER: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather(tensor: Tensor, group: Any = None) -> Tensor:
    """``tensor`` of every rank of ``group``, concatenated along dim 0 in rank order (equal shapes)."""
    if not is_distributed(group):
        return tensor
    w = world_size(group)
    out = torch.empty((w * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    _ALL_GATHER(out, tensor.contiguous(), group=group)
    return out


class Scope:
    """Where a selector makes its choice: ``"local"`` (each rank's batch) or ``"global"`` (the
    whole step's batch of ``group``, default the world); it draws and weighs the trained rows.

    Example:
        >>> import torch
        >>> from leanbatch.selection.rules import RankRule
        >>> scope, draw = Scope("global"), Draw(8, torch.device("cpu"))
        >>> positions, chosen = scope.choose(RankRule(0.5), torch.rand(8), draw, Generators(seed=0), 0)
        >>> scope.world, chosen, float(scope.step_loss(torch.ones(chosen)))  # one process: local
        (1, 4, 1.0)
    """

    def __init__(self, scope: str = "local", group: Any = None):
        self.name, self.group = str(check_choice(scope, "scope", ("local", "global"), _HINT)), group
        self._sizes_checked = False  # global: equal batch sizes, checked at the first global draw
        self._loss_scale: float | None = None  # None: the mean; global: W / K (0 for a filler row)
        self._trained = 0  # rows of the batch last returned

    def __repr__(self) -> str:
        return f"Scope({self.name!r})"

    @property
    def suffix(self) -> str:
        """What a selector's ``repr`` adds: nothing for the default ``"local"``."""
        return "" if self.name == "local" else f", scope={self.name!r}"

    @property
    def world(self) -> int:
        """How many ranks one choice spans: the size of the group under ``"global"`` in an
        initialised group of more than one process, else 1 (host-side only)."""
        return world_size(self.group) if self.name == "global" and is_distributed(self.group) else 1

    def returned(self, n: int) -> None:
        """A batch of ``n`` rows is handed back as loaded (no selection: ``step_loss`` is the mean)."""
        self._loss_scale, self._trained = None, n

    def choose(
        self, rule: Rule, scores: Tensor | None, draw: Draw, generators: Generators, t: int
    ) -> tuple[Tensor, int]:
        """The positions of this rank's rows to train at draw ``t`` and how many of them ``rule``
        chose (the rest: the filler row). ``draw``: this rank's, its generator unset.
        """
        w = self.world
        if w == 1:  # local selection: draw t of this rank, as ever
            gen = generators.get(draw.device, t) if rule.random else None
            positions = rule.positions(scores, draw._replace(generator=gen))
            self._trained = int(positions.shape[0])
            return positions, self._trained
        if not self._sizes_checked:
            sizes = gather(torch.tensor([draw.n], dtype=torch.int64, device=draw.device), self.group).tolist()
            if any(s != draw.n for s in sizes):  # every rank sees the same sizes: every rank raises
                raise ValueError(
                    "scope='global' ranks the rows of a whole step together, so every rank of the group "
                    f"must pass the same number of rows at each step; the ranks passed {sizes}: shard the "
                    "data into equal lengths (DistributedSampler) and drop or pad a short last batch"
                )
            self._sizes_checked = True
        n, r = draw.n, process_rank(self.group)
        gen = generators.shared(draw.device, t) if rule.random else None
        gathered = None if scores is None else gather(scores.detach().to(torch.float32), self.group)
        mask = rule.mask(gathered, draw._replace(n=w * n, generator=gen))
        counts: list[int] = mask.view(w, n).sum(1).tolist()  # the one read: how many rows each rank keeps
        chosen, total = counts[r], sum(counts)
        self._loss_scale = w / total if chosen else 0.0
        if chosen or not total:  # nobody at all only when the draw may keep nobody (iterate): all skip
            positions = torch.nonzero_static(mask[r * n : (r + 1) * n], size=chosen).squeeze(1)
        elif scores is None:  # the filler row; the uniform rule reads no scores: its first row
            positions = torch.zeros(1, dtype=torch.int64, device=mask.device)
        else:  # its hardest row (NaN counts as hardest)
            positions = torch.argmax(scores.detach()).view(1)
        self._trained = int(positions.shape[0])
        return positions, chosen

    def step_loss(self, losses: Tensor) -> Tensor:
        """The loss to backpropagate from the per-row losses of the rows last returned: their mean;
        after a global choice ``losses.sum() * W / K`` (``K`` rows chosen over the ``W`` ranks; 0
        for a rank's filler row), whose average over the ranks (DDP's) is the chosen rows' mean.
        """
        losses = check_per_sample_loss(losses, "losses")
        if self._loss_scale is None:
            return losses.mean()
        if losses.shape[0] != self._trained:
            raise ValueError(
                f"step_loss needs one loss per row of the batch select() returned last "
                f"({self._trained} rows), got {losses.shape[0]}"
            )
        return losses.sum() * self._loss_scale
