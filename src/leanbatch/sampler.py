"""``PrunedSampler``: serves each epoch's plan, one plan per epoch.

The sampler asks its policy for a plan once per epoch (from the score table and
a private generator seeded from ``(seed, epoch)``), then serves the kept indices
in a keyed pseudo-random order. The order is a Feistel permutation evaluated
lazily, chunk by chunk, while the epoch is iterated, so planning costs O(N)
vectorised mask arithmetic and no O(N log N) shuffle, and nothing but the kept
indices (4 bytes each) is held between steps.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's
one-batch-ahead shard), so "served" and "trained" differ. The sampler keeps a
ledger per iteration: what it served, in order, and how much of it updates have
trained. Training, not serving, decides everything that matters: the weights of a
batch come from the plan of the iteration that served it, ``len()`` and the plan
stay those of the epoch being trained until all of it is trained, and
``state_dict`` saves the trained position, so a resumed run serves again what had
been read ahead but not trained. ``update(loss)`` without indices reads the
indices of the next n served samples off the ledger; an update with explicit
indices just counts n.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Sampler

from leanbatch.ledger import Iteration
from leanbatch.permutation import KeyedPermutation, mix_seed
from leanbatch.policies import Plan, Policy
from leanbatch.scores import ScoreTable

__all__ = ["PrunedSampler", "KeyedPermutation", "mix_seed"]  # the last two live in permutation


class PrunedSampler(Sampler[int]):
    """Serves the plan of each epoch: the kept indices, shuffled, rank by rank.

    One object serves single-process and DDP training: with ``num_replicas`` > 1
    every rank computes the same plan (same scores after a merge, same generator)
    and takes positions ``rank, rank + num_replicas, ...`` of its order; shards
    are padded (wrapping to the start) or, with ``drop_last``, truncated to equal
    length, and the padding is counted in :attr:`epoch_stats`. ``num_replicas`` and
    ``rank`` default to the process group's, read when an epoch is planned, so the
    sampler may be built before ``init_process_group``.

    An epoch ends when its samples have been *trained*, not when they have been
    fetched: loaders read ahead, so the sampler keeps a ledger of what each
    iteration served and counts what :meth:`claim` (or :meth:`consume`, for updates
    with explicit indices) took off it. The epoch being trained decides ``len()``,
    :meth:`plan`, the weights and the checkpointed position; the next epoch is
    planned when an ``iter()`` starts it, or when ``len()`` is read after the whole
    previous epoch has been trained, never earlier, so reading a length never changes
    what is trained. Epochs advance with :meth:`set_epoch`, or by themselves when an
    iteration ran to its end. ``iter()`` returns a fresh generator and never re-plans
    an epoch. The global numpy/torch/python random state is never used.

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable, InfoBatchPolicy
        >>> table = ScoreTable(8)
        >>> sampler = PrunedSampler(table, InfoBatchPolicy(0.5, num_epochs=2, delta=1.0), seed=0)
        >>> sorted(sampler)                              # nothing scored yet: every sample
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> idx, plan = sampler.claim(8)                 # trained: the losses of these 8 samples
        >>> table.update(idx, idx.float())               # scores 0..7, mean 3.5
        >>> sampler.epoch, len(sampler)                  # epoch 1 is planned now: 0..3 may be pruned
        (1, 4)
        >>> order = list(sampler)
        >>> sorted(order), sampler.plan().weights.tolist()   # kept below the mean: weight 1 / (1 - 0.5)
        ([4, 5, 6, 7], [2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
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
        process_group: Any = None,
        shard: bool = True,
        chunk_size: int = 4096,
    ):
        if num_replicas is not None and (
            isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1
        ):
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if rank is not None:
            bound = num_replicas if num_replicas is not None else None
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0 or (bound and rank >= bound):
                raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.scores = scores
        self.policy = policy
        bind = getattr(policy, "bind", None)
        if callable(bind):  # a policy that reads more of the table than its scores (UCB: the variance)
            bind(scores)
        self.seed = seed
        self.drop_last = drop_last
        self.process_group = process_group
        self.chunk_size = chunk_size
        if not isinstance(shard, bool):
            raise TypeError(f"shard must be a bool, got {shard!r}")
        if not shard and (num_replicas not in (None, 1) or rank not in (None, 0)):
            raise ValueError(
                "shard=False serves the whole plan on every process (the framework shards the batches), "
                f"so num_replicas/rank do not apply: got num_replicas={num_replicas!r}, rank={rank!r}"
            )
        self.shard = shard
        self._given = (num_replicas, rank) if shard else (1, 0)
        self.num_replicas, self.rank = 1, 0
        self._resolve_ranks()
        self.epoch_stats: list[dict[str, Any]] = []
        self._epoch = 0  # what the next iter() serves, unless the last iteration ran to its end
        self._start = 0
        self._its: deque[Iteration] = deque()  # iterations with samples that may still be trained
        self._plan: Plan | None = None
        self._restored = False  # _plan came from load_state_dict and the ranks were not read since
        self._dev_weights: tuple[Plan, torch.device, Tensor] | None = None

    # ------------------------------------------------------------------ ranks
    def _resolve_ranks(self) -> None:
        import torch.distributed as dist

        dist_on = dist.is_available() and dist.is_initialized()
        world, rank = self._given
        if world is None:
            world = dist.get_world_size(self.process_group) if dist_on else 1
        if rank is None:
            rank = dist.get_rank(self.process_group) if dist_on else 0
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, num_replicas={world}), got {rank!r}")
        self.num_replicas, self.rank = world, rank

    def _check_merge(self) -> None:
        """Refuse to plan from scores the other ranks never saw (shards would overlap or miss)."""
        import torch.distributed as dist

        dist_on = dist.is_available() and dist.is_initialized()
        if dist_on:
            world = dist.get_world_size(self.process_group)
            if self.shard and world != self.num_replicas:
                raise ValueError(
                    f"num_replicas={self.num_replicas} but the process group has {world} processes: "
                    "every rank must plan from the same merged scores; leave num_replicas/rank unset to "
                    "read them from the group, or pass process_group= (the data-parallel group)"
                )
        elif self.num_replicas > 1 and self.scores.unmerged:
            raise RuntimeError(
                f"num_replicas={self.num_replicas} but torch.distributed is not initialised, so the scores "
                "this rank stored cannot be merged with the other ranks' before planning (each rank would "
                "plan a different epoch and the shards would overlap or miss samples): call "
                "torch.distributed.init_process_group() before training, or drop num_replicas/rank"
            )

    # ------------------------------------------------------------------ epochs
    @property
    def epoch(self) -> int:
        """The epoch training stands in: the one being trained, or next once it is fully trained."""
        return self._where()[0]

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next.

        Setting the epoch being served again changes nothing (a resumed epoch keeps its
        position); any other epoch closes the books on the previous iterations.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        it = self._its[-1] if self._its else None
        if it is None:
            if epoch != self._epoch:
                self._epoch, self._start = epoch, 0
        elif epoch != it.epoch or it.ran_out or it.done:
            self._its.clear()
            self._epoch, self._start = epoch, 0

    def _where(self) -> tuple[int, int, Iteration | None]:
        """(epoch, position, iteration) where training stands; the iteration if one is being trained."""
        it = self._its[-1] if self._its else None
        if it is not None:
            if not it.done:
                return it.epoch, it.trained, it
            return it.epoch + 1, 0, None  # fully trained: the next iter() serves the next epoch
        return self._epoch, self._start, None

    def plan(self) -> Plan:
        """The plan of the epoch training stands in (made now if needed; never re-made)."""
        epoch, _, it = self._where()
        return it.plan if it is not None else self._plan_for(epoch)

    def current_plan(self) -> Plan:
        """The plan whose weights apply to the next batch trained (same as :meth:`plan`)."""
        return self.plan()

    def _plan_for(self, epoch: int) -> Plan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = self._dev_weights = None  # let the old plan go before making the new one
            self._plan = self._make_plan(epoch)
        elif self._restored:  # a plan from load_state_dict: read the ranks as planning would have
            self._restored = False
            self._resolve_ranks()
        return self._plan

    def _make_plan(self, epoch: int) -> Plan:
        self._resolve_ranks()
        self._check_merge()
        self.scores.sync(self.process_group)
        generator = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 0))
        plan = self.policy(self.scores.values, epoch, generator)
        if plan.num_kept < 1:
            raise RuntimeError(f"the policy planned an empty epoch {epoch}: a Policy must keep >= 1 sample")
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
        epoch, pos, it = self._where()
        if it is not None:
            return it.length - it.start
        return self._local_len(self._plan_for(epoch)) - pos

    # ------------------------------------------------------------------ serving
    def _indices(self, it: Iteration, start: int, end: int) -> Tensor:
        assert it.perm is not None
        pos = torch.arange(start, end, dtype=torch.int64) * self.num_replicas + self.rank
        pos = it.perm(pos % it.plan.num_kept)
        return pos if it.plan.kept is None else it.plan.kept[pos].to(torch.int64)

    def __iter__(self) -> Iterator[int]:
        epoch, start, it = self._where()
        if it is not None and it.ran_out:
            epoch, start = epoch + 1, 0  # ran to its end: the epoch advances by itself
        elif it is not None:  # a new iter() of the epoch being served restarts it
            epoch, start = it.epoch, 0
        # Keep only iterations that ran to their end with samples still in flight (a consumer
        # that reads ahead across the epoch boundary); an abandoned one's read-ahead is gone.
        self._its = deque(x for x in self._its if x.ran_out and not x.done)
        plan = self._plan_for(epoch)
        key = mix_seed(self.seed, epoch, 1)
        new = Iteration(epoch, plan, key, self._local_len(plan), start, start, start)
        self._epoch, self._start = epoch, 0
        self._its.append(new)
        return self._serve(new)

    def _serve(self, it: Iteration) -> Iterator[int]:
        while it.served < it.length:
            end = min(it.served + self.chunk_size, it.length)
            idx = self._indices(it, it.served, end)
            it.add(idx)
            yield from idx.tolist()
        it.ran_out = True

    # ------------------------------------------------------------------ the ledger
    def _front(self, n: int) -> Iteration | None:
        """The iteration the next ``n`` trained samples come from.

        An older iteration (one a consumer reading ahead across epochs has not finished
        training) keeps receiving updates while they fit in what it has in flight; what it
        served but nobody trained (a DataLoader's ``drop_last`` remainder) is left behind.
        """
        its = self._its
        if not its:
            return None
        while len(its) > 1 and (its[0].done or its[0].served - its[0].trained < n):
            its.popleft()
        return its[0]

    def serving(self, n: int, what: str = "update(loss, indices)") -> Iteration | None:
        """The iteration whose next ``n`` served samples the next update trains (nothing marked).

        ``None`` when no iteration of this sampler is being trained (a loop that does not draw
        from it); an error when fewer than ``n`` served samples await their update.
        """
        it = self._front(n)
        if it is None:
            return None
        if n > it.served - it.trained:
            raise ValueError(
                f"{what}: {n} samples but the sampler has served only {it.served - it.trained} samples "
                "not yet updated: call update() once per batch with one loss per sample (reduction='none'), "
                "or pass positions= for a selected subset of the batch"
            )
        return it

    def claim(self, n: int) -> tuple[Tensor, Plan]:
        """Mark the next ``n`` served samples trained; their dataset indices (int64, CPU) and plan."""
        it = self.serving(n, "update(loss) without indices")
        if it is None:
            raise RuntimeError(
                "update(loss) without indices found no batch served by this sampler: build the DataLoader "
                "with sampler=ds.sampler (and iterate it), or pass indices explicitly: update(loss, indices)"
            )
        if it.batch and n != it.batch and it.trained + n != it.length:
            raise ValueError(
                f"loss has {n} entries but the batches of this epoch have {it.batch}: pass one loss per "
                "sample of the batch (reduction='none', nothing filtered out), or pass indices explicitly"
            )
        it.batch = it.batch or n
        idx = it.take(n, indices=True)
        assert idx is not None
        return idx, it.plan

    def consume(self, n: int) -> Plan:
        """Mark the next ``n`` served samples trained (an update that carries its own indices).

        Returns the plan that served them; without an iteration of this sampler being trained,
        nothing is counted and the current plan is returned.
        """
        it = self.serving(n)
        if it is None:
            return self.plan()
        it.take(n, indices=False)
        return it.plan

    def peek(self, n: int) -> Tensor:
        """The dataset indices (int64, CPU) of the next ``n`` served samples, without marking them."""
        it = self.serving(n, "next_indices()")
        if it is None:
            raise RuntimeError(
                "next_indices() found no batch served by this sampler: build the DataLoader with "
                "sampler=ds.sampler and fetch the batch first"
            )
        return it.peek(n)

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
        """(epoch, samples trained in it, its length on this rank, finished) where training stands."""
        it = self._its[-1] if self._its else None
        if it is not None:
            return it.epoch, it.trained, it.length, it.done
        if self._start == 0:
            return self._epoch, 0, 0, False  # nothing trained yet: no need to plan for a length
        return self._epoch, self._start, self._local_len(self._plan_for(self._epoch)), False

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Epoch, position inside it, its plan and the statistics: tensors and plain values.

        The position counts *trained* samples: what a loader read ahead is served again on resume.
        """
        epoch, pos, _, finished = self.position()
        it = self._its[-1] if self._its else None
        plan = it.plan if it is not None else self._plan
        plan_state = None
        if plan is not None and plan.epoch == epoch and not finished:
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
        self.epoch_stats = [dict(s) for s in state["epoch_stats"]]
        finished = bool(state["finished"])
        self._epoch = int(state["epoch"]) + int(finished)
        self._start = 0 if finished else int(state["position"])
        self._its.clear()
        self._plan = self._dev_weights = None
        p = state.get("plan")
        if p is not None and not finished:
            self._plan = Plan(
                int(p["epoch"]), int(p["num_samples"]), p["kept"], p["weights"], p["threshold"], p["pruning"]
            )
            self._restored = True
