"""How one score table's rows travel between the ranks of a data-parallel group.

Every rank must hold the same scores before it plans an epoch. Two ways get them there:

- **per step** (:meth:`ScoreExchange.send`): a training step's rows (an index and a loss each)
  go to every rank and every rank stores them all, in rank order: by one all-gather started
  without waiting (:func:`~leanbatch.distributed.collectives.gather_step`), or inside DDP's
  gradient all-reduce once a :class:`~leanbatch.distributed.carrier.ScoreCarrier` carries them
  (:meth:`ScoreExchange.carry`). Nothing is then left to merge.
- **at a merge** (:func:`merge_scores`): what each rank wrote into its own table (``update``
  calls that bypass the step) is averaged over the ranks that wrote each row; a collective, so
  every rank calls it at the same point (an epoch's end, ``set_epoch``, a checkpoint).

In one process both are the plain table's own writes.

Example:
    >>> import torch
    >>> from leanbatch import ScoreTable
    >>> table = ScoreTable(4)
    >>> ScoreExchange(table).send(torch.tensor([1]), torch.tensor([0.5]))   # one process: stored
    >>> merge_scores(table); table.values.tolist()
    [nan, 0.5, nan, nan]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from leanbatch.distributed.collectives import gather_step, mean_of_writers
from leanbatch.ranks import is_distributed, same_group, world_size
from leanbatch.scores import ScoreTable

if TYPE_CHECKING:
    from leanbatch.distributed.carrier import ScoreCarrier

__all__ = ["ScoreExchange", "merge_scores"]


def merge_scores(table: ScoreTable, group: Any = None) -> None:
    """Merge what every rank of ``group`` wrote into ``table`` since the last merge (a collective).

    Each row written by several ranks gets the mean of their scores (and of their EMA variances);
    rows no rank wrote keep their value. A no-op outside an initialised process group of more
    than one process. Call it on every rank.

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable
        >>> t = ScoreTable(2); t.update(torch.tensor([0]), torch.tensor([3.0]))
        >>> merge_scores(t); t.values.tolist()
        [3.0, nan]
    """
    if not is_distributed(group):
        return
    written = table.take_written()
    var = table.variances if table.tracks_variance else None
    merged, merged_var = mean_of_writers(table.values, written, var, group)
    if var is not None and merged_var is not None:
        var.copy_(merged_var)
    table.values.copy_(merged)


class ScoreExchange:
    """Sends a table's per-step rows to every rank of ``group`` (all-gather, or a DDP carrier).

    Args:
        table: the score table every rank keeps alike.
        group: the data-parallel process group (``None``: the world).
        carrier: a :class:`~leanbatch.distributed.carrier.ScoreCarrier` the rows ride (default:
            none until :meth:`carry`).

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable
        >>> ex = ScoreExchange(ScoreTable(3))
        >>> ex.send(torch.tensor([0, 2]), torch.tensor([1.0, 2.0])); ex.table.values.tolist()
        [1.0, nan, 2.0]
    """

    def __init__(self, table: ScoreTable, group: Any = None, carrier: ScoreCarrier | None = None):
        self.table = table
        self.group = group
        self.carrier = carrier  # what the rows ride (carry()); None: an all-gather a step

    def send(self, indices: Tensor, losses: Tensor) -> None:
        """Store one step's rows on every rank: every rank's rows, in rank order (the same number
        of rows on every rank). The rows travel while the caller goes on (its backward pass); the
        table waits for them when it writes. In one process: a plain (queued) store.
        """
        group = self.group
        if not is_distributed(group):
            self.table.store(indices, losses, check=False)
            return
        self.table.follow(losses.device)
        carrier = self.carrier
        if carrier is not None and same_group(carrier.group, group):
            rows = carrier.post(indices, losses)
        else:
            rows = gather_step(indices, losses, group)
        self.table.receive(rows, indices.shape[0] * world_size(group))

    def carry(self, model: Any) -> ScoreCarrier:
        """Send the rows inside ``model``'s gradient all-reduce from now on (``model``: the
        ``DistributedDataParallel`` wrapper); ``ValueError`` when it all-reduces over another
        process group, checked before any hook. Once per model: asked again for the model the
        rows already ride (a second fit on the same wrapper), the same carrier.
        """
        if self.carrier is not None and self.carrier.model is model:
            return self.carrier  # DDP takes one comm hook: it is already ours
        own = getattr(model, "process_group", None)
        if own is not None and not same_group(own, self.group):
            raise ValueError(
                "model all-reduces over another process group than the scores' process_group: build both "
                "on the same group"
            )
        from leanbatch.distributed.carrier import ScoreCarrier  # opt-in: loaded by the first carry()

        carrier = ScoreCarrier(model)
        self.table.flush()  # rows queued so far went by the all-gather
        self.carrier = carrier
        return carrier
