"""The collectives leanbatch runs over a data-parallel process group, on the group's device.

- :func:`gather_step`: one step's score rows (an index and a loss each) from every rank, one
  all-gather started without waiting (it runs during the backward pass);
- :func:`mean_of_writers`: per row, the mean over the ranks that wrote it (the merge of scores
  written outside :func:`gather_step`);
- :class:`DistComm`: the sums and gathers a sharded plan combines its slices with
  (the :class:`~leanbatch.policies.parts.Comm` of ``torch.distributed``).

Outside an initialised process group of several processes every one of them is the identity.
They run on :func:`comm_device`: the current CUDA device for NCCL, else the CPU.

Example:
    >>> import torch
    >>> DistComm().gather(torch.arange(3)).tolist(), DistComm().sum(torch.tensor([2])).tolist()
    ([[0, 1, 2]], [2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leanbatch.policies.parts import Comm
from leanbatch.ranks import initialized, is_distributed, world_size

__all__ = [
    "STEP_ROW_BYTES",
    "DistComm",
    "comm_device",
    "gather_step",
    "mean_of_writers",
    "to_comm",
]

STEP_ROW_BYTES = 16  # what one row of gather_step sends: an index and a loss, each as a float64


def comm_device(group: Any = None) -> torch.device:
    """Where ``group``'s collectives run: the current CUDA device for NCCL, else the CPU."""
    if initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_comm(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on the collectives' ``device``: to the CPU from a device, a blocking copy (gloo reads it
    on another thread); to CUDA, queued on the stream.
    """
    return t.to(device, non_blocking=device.type != "cpu")


def _start_gather(t: Tensor, group: Any) -> tuple[Tensor, Any]:
    """Start all-gathering ``t`` on :func:`comm_device`: the output, and the work to wait on."""
    t = to_comm(t, comm_device(group)).contiguous()
    out = t.new_empty((world_size(group) * t.shape[0], *t.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return out, gather(out, t, group=group, async_op=True)


def gather_step(indices: Tensor, losses: Tensor, group: Any = None) -> Callable[[], tuple[Tensor, Tensor]]:
    """Start gathering one step's rows (an index and a loss each) from every rank of ``group``.

    Returns a call that waits for the gather and gives every rank's rows in rank order: int64
    indices and float32 losses, on :func:`comm_device`. The two columns travel as one float64
    tensor of shape (rows, 2), exact for any index below 2**53 and for every float32 loss (NaN and
    infinities included): one collective a step, started without waiting, so it runs while the
    caller goes on (the backward pass); on CUDA with NCCL the wait orders streams and never
    blocks the host. Without a process group of several processes, the call gives the input back.

    Example:
        >>> import torch
        >>> idx, loss = gather_step(torch.tensor([4, 2]), torch.tensor([0.5, float("nan")]))()
        >>> idx.tolist(), loss.tolist()
        ([4, 2], [0.5, nan])
    """
    if not is_distributed(group):
        return lambda: (indices, losses)
    dev = comm_device(group)  # float64 there: MPS has none
    cols = [to_comm(t, dev).to(torch.float64) for t in (indices, losses.detach())]
    out, work = _start_gather(torch.stack(cols, 1), group)

    def result() -> tuple[Tensor, Tensor]:
        work.wait()
        return out[:, 0].long(), out[:, 1].float()

    return result


def mean_of_writers(
    values: Tensor, written: Tensor, var: Tensor | None = None, group: Any = None
) -> tuple[Tensor, Tensor | None]:
    """Per row, the mean over the ranks of ``group`` that wrote it (``written``) of their ``values``
    (and ``var``); a row no rank wrote keeps this rank's value. All-reduces, on :func:`comm_device`.

    Each rank adds its value divided by the number of writers, so the sum is their mean and cannot
    overflow float32, however large the values. Without a process group of several processes,
    the rows written keep their values: the mean of one writer.
    """
    dev, shared = comm_device(group), is_distributed(group)
    mine = written.to(dev)
    count = mine.to(torch.float32)
    if shared:
        dist.all_reduce(count, group=group)
    old, n = values.to(dev), count.clamp(min=1)
    parts = [torch.where(mine, old / n, 0.0)]  # a score: this rank's share of the writers' mean
    if var is not None:  # a variance: summed, then divided (one all-reduce for both)
        parts.append(torch.where(mine, var.to(dev), 0.0))
    sums = torch.stack(parts)
    if shared:
        dist.all_reduce(sums, group=group)
    merged = torch.where(count > 0, sums[0], old)
    if var is None:
        return merged, None
    return merged, torch.where(count > 0, sums[1] / n, var.to(dev))


class DistComm(Comm):
    """``torch.distributed`` collectives over ``group``, on its communication device (CUDA for NCCL).

    The :class:`~leanbatch.policies.parts.Comm` a sharded plan combines its slices with; results
    come back on the CPU (planning runs on the host).
    """

    def __init__(self, group: Any = None):
        self.group = group

    def sum(self, t: Tensor) -> Tensor:
        """``all_reduce`` SUM."""
        if not is_distributed(self.group):
            return t
        buf = t.to(comm_device(self.group)).contiguous().clone()
        dist.all_reduce(buf, group=self.group)
        return buf.cpu()

    def gather(self, t: Tensor) -> Tensor:
        """``all_gather``, stacked in rank order: shape ``(W, *t.shape)``."""
        if not is_distributed(self.group):
            return t.cpu().unsqueeze(0)
        out, work = _start_gather(t.reshape(1, -1), self.group)
        work.wait()  # NCCL: the current stream waits, not the host
        return out.cpu().reshape(-1, *t.shape)
