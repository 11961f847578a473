"""``PrunedSampler``: serves each epoch's plan; what it yields is a pure function of the plan.

An epoch serves the plan's kept indices in a keyed pseudo-random order: global position ``p``
holds ``kept[perm(p mod K)]``, where ``perm`` is a Feistel permutation keyed by ``(seed,
epoch)`` and evaluated lazily, chunk by chunk, on the positions this rank serves (see
:mod:`leanbatch.sharding`). So what a rank yields is a pure function of (plan, seed, epoch,
rank, world, where the iteration starts), no O(N log N) shuffle is made, and nothing but the
plan's kept indices is held between steps. ``len()`` is arithmetic, and neither runs a
collective.

What has been *trained* is not the sampler's business: it hands every chunk it serves to its
:class:`~leanbatch.record.TrainingRecord` (``sampler.record``), which keeps the ledger, the
position, the epochs and the merges. The sampler's ``claim``/``consume``/``plan``/``position``/
``state_dict`` methods are the record's, kept here under their first names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor
from torch.utils.data import Sampler

from leanbatch.ledger import Iteration
from leanbatch.permutation import KeyedPermutation, mix_seed  # noqa: F401 -- re-exported
from leanbatch.planner import EpochPlanner
from leanbatch.policies import Plan, Policy
from leanbatch.record import Position, TrainingRecord
from leanbatch.scores import ScoreTable
from leanbatch.sharding import Sharding

__all__ = ["PrunedSampler", "KeyedPermutation", "mix_seed", "serve"]  # the middle two live in permutation


def serve(plan: Plan, seed: int, positions: Tensor) -> Tensor:
    """The dataset indices (int64) at global ``positions`` of ``plan``'s epoch (padding wraps around).

    Example:
        >>> import torch
        >>> from leanbatch.policies import full_plan
        >>> order = serve(full_plan(0, 5), seed=0, positions=torch.arange(7))
        >>> sorted(order[:5].tolist()), torch.equal(order[5:], order[:2])
        ([0, 1, 2, 3, 4], True)
    """
    return plan.serve(seed, positions)


class PrunedSampler(Sampler[int]):
    """Serves the plan of each epoch: the kept indices, shuffled, rank by rank.

    One object serves single-process and DDP training: with ``num_replicas`` > 1 every rank
    computes the same plan (same scores after a merge, same generator) and takes positions
    ``rank, rank + num_replicas, ...`` of its order; shards are padded (wrapping to the start)
    or, with ``drop_last``, truncated to equal length, and the padding is counted in
    :attr:`epoch_stats`. ``num_replicas`` and ``rank`` default to the process group's, read
    when an iteration starts, so the sampler may be built before ``init_process_group``.

    An epoch ends when its samples have been *trained*, not when they have been fetched: the
    :attr:`record` decides ``len()``, :meth:`plan`, the weights and the checkpointed position.
    The next epoch is planned when an ``iter()`` starts it, or when ``len()`` is read after
    the whole previous epoch has been trained, never earlier. Epochs advance with
    :meth:`set_epoch` (call it on every rank in a distributed run: it merges the ranks'
    scores), or by themselves when an iteration ran to its end. ``iter()`` returns a fresh
    generator and never re-plans an epoch. The global numpy/torch/python random state is never used.

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
        (1, 5)
        >>> order = list(sampler)
        >>> sorted(order), sampler.plan().weights.tolist()   # kept below the mean: weight 1 / (1 - 0.5)
        ([3, 4, 5, 6, 7], [2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
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
        num_epochs: int | None = None,
        shard_scores: bool = False,
    ):
        sharding = Sharding(num_replicas, rank, drop_last, process_group, shard, scores_sharded=shard_scores)
        if shard_scores:
            _check_sharded(scores, policy)
        elif scores.slice.world > 1:
            raise ValueError(
                "this score table holds one rank's slice (world > 1): pass shard_scores=True to the sampler"
            )
        planner = EpochPlanner(scores, policy, seed, sharding)
        self.record = TrainingRecord(planner, policy.num_epochs if num_epochs is None else num_epochs)
        self.chunk_size = chunk_size

    # ------------------------------------------------------------------ serving
    def __iter__(self) -> Iterator[int]:
        it = self.record.begin()
        return iter(()) if it is None else self._serve(it)

    def _serve(self, it: Iteration) -> Iterator[int]:
        seed = self.record.planner.seed
        while it.served < it.length:
            count = min(self.chunk_size, it.length - it.served)
            positions = Sharding.positions(it.origin, it.rank, count, it.world, first=it.served)
            idx = serve(it.plan, seed, positions)
            it.add(idx)
            yield from idx.tolist()
        it.ran_out = True

    def __len__(self) -> int:
        return self.record.local_length()

    # ------------------------------------------------------------------ the record, under its first names
    @property
    def scores(self) -> ScoreTable:
        """The score table plans are made from."""
        return self.record.planner.scores

    @property
    def policy(self) -> Policy:
        """The pruning policy (settable)."""
        return self.record.planner.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.record.planner.policy = policy

    @property
    def seed(self) -> int:
        """Seeds every epoch's plan and order."""
        return self.record.planner.seed

    @property
    def process_group(self) -> Any:
        """The data-parallel process group (``None``: the world)."""
        return self.record.sharding.process_group

    @property
    def shard(self) -> bool:
        """Whether each rank serves its own shard (``False``: the whole order on every process)."""
        return self.record.sharding.shard

    @property
    def epoch_stats(self) -> list[dict[str, Any]]:
        """One statistics dict per planned epoch (see :attr:`leanbatch.InfoBatch.epoch_stats`)."""
        return self.record.planner.epoch_stats

    @property
    def epoch(self) -> int:
        """The epoch training stands in: the one being trained, or next once it is fully trained."""
        return self.record.epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next (see :meth:`TrainingRecord.set_epoch`)."""
        self.record.set_epoch(epoch)

    def plan(self) -> Plan:
        """The plan of the epoch training stands in (made now if needed; never re-made)."""
        return self.record.plan()

    def current_plan(self) -> Plan:
        """The plan whose weights apply to the next batch trained (same as :meth:`plan`)."""
        return self.record.plan()

    def position(self) -> Position:
        """Where training stands: ``Position(epoch, trained, length)`` in the epoch's global order."""
        return self.record.position

    def claim(self, n: int) -> tuple[Tensor, Plan]:
        """Mark the next ``n`` served samples trained; their dataset indices (int64, CPU) and plan."""
        return self.record.claim(n)

    def consume(self, n: int) -> Plan:
        """Mark the next ``n`` served samples trained (an update that carries its own indices); their plan."""
        return self.record.take(n).plan

    def peek(self, n: int) -> Tensor:
        """The dataset indices (int64, CPU) of the next ``n`` served samples, without marking them."""
        return self.record.peek(n)

    def state_dict(self) -> dict[str, Any]:
        """The record's state: epoch, global position, the epoch's plan, the statistics."""
        return self.record.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues the saved epoch at the saved position."""
        self.record.load_state_dict(state)


def _check_sharded(scores: ScoreTable, policy: Policy) -> None:
    """Refuse ``shard_scores=True`` with a policy that cannot plan a slice."""
    if not callable(getattr(policy, "plan_slice", None)):
        raise ValueError(
            f"shard_scores=True plans each rank's slice of the index space, which {type(policy).__name__} "
            "cannot do (it has no plan_slice; LossRankPolicy needs every score in one place to rank them): "
            "use InfoBatchPolicy, RandomPolicy, RS2Policy, EpsilonGreedyPolicy, UCBPolicy or SeTaPolicy, "
            "or leave shard_scores off"
        )
