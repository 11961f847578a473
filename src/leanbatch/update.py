"""One batch's update: its losses become scores, and the loss to backpropagate is weighted.

The two kernels :meth:`~leanbatch.InfoBatch.update` runs, over the run its
:class:`~leanbatch.PrunedSampler` owns: :func:`update_served` for ``update(loss)``, whose dataset
indices are the next ones the sampler served (checked against the batch fetched), and
:func:`update_indexed` for ``update(loss, indices[, positions=])``. Each checks everything before
anything changes, stores the scores (padding at an epoch's end trains but scores nothing: the
spare slot), moves training on by the batch and returns ``mean(loss * weight)`` with the weights
of the plan that served the batch.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy, PrunedSampler, ScoreTable
    >>> sampler = PrunedSampler(ScoreTable(4), InfoBatchPolicy(0.5, num_epochs=2))
    >>> order = list(sampler)
    >>> float(update_indexed(sampler, torch.tensor([1.0, 3.0]), torch.tensor(order[:2]), None))
    2.0
    >>> sampler.position.trained, sampler.scores.num_scored()
    (2, 2)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_index_tensor
from leanbatch.policies.plan import Plan
from leanbatch.sampler import PrunedSampler
from leanbatch.scores import ScoreTable

__all__ = ["update_indexed", "update_served", "weighted_mean"]


def update_served(sampler: PrunedSampler, loss: Tensor) -> Tensor:
    """``update(loss)``: ``loss`` belongs to the next ``len(loss)`` samples ``sampler`` served."""
    k = loss.shape[0]
    plan, idx, scored = sampler.take(k, gathered=True)  # checked against the batch the loader fetched
    assert idx is not None
    sampler.store(idx if scored >= k else _unscored(idx, None, scored, k, sampler.scores.num_samples), loss)
    w = plan.weights_on(loss.device)
    if w is None:
        return weighted_mean(loss, None)
    rows = idx if w.is_cpu else idx.to(w.device, non_blocking=True)
    return weighted_mean(loss, w.index_select(0, plan.local_rows(rows)))


def update_indexed(sampler: PrunedSampler, loss: Tensor, indices: Any, positions: Tensor | None) -> Tensor:
    """``update(loss, indices[, positions=])``: the batch names its dataset indices; ``positions``
    are the batch's rows that ``loss`` belongs to (a selected subset)."""
    k = loss.shape[0]
    if type(indices) is not Tensor or indices.dtype is not torch.int64 or indices.dim() != 1:
        indices = check_index_tensor(indices, "indices")  # converts, or raises naming the argument
    n = indices.shape[0]
    if positions is None and n != k:
        raise ValueError(
            f"loss has {k} entries but indices has {n}: pass one loss per index, or positions= "
            "(the rows of the batch the losses belong to) for a selected subset"
        )
    if positions is not None:
        positions = _check_positions(positions, k, n)
    # Distributed: the ranks gather n rows each, so n must be the batch's size on every rank
    # (gloo aborts the process on unequal sizes); checked against the batch the loader fetched.
    distributed = sampler.distributed
    plan, _, scored = sampler.prepare(n, batch=distributed)  # checked before anything changes
    if indices.is_cpu:
        # Our own copy: a caller's CPU tensor can alias memory that changes without torch
        # knowing (torch.from_numpy of a reused array), which no version check would see.
        indices = indices.clone() if indices.dtype is torch.int64 else indices.long()
    rows = indices if positions is None else _on(indices, positions).index_select(0, positions)
    w = _gather_checked(sampler.scores, plan, loss.device, rows)  # before anything changes
    spare = sampler.scores.num_samples
    idx = rows if scored >= n else _unscored(rows, positions, scored, n, spare)
    if positions is not None and distributed:  # every rank gathers n rows, however many it kept
        rows_on = idx.to(positions.device, non_blocking=True)
        idx = torch.full((n,), spare, dtype=torch.int64, device=positions.device).index_copy_(
            0, positions, rows_on
        )
        scores = loss.detach().float().new_zeros(n).index_copy_(0, positions, loss.detach().float())
        sampler.store(idx, scores)
    else:
        sampler.store(idx, loss)
    sampler.commit(n, gathered=True)
    return weighted_mean(loss, w)


def weighted_mean(loss: Tensor, w: Tensor | None) -> Tensor:
    """``mean(loss * w)`` (``w=None``: all 1), reduced in float32 at least: fp16 and bf16 losses come
    back as float32, so a weighted batch overflows no earlier than ``loss.mean()`` does.

    Example:
        >>> half = torch.tensor([50_000.0, 50_000.0], dtype=torch.float16)
        >>> out = weighted_mean(half, torch.tensor([1.0, 2.0]))
        >>> float(out), out.dtype, float((half * torch.tensor([1.0, 2.0]).half()).mean())
        (75000.0, torch.float32, inf)
    """
    wide = loss if loss.dtype.itemsize >= 4 else loss.float()
    return wide.mean() if w is None else (wide * w).mean()


def _gather_checked(table: ScoreTable, plan: Plan, device: torch.device, rows: Tensor) -> Tensor | None:
    """The weights of ``rows`` (``None``: all 1), with the rows checked to be dataset indices.

    On CPU gathering the weights checks the range for free (the message then comes from
    ``check_indices``); elsewhere, an explicit check (asynchronous on CUDA). Sharded: the rows
    must be this rank's (asynchronous on CUDA too).
    """
    w = plan.weights_on(device)
    table.check_owned(rows)
    if w is not None and w.is_cpu and rows.is_cpu:
        try:
            return w.index_select(0, plan.local_rows(rows))
        except (IndexError, RuntimeError):
            table.check_indices(rows)
            raise
    table.check_indices(rows)
    return None if w is None else w.index_select(0, plan.local_rows(_on(rows, w)))


def _check_positions(positions: Any, k: int, n: int) -> Tensor:
    """``positions``: one row of the batch per loss (checked on CPU; on a device at the gather)."""
    positions = check_index_tensor(positions, "positions")
    if positions.shape[0] != k:
        raise ValueError(
            f"loss has {k} entries but positions has {positions.shape[0]}: one position per loss"
        )
    if positions.device.type == "cpu" and k and not 0 <= int(positions.min()) <= int(positions.max()) < n:
        raise IndexError(f"positions must be rows of the batch, in [0, {n})")
    return positions


def _unscored(rows: Tensor, positions: Tensor | None, scored: int, n: int, spare: int) -> Tensor:
    """``rows`` with those past the first ``scored`` rows of the batch sent to the spare slot (padding).

    Example:
        >>> _unscored(torch.tensor([4, 5, 6]), None, scored=2, n=3, spare=9).tolist()
        [4, 5, 9]
    """
    if scored >= n:
        return rows
    if positions is None:
        rows = rows.clone()
        rows[scored:] = spare
        return rows
    return torch.where(positions < scored, rows, spare)


def _on(idx: Tensor, like: Tensor) -> Tensor:
    """``idx`` on ``like``'s device (asynchronously)."""
    return idx if idx.device == like.device else idx.to(like.device, non_blocking=True)
