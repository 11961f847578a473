"""The paper's loop: one epoch of a loader with selection, selected rows accumulated into full batches.

:meth:`leanbatch.selection.SelectiveBackprop.iterate` is the public entry point;
this module holds its body so the schedule object stays small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch import Tensor

from leanbatch.selection._checks import check_int
from leanbatch.selection.accumulate import BatchAccumulator
from leanbatch.selection.layout import Key, batch_size, split_batch
from leanbatch.selection.window import training_progress

if TYPE_CHECKING:
    from leanbatch.selection.selective_backprop import SelectiveBackprop

__all__ = ["iterate_selected"]


def iterate_selected(
    sb: SelectiveBackprop,
    loader: Iterable[Any],
    model: Any,
    loss_fn: Callable[..., Tensor] | None = None,
    *,
    epoch: int,
    num_epochs: int,
    batch_size_out: int | None = None,
    indices_key: Key | None = None,
    drop_last: bool = False,
) -> Iterator[Any]:
    """One epoch of ``loader`` through ``sb``; arguments as in :meth:`SelectiveBackprop.iterate`.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> from leanbatch.selection import SelectiveBackprop
        >>> data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
        >>> sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.25, scale_factor=1.0, interrupt=2)
        >>> [len(y) for x, y in iterate_selected(sb, data, torch.nn.Linear(4, 3), F.cross_entropy,
        ...                                      epoch=0, num_epochs=1)]  # vanilla 1 and 3, then 2 + 2 rows kept
        [8, 8, 4]
    """
    check_int(epoch, "epoch", 0)
    check_int(num_epochs, "num_epochs", 1)
    try:
        per_epoch: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:
        per_epoch = None
    acc: BatchAccumulator | None = None if batch_size_out is None else BatchAccumulator(batch_size_out)
    for i, batch in enumerate(loader):
        progress = training_progress(
            epoch=epoch, num_epochs=num_epochs, batch_idx=i, batches_per_epoch=per_epoch
        )
        idx = None if indices_key is None else batch[indices_key]
        # the history rule may keep nobody here: the accumulator never hands out an empty batch
        sel = sb._select(batch, model, loss_fn, progress, i, idx, epoch, at_least_one=False)
        if sel.positions is None:
            yield sel.batch
            continue
        if acc is None:
            acc = BatchAccumulator(batch_size(*split_batch(batch, sb.input_key, sb.target_key)))
        acc.add(sel.batch, int(sel.positions.shape[0]))
        while (full := acc.pop()) is not None:
            yield full
    if acc is not None:
        if drop_last:
            dropped = acc.pending
            sb.stats.backpropagated -= dropped
            sb.stats.skipped += dropped
        else:
            rest = acc.flush()
            if rest is not None:
                yield rest
