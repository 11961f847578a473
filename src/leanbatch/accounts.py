"""Whether updates train the samples that were served: the account of the indices they name.

``update(loss, indices)`` takes its plan and its place from the served stream (the ledger) but
stores scores under, and weights, the ``indices`` it is given. Indices that are not the batch's
(``torch.arange(len(x))``, an id column that is not the dataset index, one batch updated twice)
would put scores on wrong samples without a word. An :class:`IndexAccount` counts, per dataset
index, how often one :class:`~leanbatch.ledger.Iteration` served it (host side, one chunk at a
time, as it is served) and how often an update named it (queued, then one scatter-add every few
thousand samples on the indices' own device, no host sync). The iteration is checked once, where
it closes:

- trained to its end: the indices trained must be, as a multiset, exactly those served, in
  whatever batches and order (a batch sampler may regroup them);
- left early (a ``break``, a ``drop_last`` remainder, ``set_epoch`` to another epoch): those
  trained must be a sub-multiset of those served, since only part of what was served was trained.

One comparison of two histograms, once an epoch, where planning the next epoch syncs anyway.
Nothing is saved in a checkpoint: a resumed iteration serves from the saved position and its
account starts there, so a resumed epoch is checked on the part trained after the resume.

Example:
    >>> import torch
    >>> account = IndexAccount(6, torch.tensor([4, 1, 5]))    # served so far, untrained
    >>> account.serve(torch.tensor([0]))                       # served next
    >>> account.train(torch.tensor([1, 4])); account.train(torch.tensor([0, 5]))
    >>> account.close(epoch=0, whole=True)                     # the same multiset: passes
    >>> bad = IndexAccount(6, torch.tensor([4, 1]))
    >>> bad.train(torch.tensor([0, 1]))
    >>> try:
    ...     bad.close(epoch=0, whole=True)
    ... except ValueError as e:
    ...     print(str(e).split("rank: ")[1].split(",")[0])
    dataset index 0 was named 1 times by the updates and served 0 times
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["IndexAccount"]


class IndexAccount:
    """Served and trained counts per dataset index for one iteration (see the module docstring).

    ``rows``: the rows counted, one per dataset index, or with ``owner=(world, rank)`` (a sharded
    table's slice) one per index this rank owns (``i // world``), plus one row for the indices it
    does not own, so the counts take O(N / world) memory as the table does. ``untrained``: the
    dataset indices the iteration has served and not trained when the account opens (at its first
    update with indices); ``exact``: whether the trained multiset must equal the served one at the
    iteration's end (``False``: a sub-multiset, e.g. when some steps named no indices).
    """

    __slots__ = ("served", "trained", "exact", "owner", "_queued", "_versions", "_queued_n")

    FOLD = 16384  # indices queued before one scatter-add folds them into the trained counts

    def __init__(
        self, rows: int, untrained: Tensor, owner: tuple[int, int] | None = None, exact: bool = True
    ):
        self.owner = owner
        self.served = torch.zeros(rows + 1, dtype=torch.int32)
        self.trained: Tensor | None = None  # on the device of the first indices trained
        self._queued: list[Tensor] = []  # named indices not counted yet
        self._versions: list[int] = []  # ... and their version counters when queued
        self._queued_n = 0
        self.exact = exact
        self.serve(untrained)

    def _rows(self, indices: Tensor) -> Tensor:
        """The counted row of each dataset index (the last row: one this rank does not own)."""
        if self.owner is None:
            return indices
        world, rank = self.owner
        spare = torch.full_like(indices, self.served.shape[0] - 1)
        return torch.where(indices % world == rank, torch.div(indices, world, rounding_mode="floor"), spare)

    def serve(self, indices: Tensor) -> None:
        """The iteration served ``indices`` (int64, CPU) next."""
        rows = self._rows(indices)
        self.served.scatter_add_(0, rows, torch.ones(rows.shape, dtype=torch.int32))

    def train(self, indices: Tensor) -> None:
        """An update named ``indices`` (int64, checked to be dataset indices; not modified in place
        later): queued, and counted a few thousand at a time by one scatter-add on their device
        (asynchronous; moved to the device of the first update's indices if they differ)."""
        self._queued.append(indices)
        self._versions.append(indices._version)
        self._queued_n += indices.shape[0]
        if self._queued_n >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        """Count the queued indices into :attr:`trained` (no host sync)."""
        queued, versions = self._queued, self._versions
        self._queued, self._versions, self._queued_n = [], [], 0
        if [t._version for t in queued] != versions:
            raise RuntimeError(
                "an indices tensor passed to update() was modified in place before it was counted: "
                "modify a copy (indices = indices.clone()) after calling update()"
            )
        if self.trained is None:
            self.trained = torch.zeros(self.served.shape, dtype=torch.int32, device=queued[0].device)
        dev = self.trained.device
        try:
            named = torch.cat(queued).to(dev, non_blocking=True)
        except RuntimeError:  # indices on several devices
            named = torch.cat([t.to(dev, non_blocking=True) for t in queued])
        rows = self._rows(named)
        self.trained.scatter_add_(0, rows, torch.ones(rows.shape, dtype=torch.int32, device=dev))

    def close(self, epoch: int, whole: bool) -> None:
        """Check the account (one host sync): ``whole``, the iteration was trained to its end, so the
        trained multiset must equal the served one (when :attr:`exact`); otherwise be part of it."""
        if self._queued:
            self._fold()
        if self.trained is None:
            return
        trained, served = self.trained.cpu(), self.served
        if torch.equal(trained, served) if whole and self.exact else bool((trained <= served).all()):
            return
        over = (trained > served).nonzero()  # named more often than served: the likeliest culprit
        i = int((over if len(over) else (trained < served).nonzero())[0, 0])
        world, rank = self.owner or (1, 0)
        which = (
            "an index this rank does not own" if i == len(served) - 1 else f"dataset index {i * world + rank}"
        )
        raise ValueError(
            f"update(loss, indices) was given indices that epoch {epoch} did not serve on this rank: "
            f"{which} was named {int(trained[i])} times by the updates and served "
            f"{int(served[i])} times{'' if whole else ' (before the epoch was left)'}, so scores and "
            "weights went to the wrong samples. Pass the dataset indices each batch carries (e.g. "
            "wrap the dataset in leanbatch.indexed.WithIndex and take them from the batch), not rows "
            "of the batch (torch.arange(len(x))) or an id column of your own, and call update() "
            "once per batch"
        )
