"""Ranks and random generators: one helper for every part of leanbatch that draws or shards.

- :func:`process_rank` / :func:`world_size` read an initialised ``torch.distributed`` process
  group (the default one, or the ``group`` given), host-side only: no collective, no device.
  Without a process group the rank is 0 and the world 1.
- :class:`Generators` is what an object that draws owns: one private ``torch.Generator`` per
  device, reseeded for every draw from ``mix_seed(seed, rank, *keys)``, so draws are
  reproducible, independent across ranks, resumable from a counter, and never touch the global
  torch, numpy or Python random state. The rank is read from the process group at the first
  draw, not at construction: frameworks build objects before they initialise the group.
  :meth:`Generators.shared` is the draw every rank makes alike (global selection): keyed by
  ``mix_seed(seed, SHARED, *keys)``, :data:`SHARED` in the rank's place.

Example:
    >>> import torch
    >>> g = Generators(seed=7)
    >>> a = torch.rand(2, generator=g.get("cpu", 0))
    >>> b = torch.rand(2, generator=g.get("cpu", 0))
    >>> bool((a == b).all()), g.rank
    (True, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from leanbatch.checks import check_int, check_seed
from leanbatch.permutation import mix_seed

__all__ = [
    "DEFAULT_SEED",
    "SHARED",
    "Generators",
    "all_gather_rows",
    "gather_step",
    "STEP_ROW_BYTES",
    "comm_device",
    "canonical_device",
    "initialized",
    "is_distributed",
    "process_rank",
    "rank_seed",
    "same_group",
    "world_size",
]

DEFAULT_SEED = 1910_00762  # Selective Backprop's arXiv id: unlikely to collide with a user's data seed
SHARED = -1  # the key of draws every rank makes alike, in the rank's place: no rank is negative


def initialized() -> bool:
    """Whether a ``torch.distributed`` process group is initialised in this process.

    Example:
        >>> initialized()
        False
    """
    return dist.is_available() and dist.is_initialized()


def process_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the world) if a process group is initialised, else 0.

    Example:
        >>> process_rank()  # no process group here
        0
    """
    return int(dist.get_rank(group)) if initialized() else 0


def world_size(group: Any = None) -> int:
    """The number of processes in ``group`` (default: the world); 1 without a process group.

    Example:
        >>> world_size()
        1
    """
    return int(dist.get_world_size(group)) if initialized() else 1


def is_distributed(group: Any = None) -> bool:
    """Whether ``group`` (default: the world) is an initialised group of more than one process.

    Example:
        >>> is_distributed()
        False
    """
    return initialized() and dist.get_world_size(group) > 1


def same_group(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` name the same process group (``None``: the default one).

    Example:
        >>> same_group(None, None)
        True
    """
    if a is b:
        return True
    world = dist.group.WORLD if initialized() else None
    return (world if a is None else a) is (world if b is None else b)


def comm_device(group: Any = None) -> torch.device:
    """Where ``group``'s collectives run: the current CUDA device for NCCL, else the CPU.

    Example:
        >>> comm_device()  # no process group: the CPU
        device(type='cpu')
    """
    if initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_rows(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``t`` (the same shape on every rank) from every rank of ``group``, concatenated in rank order.

    One collective, on :func:`comm_device` (asynchronous on a CUDA stream with NCCL). Without a
    process group of several processes, ``t`` itself.

    Example:
        >>> import torch
        >>> all_gather_rows(torch.arange(3)).tolist()
        [0, 1, 2]
    """
    if not is_distributed(group):
        return t
    out, work = _start_gather(t, group)
    work.wait()  # NCCL: the current stream waits, not the host
    return out


def mean_of_writers(
    values: torch.Tensor, written: torch.Tensor, var: torch.Tensor | None = None, group: Any = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row, the mean over the ranks of ``group`` that wrote it (``written``) of their ``values``
    (and ``var``); a row no rank wrote keeps this rank's value. All-reduces, on :func:`comm_device`.

    Each rank adds its value divided by the number of writers, so the sum is their mean and cannot
    overflow float32, however large the values. Without a process group of several processes,
    the rows written keep their values: the mean of one writer.

    Example:
        >>> import torch
        >>> mean_of_writers(torch.tensor([1.0, 2.0]), torch.tensor([True, False]))[0].tolist()
        [1.0, 2.0]
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


def _start_gather(t: torch.Tensor, group: Any) -> tuple[torch.Tensor, Any]:
    """Start all-gathering ``t`` on :func:`comm_device`: the output, and the work to wait on."""
    t = _to_comm(t, comm_device(group)).contiguous()
    out = t.new_empty((world_size(group) * t.shape[0], *t.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return out, gather(out, t, group=group, async_op=True)


def _to_comm(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` on the collectives' device ``dev``: to the CPU from a device, a blocking copy (gloo reads
    it on another thread); to CUDA, queued on the stream."""
    return t.to(dev, non_blocking=dev.type != "cpu")


STEP_ROW_BYTES = 16  # what one row of gather_step sends: an index and a loss, each as a float64


def gather_step(
    indices: torch.Tensor, losses: torch.Tensor, group: Any = None
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
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
    cols = [_to_comm(t, dev).to(torch.float64) for t in (indices, losses.detach())]
    out, work = _start_gather(torch.stack(cols, 1), group)

    def result() -> tuple[torch.Tensor, torch.Tensor]:
        work.wait()
        return out[:, 0].long(), out[:, 1].float()

    return result


def rank_seed(seed: int, rank: int, *more: int) -> int:
    """The seed of ``rank``'s generator: ``mix_seed(seed, rank, *more)`` (a stable splitmix64 hash).

    Example:
        >>> rank_seed(7, 0) != rank_seed(7, 1), rank_seed(7, 1) == rank_seed(7, 1)
        (True, True)
    """
    return mix_seed(seed, rank, *more)


def canonical_device(device: torch.device | str) -> torch.device:
    """``cuda`` -> ``cuda:<current index>``, so one device has one generator.

    Example:
        >>> canonical_device("cpu")
        device(type='cpu')
    """
    dev = torch.device(device)
    if dev.type != "cpu" and dev.index is None:
        backend = getattr(torch, dev.type, None)
        current = getattr(backend, "current_device", None)
        if callable(current):
            dev = torch.device(dev.type, int(current()))
    return dev


class Generators:
    """Private generators of one object: per device, reseeded from ``(seed, rank, *keys)`` per draw.

    Args:
        seed: the object's seed (default :data:`DEFAULT_SEED`).
        rank: the rank whose draws these are; ``None`` reads the rank of ``group`` at the first
            draw (0 without a process group). Pass the data-parallel rank when several
            processes share a batch and must draw alike (tensor or pipeline parallelism).
        group: the process group whose rank is read (default: the world).

    Example:
        >>> import torch
        >>> g0, g1 = Generators(seed=3, rank=0), Generators(seed=3, rank=1)
        >>> torch.equal(torch.rand(3, generator=g0.get("cpu", 5)), torch.rand(3, generator=g1.get("cpu", 5)))
        False
    """

    def __init__(self, seed: int | None = None, rank: int | None = None, group: Any = None):
        self.seed = DEFAULT_SEED if seed is None else check_seed(seed)
        self._given_rank = None if rank is None else check_int(rank, "rank", 0)
        self.group = group
        self._rank: int | None = self._given_rank
        self._by_device: dict[torch.device, torch.Generator] = {}
        self._streams: dict[torch.device, tuple[int, torch.Generator]] = {}  # device -> (rank, generator)

    @property
    def rank(self) -> int:
        """The rank the draws are keyed by (read from the process group once, at first use)."""
        if self._rank is None:
            self._rank = process_rank(self.group)
        return self._rank

    def reset(self, seed: int | None = None, rank: int | None = None) -> None:
        """Use ``seed`` (and ``rank``; ``None``: the process group's, read again) from now on."""
        self.seed = DEFAULT_SEED if seed is None else check_seed(seed)
        self._given_rank = None if rank is None else check_int(rank, "rank", 0)
        self._rank = self._given_rank
        self._streams.clear()

    def get(self, device: torch.device | str, *keys: int) -> torch.Generator:
        """The generator of ``device``, reseeded for ``keys`` (host work only: no device read)."""
        return self._seeded(device, rank_seed(self.seed, self.rank, *keys))

    def shared(self, device: torch.device | str, *keys: int) -> torch.Generator:
        """The generator of ``device``, reseeded for ``keys`` alike on every rank: ``mix_seed(seed,
        SHARED, *keys)`` (host work only). The same generator object as :meth:`get`'s.

        Example:
            >>> import torch
            >>> g0, g1 = Generators(seed=3, rank=0), Generators(seed=3, rank=1)
            >>> torch.equal(torch.rand(3, generator=g0.shared("cpu", 5)), torch.rand(3, generator=g1.shared("cpu", 5)))
            True
        """
        return self._seeded(device, mix_seed(self.seed, SHARED, *keys))

    def _seeded(self, device: torch.device | str, seed: int) -> torch.Generator:
        dev = canonical_device(device)
        gen = self._by_device.get(dev)
        if gen is None:
            gen = self._by_device[dev] = torch.Generator(device=dev)
        return gen.manual_seed(seed)

    def stream(self, device: torch.device | str) -> torch.Generator:
        """The device's continuing stream, seeded once from ``(seed, rank)`` (for callers without a counter).

        The rank is read again on every call (host-side), so a stream first used before the
        process group existed is reseeded for its rank once the group is there.

        Example:
            >>> import torch
            >>> g = Generators(seed=1)
            >>> a, b = torch.rand(1, generator=g.stream("cpu")), torch.rand(1, generator=g.stream("cpu"))
            >>> bool(a != b)
            True
        """
        dev = canonical_device(device)
        rank = process_rank(self.group) if self._given_rank is None else self._given_rank
        seeded = self._streams.get(dev)
        if seeded is None or seeded[0] != rank:
            gen = seeded[1] if seeded is not None else torch.Generator(device=dev)
            gen.manual_seed(rank_seed(self.seed, rank))
            self._streams[dev] = seeded = (rank, gen)
        return seeded[1]
