"""Score rows that travel inside DDP's gradient all-reduce: no collective of their own.

In a distributed run every rank stores every rank's score rows of a step (an index and a loss
each), so that rank 0 alone holds the whole table for a checkpoint. By default that takes one
all-gather a step (:func:`~leanbatch.distributed.collectives.gather_step`), a collective of its own: on CPU with gloo
its fixed latency (0.5-1.4 ms measured) is a few percent of a small model's step. A
:class:`ScoreCarrier` registered on a ``DistributedDataParallel`` model instead appends the
step's rows to the last gradient bucket DDP all-reduces in the backward pass that follows
``update()``: each rank writes its rows into its own slot of a zero block, so the sum *is* the
gather, and the rows cost a few kilobytes more in a collective that runs anyway.

The rows are exact: an index is sent as its four 16-bit words, each an integer exact in float32
and summed with zeros only, so any int64 index arrives whole; a loss is sent as itself (a
float32 added to zeros keeps its value: NaN stays NaN and infinities stay; ``-0.0`` becomes
``0.0``, and a denormal becomes 0 where the process flushes denormals).

The gradients are averaged as DDP's default hook does (divided by the world size, summed).
When a backward does not all-reduce (``no_sync()``, gradient accumulation), a step's rows find
no backward (a skipped step), or the bucket is not float32 (half-precision gradients cannot hold
the chunks), they go by the plain all-gather instead: right away under ``no_sync``, when the next
rows are posted after a skipped step, from the hook for another dtype. Rows are readable once the backward that
carries them has run; reading them before (the table flushed between ``update()`` and
``backward()``) raises an error that says so, rather than waiting for a collective one rank
alone cannot finish.
"""

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leanbatch.distributed.collectives import comm_device, gather_step, to_comm
from leanbatch.ranks import is_distributed

__all__ = ["CARRIED_ROW_BYTES", "ScoreCarrier", "carry_if_ddp"]

_COLS = 5  # an index as its four 16-bit words (exact in float32), then the loss
CARRIED_ROW_BYTES = 4 * _COLS  # what one carried row adds to the all-reduce, per rank


class _Parcel:
    """One step's rows, encoded for the all-reduce (or kept for the all-gather) that sends them: the
    slab is ``(rows, 5)`` float32 on ``device``, flattened, each row an index's four 16-bit words
    (read in place as int16, each exact in float32), then the loss."""

    def __init__(self, indices: Tensor, losses: Tensor, device: torch.device):
        self.indices, self.losses = indices, losses
        words = to_comm(indices, device).long().contiguous().view(torch.int16).view(-1, 4)
        loss = losses.to(device, torch.float32, non_blocking=True).view(-1, 1)
        self.slab = torch.cat([words.to(torch.float32), loss], 1).view(-1)
        self.block: Tensor | None = None  # every rank's slab, (world, rows * 5), once arrived
        self.fallback: Callable[[], tuple[Tensor, Tensor]] | None = None

    def result(self) -> tuple[Tensor, Tensor]:
        if self.block is not None:  # every rank's rows (rank order): int64 indices, float32 losses
            rows = self.block.reshape(-1, _COLS)
            return rows[:, :4].to(torch.int16).view(torch.int64).view(-1), rows[:, 4]
        if self.fallback is not None:
            return self.fallback()
        raise RuntimeError(
            "these scores travel with DDP's gradient all-reduce (ScoreCarrier), which has not run yet: "
            "read the scores (state_dict(), values, a new epoch) after loss.backward(), not between "
            "update() and backward()"
        )


class ScoreCarrier:
    """Carries score rows inside a ``DistributedDataParallel`` model's gradient all-reduce.

    Built on the model (it registers DDP's communication hook, so the model must have none yet,
    and must not have run a backward), usually by :meth:`~leanbatch.InfoBatch.carry_scores`
    (:meth:`.exchange.ScoreExchange.carry`). Every rank must post the same number of rows a step
    (as the all-gather it replaces needs).

    Example (a process group of one; the rows still ride the all-reduce):
        >>> import os, torch, torch.distributed as dist
        >>> from torch.nn.parallel import DistributedDataParallel as DDP
        >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        >>> dist.init_process_group("gloo", rank=0, world_size=1)
        >>> model = DDP(torch.nn.Linear(2, 1))
        >>> carrier = ScoreCarrier(model)
        >>> rows = carrier.post(torch.tensor([7, 2**40]), torch.tensor([0.5, float("inf")]))
        >>> model(torch.ones(2, 2)).sum().backward()   # the rows travel in this all-reduce
        >>> idx, loss = rows()
        >>> idx.tolist(), loss.tolist(), carrier.carried_rows
        ([7, 1099511627776], [0.5, inf], 2)
        >>> del model, carrier; dist.destroy_process_group()
    """

    def __init__(self, model: Any):
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"model must be the DistributedDataParallel wrapper the loop trains through, got "
                f"{type(model).__name__}: ScoreCarrier(DDP(net))"
            )
        # A weak reference: DDP's reducer holds the hook, so a strong one would be a reference cycle,
        # and a replica left to the cycle collector can outlive its process group and abort the
        # process at exit ("terminate called without an active exception").
        self._model = weakref.ref(model)
        self.group = model.process_group
        self._world = dist.get_world_size(self.group)
        self._rank = dist.get_rank(self.group)
        self._device = comm_device(self.group)
        self._outbox: list[_Parcel] = []
        self.carried_rows = 0  # this rank's rows sent inside the gradient all-reduce
        self.gathered_rows = 0  # this rank's rows that went by the plain all-gather instead
        try:
            model.register_comm_hook(None, self._hook)
        except RuntimeError as e:
            raise RuntimeError(
                f"ScoreCarrier registers DDP's communication hook, and this model refused it ({e}): build "
                "the carrier on a model with no comm hook, before its first backward"
            ) from None

    @property
    def model(self) -> Any:
        """The DDP model whose all-reduce carries the rows (``None`` once it is gone)."""
        return self._model()

    def post(self, indices: Tensor, losses: Tensor) -> Callable[[], tuple[Tensor, Tensor]]:
        """Queue one step's rows; returns the call that gives every rank's rows in rank order.

        The rows go with the next backward's all-reduce; under ``no_sync()`` (no all-reduce
        coming) by an all-gather started now. Rows still unsent from an earlier step (a step
        that never ran backward) are sent now by an all-gather: every rank posts at the same
        steps, so these collectives match.
        """
        losses = losses.detach()
        self._send_by_gather(self._outbox)
        self._outbox = []
        model = self._model()
        if model is None or not model.require_backward_grad_sync:  # no all-reduce coming
            return self._gather(indices, losses)
        parcel = _Parcel(indices, losses, self._device)
        self._outbox.append(parcel)
        return parcel.result

    def _send_by_gather(self, parcels: list[_Parcel]) -> None:
        for p in parcels:
            p.fallback = self._gather(p.indices, p.losses)

    def _gather(self, indices: Tensor, losses: Tensor) -> Callable[[], tuple[Tensor, Tensor]]:
        """Rows that go by the plain all-gather instead (counted)."""
        self.gathered_rows += indices.shape[0]
        return gather_step(indices, losses, self.group)

    # real annotations (no ``from __future__ import annotations`` here): DDP compares them
    def _hook(self, _state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's communication hook: average the bucket's gradients (as DDP's default does); the
        last bucket of a backward also carries the rows posted since the previous one."""
        buf = bucket.buffer()
        buf.div_(self._world)
        parcels, self._outbox = (self._outbox, []) if bucket.is_last() else ([], self._outbox)
        if parcels and (buf.dtype != torch.float32 or buf.device != parcels[0].slab.device):
            self._send_by_gather(parcels)  # e.g. half-precision gradients: they cannot hold the chunks
            parcels = []
        if not parcels:
            fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        slab = parcels[0].slab if len(parcels) == 1 else torch.cat([p.slab for p in parcels])
        n, m = buf.numel(), slab.numel()  # this rank's rows go in its slot of a zero block:
        before, after = buf.new_zeros(self._rank * m), buf.new_zeros((self._world - 1 - self._rank) * m)
        full = torch.cat([buf, before, slab, after])
        self.carried_rows += sum(p.indices.shape[0] for p in parcels)

        def arrived(f: torch.futures.Future[list[Tensor]]) -> Tensor:
            out = f.value()[0]
            buf.copy_(out[:n])
            block, start = out[n:].view(self._world, m), 0
            for p in parcels:  # decoded when read, on the reader's thread
                p.block, start = block[:, start : start + p.slab.numel()], start + p.slab.numel()
            return buf

        return dist.all_reduce(full, group=self.group, async_op=True).get_future().then(arrived)


def carry_if_ddp(ds: Any, model: Any) -> ScoreCarrier | None:
    """``ds.carry_scores(model)`` when ``model`` is a ``DistributedDataParallel`` wrapper over several
    processes that takes the hook; else ``None``, and the all-gather stays (one process, FSDP or
    DeepSpeed, or a model with a communication hook of its own). What the adapters call once
    they hold the wrapped model.

    Example:
        >>> import torch
        >>> carry_if_ddp(None, torch.nn.Linear(1, 1)) is None   # not a DDP wrapper: nothing to carry in
        True
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or not is_distributed(model.process_group):
        return None
    try:
        carrier: ScoreCarrier = ds.carry_scores(model)
    except RuntimeError:  # the model has a comm hook of its own (DDP takes one)
        return None
    return carrier
