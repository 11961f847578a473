"""``PrunedSampler``: serves each epoch's plan, one plan per epoch.

The sampler asks its policy for a plan once per epoch (from the score table and
a private generator seeded from ``(seed, epoch)``), then serves the kept indices
in a keyed pseudo-random order. The order is a Feistel permutation evaluated
lazily, chunk by chunk, while the epoch is iterated, so planning costs O(N)
vectorised mask arithmetic and no O(N log N) shuffle, and nothing but the kept
indices (4 bytes each) is held between steps.

It also keeps a ledger of what it served, in order, so that a training loop can
call ``update(loss)`` without carrying indices in its batches: the n losses of
the next update belong to the next n served samples. Because the ledger counts
what is *consumed*, not what the loader has fetched, prefetching consumers
(workers, Lightning's prefetching loop, accelerate's one-batch-ahead loader, a
``next()`` ahead) stay aligned.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Sampler

from leanbatch.policies import Plan, Policy
from leanbatch.scores import ScoreTable

__all__ = ["PrunedSampler", "KeyedPermutation", "mix_seed"]

_M64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Hash integers into one 63-bit seed (splitmix64 chain), independent of Python's hash.

    Example:
        >>> mix_seed(0, 1) == mix_seed(0, 1) != mix_seed(1, 0)
        True
    """
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & _M64)) & _M64
        x = (x + 0x9E3779B97F4A7C15) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        x ^= x >> 31
    return x >> 1


class KeyedPermutation:
    """A keyed pseudo-random bijection of ``range(n)``, evaluated on any positions.

    A six-round Feistel network on the smallest even-bit domain holding ``n``,
    with cycle walking back into ``range(n)``. Vectorised; costs O(len(positions)).

    Example:
        >>> import torch
        >>> p = KeyedPermutation(10, key=7)
        >>> sorted(p(torch.arange(10)).tolist()) == list(range(10))
        True
    """

    _C1 = 0x2545F491
    _C2 = 0x5851F42D

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._mask = (1 << self._half) - 1
        self._keys = [mix_seed(key, r) & 0xFFFFFFFF for r in range(6)]

    def _round(self, r: Tensor, k: int) -> Tensor:
        h = (r ^ k) * self._C1
        h ^= h >> 29
        h = (h & 0xFFFFFFFF) * self._C2
        h ^= h >> 32
        return h & self._mask

    def _encrypt(self, x: Tensor) -> Tensor:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ self._round(right, k)
        return (left << self._half) | right

    def __call__(self, positions: Tensor) -> Tensor:
        x = self._encrypt(positions.to(torch.int64))
        out = x >= self.n
        while bool(out.any()):  # CPU only: the sampler runs on the host
            x[out] = self._encrypt(x[out])
            out = x >= self.n
        return x


@dataclass
class _Segment:
    """One iteration over one epoch's plan: what was served and what was consumed."""

    epoch: int
    plan: Plan
    length: int
    consumed: int
    produced: int
    chunks: deque[Tensor] = field(default_factory=deque)
    offset: int = 0  # into chunks[0]
    batch: int = 0  # size of the first update of this iteration
    state: str = "active"  # active | exhausted | closed

    def finished(self) -> bool:
        remaining = self.length - self.consumed
        return self.state != "active" and (remaining == 0 or 0 < remaining < self.batch)


class PrunedSampler(Sampler[int]):
    """Serves the plan of each epoch: the kept indices, shuffled, rank by rank.

    One object serves single-process and DDP training: with ``num_replicas`` > 1
    every rank computes the same plan (same scores after a merge, same generator)
    and takes positions ``rank, rank + num_replicas, ...`` of its order; shards
    are padded (wrapping to the start) or, with ``drop_last``, truncated to equal
    length, and the padding is counted in :attr:`epoch_stats`.

    Epochs advance with :meth:`set_epoch`, or by themselves when an iteration ran
    to its end. ``len()`` and ``iter()`` never re-plan an epoch; ``iter()`` returns
    a fresh generator. The global numpy/torch/python random state is never used.

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable, InfoBatchPolicy
        >>> table = ScoreTable(8)
        >>> sampler = PrunedSampler(table, InfoBatchPolicy(0.5, num_epochs=2, delta=1.0), seed=0)
        >>> sampler.set_epoch(0)
        >>> sorted(sampler) == list(range(8))   # nothing scored yet: all kept
        True
    """

    def __init__(
        self,
        scores: ScoreTable,
        policy: Policy,
        *,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        chunk_size: int = 4096,
    ):
        import torch.distributed as dist

        dist_on = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist_on else 1
        if rank is None:
            rank = dist.get_rank() if dist_on else 0
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.scores = scores
        self.policy = policy
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.chunk_size = chunk_size
        self.epoch = 0
        self.epoch_stats: list[dict[str, Any]] = []
        self.record = True  # keep the ledger for update(loss) without indices
        self._plan: Plan | None = None
        self._perm: KeyedPermutation | None = None
        self._start = 0  # position the next iteration starts at (resume)
        self._base = 0  # position the current iteration started at
        self._advance = False  # the last iteration of self.epoch ran to its end
        self._segments: deque[_Segment] = deque()
        self._claimed = False
        self._explicit = 0  # samples updated with explicit indices in the current iteration
        self._dev_weights: tuple[Plan, torch.device, Tensor] | None = None

    # ------------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next. Setting the current epoch again changes nothing."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = self._base = self._explicit = 0
        self._advance = False

    def _in_flight(self) -> bool:
        """Served samples still awaiting their update() (only known once update() claims)."""
        return self._claimed and any(s.state != "closed" and not s.finished() for s in self._segments)

    def plan(self, starting: bool = False) -> Plan:
        """The plan of the current epoch (made now if needed; never re-made).

        After an iteration ran to its end the epoch advances here, unless samples it
        served still await their ``update()`` (a prefetching consumer asking ``len()``
        before the last batch trained); ``starting`` (a new ``iter()``) always advances.
        """
        if self._advance and (starting or not self._in_flight()):
            self.epoch += 1
            self._start = 0
            self._advance = False
        if self._plan is None or self._plan.epoch != self.epoch:
            self._plan = self._dev_weights = None  # let the old plan go before making the new one
            self._plan = self._make_plan(self.epoch)
        return self._plan

    def _make_plan(self, epoch: int) -> Plan:
        self.scores.sync()
        generator = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 0))
        plan = self.policy(self.scores.values, epoch, generator)
        self._perm = KeyedPermutation(plan.num_kept, mix_seed(self.seed, epoch, 1))
        total = self._local_len(plan) * self.num_replicas
        stats = {
            "epoch": epoch,
            "num_samples": plan.num_samples,
            "kept": plan.num_kept,
            "pruned": plan.num_pruned,
            "threshold": plan.threshold,
            "pruning": plan.pruning,
            "padded": max(0, total - plan.num_kept),
            "dropped": max(0, plan.num_kept - total),
            "nonfinite_so_far": int(self.scores.nonfinite_count),
        }
        self.epoch_stats = [s for s in self.epoch_stats if s["epoch"] != epoch] + [stats]
        return plan

    def _local_len(self, plan: Plan) -> int:
        k, w = plan.num_kept, self.num_replicas
        return k // w if self.drop_last else math.ceil(k / w)

    def __len__(self) -> int:
        return self._local_len(self.plan()) - self._start

    # ------------------------------------------------------------------ serving
    def _indices(self, plan: Plan, start: int, end: int) -> Tensor:
        assert self._perm is not None
        pos = torch.arange(start, end, dtype=torch.int64) * self.num_replicas + self.rank
        pos = self._perm(pos % plan.num_kept)
        return pos if plan.kept is None else plan.kept[pos].to(torch.int64)

    def __iter__(self) -> Iterator[int]:
        plan = self.plan(starting=True)
        seg = _Segment(self.epoch, plan, self._local_len(plan), self._start, self._start)
        self._base, self._start, self._explicit = self._start, 0, 0
        if self.record:
            while self._segments and self._segments[-1].state == "closed":
                self._segments.pop()  # an abandoned iteration: its prefetched batches are gone
            self._segments.append(seg)
        return self._serve(seg)

    def _serve(self, seg: _Segment) -> Iterator[int]:
        done = False
        try:
            while seg.produced < seg.length:
                end = min(seg.produced + self.chunk_size, seg.length)
                idx = self._indices(seg.plan, seg.produced, end)
                if self.record:
                    seg.chunks.append(idx)
                seg.produced = end
                yield from idx.tolist()
            done = True
        finally:
            seg.state = "exhausted" if done else "closed"
            if done and seg.epoch == self.epoch:
                self._advance = True

    # ------------------------------------------------------------------ ledger
    def _front(self, n: int = 0) -> _Segment | None:
        """The segment being consumed, dropping finished or abandoned older ones."""
        segs = self._segments
        while len(segs) > 1:
            s = segs[0]
            remaining = s.length - s.consumed
            if s.state == "closed" or remaining == 0 or (s.state == "exhausted" and remaining < max(n, 1)):
                segs.popleft()
            else:
                break
        return segs[0] if segs else None

    def current_plan(self) -> Plan:
        """The plan of the samples being consumed now (the epoch of the next update)."""
        seg = self._front()
        return seg.plan if seg is not None else (self._plan or self.plan())

    def claim(self, n: int) -> tuple[Tensor, Plan]:
        """Take the dataset indices of the next ``n`` served samples (int64, CPU) and their plan."""
        self._claimed = True
        seg = self._front(n)
        if seg is None:
            raise RuntimeError(
                "update(loss) without indices found no batch served by this sampler: build the "
                "DataLoader with sampler=ds.sampler, or pass indices explicitly: update(loss, indices)"
            )
        if seg.batch and n != seg.batch and seg.consumed + n != seg.length:
            raise ValueError(
                f"loss has {n} entries but the batches of this epoch have {seg.batch}: pass one loss per "
                "sample of the batch (reduction='none', nothing filtered out), or pass indices explicitly"
            )
        if seg.consumed + n > seg.produced:
            raise ValueError(
                f"loss has {n} entries but the sampler has served only {seg.produced - seg.consumed} "
                "samples not yet updated: call update() once per batch with one loss per sample"
            )
        parts = []
        need = n
        while need:
            chunk = seg.chunks[0]
            take = min(need, chunk.numel() - seg.offset)
            parts.append(chunk[seg.offset : seg.offset + take])
            seg.offset += take
            need -= take
            if seg.offset == chunk.numel():
                seg.chunks.popleft()
                seg.offset = 0
        seg.consumed += n
        if not seg.batch:
            seg.batch = n
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), seg.plan

    def note_explicit(self, n: int) -> Plan:
        """Record an update with explicit indices; returns the plan whose weights apply."""
        if not self._claimed and self.record:
            self.record = False  # explicit-index training: no ledger needed
            self._segments.clear()
        self._explicit += n
        return self.current_plan()

    def weights_on(self, plan: Plan, device: torch.device) -> Tensor | None:
        """The plan's per-index weights on ``device`` (copied once per epoch, asynchronously)."""
        if plan.weights is None:
            return None
        cached = self._dev_weights
        if cached is not None and cached[0] is plan and cached[1] == device:
            return cached[2]
        w = plan.weights.to(device, non_blocking=True)
        self._dev_weights = (plan, device, w)
        return w

    def position(self) -> tuple[int, int, int, bool]:
        """(epoch, samples consumed in it, its length on this rank, finished) of the current iteration."""
        seg = self._front()
        if seg is not None:
            pos = seg.consumed if self.record else seg.consumed + self._explicit
            return seg.epoch, pos, seg.length, seg.finished()
        plan = self._plan
        length = self._local_len(plan) if plan is not None and plan.epoch == self.epoch else 0
        pos = length if self._advance else self._base + self._explicit
        return self.epoch, pos, length, self._advance

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Epoch, position inside it, its plan and the statistics: tensors and plain values."""
        epoch, pos, _, finished = self.position()
        seg = self._front()
        plan = seg.plan if seg is not None else self._plan
        plan_state = None
        if plan is not None and plan.epoch == epoch:
            plan_state = {
                "epoch": plan.epoch,
                "num_samples": plan.num_samples,
                "kept": plan.kept,
                "weights": plan.weights,
                "threshold": plan.threshold,
                "pruning": plan.pruning,
            }
        return {
            "seed": self.seed,
            "num_samples": self.scores.num_samples,
            "epoch": epoch,
            "position": pos,
            "finished": finished,
            "plan": plan_state,
            "epoch_stats": [dict(s) for s in self.epoch_stats],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues the saved epoch at the saved position."""
        if state.get("num_samples") != self.scores.num_samples:
            raise ValueError(
                f"state_dict is for a dataset of {state.get('num_samples')} samples, this sampler serves "
                f"{self.scores.num_samples}: load a checkpoint made with the same dataset"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.epoch_stats = [dict(s) for s in state["epoch_stats"]]
        p = state.get("plan")
        self._plan = None
        if p is not None:
            self._plan = Plan(
                int(p["epoch"]), int(p["num_samples"]), p["kept"], p["weights"], p["threshold"], p["pruning"]
            )
            self._perm = KeyedPermutation(self._plan.num_kept, mix_seed(self.seed, self._plan.epoch, 1))
        self._advance = bool(state["finished"])
        self._start = 0 if self._advance else int(state["position"])
        self._base = self._start
        self._segments.clear()
        self._explicit = 0
        self._dev_weights = None
