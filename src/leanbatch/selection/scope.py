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
  per-rank counts from the device once per step (:func:`pick`): a tensor's length is host
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
  once, at the first global draw (:func:`check_sizes`): checking every step would cost a second
  read, and a gather of unequal sizes does not fail cleanly (gloo aborts one process and leaves
  garbage in the other's result).
- The scores are gathered on their own device: under NCCL keep them on the GPU.
- Outside an initialised process group of more than one process, ``"global"`` is ``"local"``:
  the same draws.

Example:
    >>> group_size("global", None), check_scope("local")  # no process group here: local selection
    (1, 'local')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from leanbatch.checks import check_choice, check_per_sample_loss
from leanbatch.ranks import is_distributed, process_rank, world_size
from leanbatch.rng import Generators
from leanbatch.selection.rules import Draw, Rule

__all__ = ["SCOPES", "Pick", "Scope", "check_scope", "check_sizes", "gather", "group_size", "pick"]

SCOPES = ("local", "global")
_HINT = "'local' selects within each rank's batch, 'global' over the whole step's batch of the group"
# all_gather_into_tensor is deprecated from PyTorch 2.13 in favour of all_gather_single
_ALL_GATHER: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_scope(scope: object) -> str:
    """``scope`` if it is ``"local"`` or ``"global"``; ``ValueError`` otherwise.

    Example:
        >>> check_scope("global")
        'global'
    """
    return str(check_choice(scope, "scope", SCOPES, _HINT))


def group_size(scope: str, group: Any = None) -> int:
    """How many ranks one choice spans: the size of ``group`` (default: the world) under
    ``scope="global"`` in an initialised group of more than one process, else 1 (host-side only).

    Example:
        >>> group_size("global"), group_size("local")
        (1, 1)
    """
    return world_size(group) if scope == "global" and is_distributed(group) else 1


def gather(tensor: Tensor, group: Any = None) -> Tensor:
    """``tensor`` of every rank of ``group``, concatenated along dim 0 in rank order (equal shapes).

    Example:
        >>> import torch
        >>> gather(torch.arange(3)).tolist()  # without a process group: the tensor itself
        [0, 1, 2]
    """
    if not is_distributed(group):
        return tensor
    w = world_size(group)
    out = torch.empty((w * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    _ALL_GATHER(out, tensor.contiguous(), group=group)
    return out


def check_sizes(n: int, device: torch.device, group: Any = None) -> None:
    """Raise on every rank unless every rank of ``group`` passes ``n`` rows (a gather and a read:
    a selector calls it once, at its first global draw).

    Example:
        >>> import torch
        >>> check_sizes(8, torch.device("cpu"))  # one process: nothing to compare
    """
    sizes = gather(torch.tensor([n], dtype=torch.int64, device=device), group).tolist()
    if any(s != n for s in sizes):  # every rank sees the same sizes: every rank raises
        raise ValueError(
            f"scope='global' ranks the rows of a whole step together, so every rank of the group must "
            f"pass the same number of rows at each step; the ranks passed {sizes}: shard the data "
            "into equal lengths (DistributedSampler) and drop or pad a short last batch"
        )


class Pick(NamedTuple):
    """This rank's share of a global choice.

    Attributes:
        positions: int64 positions of the rows this rank trains, ascending, on the scores' device.
        chosen: how many of them the choice chose (0: ``positions`` is the filler row, or empty
            when the choice chose nobody at all).
        total: rows chosen over the whole group (``K``).

    Example:
        >>> import torch
        >>> Pick(torch.tensor([3]), 0, 4).chosen
        0
    """

    positions: Tensor
    chosen: int
    total: int


def pick(rule: Rule, scores: Tensor | None, draw: Draw, group: Any = None) -> Pick:
    """One choice of ``rule`` over the whole step's rows of ``group``; this rank's rows of it.

    ``scores``: this rank's ``draw.n`` scores (``None`` for a rule that reads none); ``draw``:
    this rank's, with the generator every rank seeded alike. Every rank must call it at the same
    step with the same ``draw.n``. The per-rank counts are read once (see the module).

    Example:
        >>> import torch
        >>> from leanbatch.selection.rules import TopRule
        >>> pick(TopRule(0.5), torch.tensor([0.3, 0.9, 0.1, 0.5]), Draw(4, torch.device("cpu"))).positions.tolist()
        [1, 3]
    """
    w, n = world_size(group) if is_distributed(group) else 1, draw.n
    r = process_rank(group) if w > 1 else 0
    gathered = None if scores is None else gather(scores.detach().to(torch.float32), group)
    mask = rule.mask(gathered, draw._replace(n=w * n))
    counts: list[int] = mask.view(w, n).sum(1).tolist()  # the one read: how many rows each rank keeps
    chosen, total = counts[r], sum(counts)
    if chosen or not total:  # nobody at all only when the draw may keep nobody (iterate): all skip
        mine = torch.nonzero_static(mask[r * n : (r + 1) * n], size=chosen).squeeze(1)
        return Pick(mine, chosen, total)
    if scores is None:  # the uniform rule reads no scores: its first row
        return Pick(torch.zeros(1, dtype=torch.int64, device=mask.device), 0, total)
    return Pick(torch.argmax(scores.detach()).view(1), 0, total)  # its hardest row (NaN counts as hardest)


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
        self.name, self.group = check_scope(scope), group
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
        """How many ranks one choice spans (:func:`group_size`; 1: local selection)."""
        return group_size(self.name, self.group)

    def returned(self, n: int) -> None:
        """A batch of ``n`` rows is handed back as loaded (no selection: ``step_loss`` is the mean)."""
        self._loss_scale, self._trained = None, n

    def choose(
        self, rule: Rule, scores: Tensor | None, draw: Draw, generators: Generators, t: int
    ) -> tuple[Tensor, int]:
        """The positions of this rank's rows to train at draw ``t`` and how many of them ``rule``
        chose (the rest: the filler row). ``draw``: this rank's, its generator unset.
        """
        world = self.world
        if world == 1:  # local selection: draw t of this rank, as ever
            gen = generators.get(draw.device, t) if rule.random else None
            positions = rule.positions(scores, draw._replace(generator=gen))
            self._trained = int(positions.shape[0])
            return positions, self._trained
        if not self._sizes_checked:
            check_sizes(draw.n, draw.device, self.group)
            self._sizes_checked = True
        gen = generators.shared(draw.device, t) if rule.random else None
        mine = pick(rule, scores, draw._replace(generator=gen), self.group)
        self._loss_scale = world / mine.total if mine.chosen else 0.0
        self._trained = int(mine.positions.shape[0])
        return mine.positions, mine.chosen

    def step_loss(self, losses: Tensor) -> Tensor:
        """The loss to backpropagate from the per-row losses of the rows last returned: their mean;
        after a global choice ``losses.sum() * W / K`` (``K`` rows chosen over the ``W`` ranks; 0
        for a rank's filler row), whose average over the ranks (DDP's) is the chosen rows' mean.

        Example:
            >>> import torch
            >>> float(Scope().step_loss(torch.tensor([1.0, 2.0, 6.0])))
            3.0
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
