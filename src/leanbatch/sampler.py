"""``PrunedSampler``: serves each epoch's plan, and owns the run: epochs, plans, what was trained.

As torch's ``DistributedSampler`` owns its epoch, one object holds the epoch, its plan, what was
served and trained (:mod:`leanbatch.ledger`) and the position. An epoch serves the plan's kept
indices in a keyed order; rank ``r`` of ``W`` serves the global positions ``start + r + k W``: a
pure function of (plan, seed, epoch, rank, world, start), with no collective. Training, not
serving, decides the epoch, the position, the plan whose weights apply, the progress and the
checkpoint; planning (:mod:`leanbatch.epochs`) is local and deterministic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from torch import Tensor
from torch.utils.data import Sampler

from leanbatch.checks import check_bool, check_int, check_seed
from leanbatch.distributed.exchange import ScoreExchange, merge_scores
from leanbatch.epochs import check_agreement, plan_epoch
from leanbatch.ledger import Fetches, Iteration, Step, front
from leanbatch.misuse import epochs_over, no_batch, not_served, warn_past_end, warn_skipped, warn_stale_len
from leanbatch.policies.base import Policy
from leanbatch.policies.parts import Comm
from leanbatch.policies.plan import Plan
from leanbatch.progress import Position, training_progress
from leanbatch.ranks import is_distributed, world_and_rank
from leanbatch.sampler_state import Limit, check_layout, check_limit, read_state, served_length, write_state
from leanbatch.scores import ScoreTable

__all__ = ["PrunedSampler"]


class PrunedSampler(Sampler[int]):
    """Serves the plan of each epoch, rank by rank, and keeps the record of what was trained.

    One object serves single-process and DDP training: with ``num_replicas`` > 1 every rank
    computes the same plan (same scores after a merge, same generator) and takes positions
    ``rank, rank + num_replicas, ...`` of its order; shards are padded (wrapping to the start)
    or, with ``drop_last``, truncated to equal length, and the padding is counted in
    :attr:`epoch_stats`. ``num_replicas`` and ``rank`` default to the process group's, read
    when an iteration starts, so the sampler may be built before ``init_process_group``.
    ``shard=False`` serves the whole order on every process (accelerate shards the batches);
    ``shard_scores=True`` plans each rank's own slice of a
    :class:`~leanbatch.distributed.ShardedScores` table.

    An epoch ends when its samples have been *trained*, not fetched. The next epoch is planned
    when an ``iter()`` starts it (or :meth:`plan` or ``len()`` asks for it), never earlier, never
    twice. Epochs advance with :meth:`set_epoch` (on every rank: it merges the ranks' scores), or by
    themselves when an iteration ran to its end. ``len()`` is the latest iteration's until the loop's
    pass is over. The global numpy/torch/python random state is never used.

    Example:
        >>> import torch
        >>> from leanbatch import ScoreTable, InfoBatchPolicy
        >>> table = ScoreTable(8)
        >>> sampler = PrunedSampler(table, InfoBatchPolicy(0.5, num_epochs=2, delta=1.0), seed=0)
        >>> sorted(sampler)                              # nothing scored yet: every sample
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> idx = sampler.take(8).indices                # trained: the losses of these 8 samples
        >>> table.update(idx, idx.float())               # scores 0..7, mean 3.5
        >>> sampler.epoch, len(sampler)                  # len(): epoch 0's (not asked for more since)
        (1, 8)
        >>> order = list(sampler)
        >>> len(sampler), sampler.position
        (5, Position(epoch=1, trained=0, length=5))
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
        check_layout(num_replicas, rank, shard, drop_last, shard_scores, scores, policy)
        self.scores, self.policy = scores, policy
        bind = getattr(policy, "bind", None)
        if callable(bind):  # a policy that reads more of the table than its scores (UCB: the variance)
            bind(scores)
        self.seed = check_seed(seed)
        self.num_epochs = check_int(policy.num_epochs if num_epochs is None else num_epochs, "num_epochs", 1)
        self.chunk_size = chunk_size
        self.num_replicas, self.rank, self.drop_last, self.shard = num_replicas, rank, drop_last, shard
        self.process_group, self.shard_scores = process_group, shard_scores
        self.comm: Comm | None = None  # sharded planning's collectives (default: over process_group)
        self.exchange = ScoreExchange(scores, process_group)  # how the step's rows reach every rank
        self.epoch_stats: list[dict[str, Any]] = []
        self._round = 1  # each rank's share of an epoch is a multiple of this (set_round)
        self.limit: Limit = None  # the samples each rank serves in an epoch (read it; set it: set_limit)
        self._plan: Plan | None = None  # the latest plan; older ones live on in the iterations using them
        self._its: deque[Iteration] = deque()  # iterations with samples that may still be trained
        self._cursor = (0, 0)  # (epoch, global start) served next while no iteration is live
        self._unmerged = False  # trained since the last merge without the rows reaching every rank
        self._merged_at = scores.version  # the table's write count when every rank last agreed
        self._warned: set[str] = set()  # the warnings given (each once a run)
        self._read_after: int | None = None  # a len() read after the latest iteration's last step
        self.fetches = Fetches()  # the batches fetched through the dataset, to check updates against
        self._distributed = False  # read at each iteration's start: steps store every rank's rows

    def _world_rank(self) -> tuple[int, int]:
        """``(world, rank)`` now: the given values, else the process group's (host-side reads)."""
        return world_and_rank(self.num_replicas, self.rank, self.process_group) if self.shard else (1, 0)

    def _local_length(self, plan: Plan, start: int, world: int | None = None) -> int:
        """Samples this rank serves of ``plan`` from ``start`` on, up to its cut (:meth:`set_limit`)."""
        w = self._world_rank()[0] if world is None else world
        return served_length(plan.order_length, plan.epoch, start, w, self._round, self.drop_last, self.limit)

    def set_limit(self, limit: Limit) -> None:
        """Serve at most ``limit(epoch)`` samples on each rank in ``epoch`` (``None``: the whole plan), the
        first of the rank's share: a step budget. ``limit``: a pure function of the epoch, equal on every
        rank; not saved in :meth:`state_dict` (set it again before loading one: a state saved with a limit
        and loaded without one, or the reverse, is refused); ``progress`` counts whole plans.

        Example:
            >>> from leanbatch import RandomPolicy, ScoreTable
            >>> s = PrunedSampler(ScoreTable(10), RandomPolicy(0.0, num_epochs=3), seed=0)
            >>> s.set_limit(lambda epoch: [10, 4, 0][epoch])
            >>> [len(list(s)) for epoch in range(3)]
            [10, 4, 0]
        """
        self.limit = check_limit(limit)

    def set_round(self, size: int, drop_last: bool = False) -> None:
        """Serve every epoch in whole rounds of ``size`` samples per rank (padded, or with ``drop_last``
        truncated), for a framework that shards the *batches* of one global order (accelerate: ``size``
        = processes x batch size), so that it never pads a last round itself from a resumed pass's start.

        Example:
            >>> from leanbatch import InfoBatchPolicy, ScoreTable
            >>> s = PrunedSampler(ScoreTable(10), InfoBatchPolicy(0.5, 2), shard=False)
            >>> s.set_round(4); len(s)
            12
        """
        self._round = check_int(size, "size", 1)
        self.drop_last = check_bool(drop_last, "drop_last")

    def __iter__(self) -> Iterator[int]:
        it = self._begin()
        return iter(()) if it is None else it.serve(self.seed, self.chunk_size, self._asked)

    def __len__(self) -> int:
        """Samples this rank serves in the latest iteration until its loop's pass is over (so it never
        changes inside an epoch, its last batch included); with none (at the start, after
        :meth:`set_epoch`, a resume, or a pass over), in the one the next ``iter()`` begins."""
        latest = self._its[-1] if self._its else None
        if latest is not None and not latest.passed:
            if latest.done or (latest.ran_out and latest.in_flight < latest.batch):  # after its last step
                self._read_after = latest.length  # checked when the next epoch begins
            return latest.length
        epoch, start = self._next()
        if epoch >= self.num_epochs:
            return 0
        return self._local_length(self.plan(), start)

    def epoch_length(self) -> int:
        """Samples this rank serves in the whole epoch training stands in (its trained part included)."""
        if self._next()[0] >= self.num_epochs and self._live() is None:
            return 0
        return self._local_length(self.plan(), 0)

    def _begin(self) -> Iteration | None:
        """Start the iteration a new ``iter()`` serves (``None`` past the last epoch).

        After a fully trained epoch, or one served to its end (a consumer reading ahead across the
        boundary), the next epoch; an abandoned iteration restarts its epoch; after a resume or
        ``set_epoch``, the cursor.
        """
        latest = self._its[-1] if self._its else None
        if latest is not None:
            epoch, start = (latest.epoch + 1 if latest.done or latest.ran_out else latest.epoch), 0
        else:
            epoch, start = self._cursor
        # Keep only iterations that ran to their end with samples still in flight (a consumer
        # that reads ahead across the epoch boundary); an abandoned one's read-ahead is gone.
        kept: deque[Iteration] = deque()
        for x in self._its:
            if x.ran_out and not x.done:
                kept.append(x)
            else:  # it leaves: trained to its end (checked then) or left early
                x.close()
        if len(kept) < len(self._its) or not kept:
            self.fetches.clear(workers=not kept)  # an abandoned iteration's fetches are never trained
        self._its = kept
        self._cursor = (epoch, 0)
        read, self._read_after = self._read_after, None
        if epoch >= self.num_epochs:
            warn_past_end(self._warned, self.num_epochs, epoch)
            return None
        plan = self._plan_of(epoch)
        self._distributed = is_distributed(self.process_group)
        world, rank = self._world_rank()
        it = Iteration(epoch, plan, world, rank, start, self._local_length(plan, start, world))
        if read is not None and read != it.length and latest is not None and epoch > latest.epoch:
            warn_stale_len(self._warned, latest.epoch, read, epoch, it.length)
        self._its.append(it)
        return it

    def _asked(self, it: Iteration) -> None:
        """The loop asked ``it`` for more past its end. Once it is the latest and fully trained, the
        loop's pass is over: ``len()`` is the next epoch's from now on (read at the top of the next
        epoch, without :meth:`set_epoch`), the last epoch's stays."""
        it.passed = it.done and it.epoch + 1 < self.num_epochs
        if it.passed:  # a length read before this was inside the pass (the in-loop idiom): right
            self._read_after = None

    @property
    def ran_out(self) -> bool:
        """The latest ``iter()`` served its last sample and was asked for more (:attr:`epoch` may stay)."""
        return bool(self._its) and self._its[-1].ran_out

    def _live(self) -> Iteration | None:
        """The latest iteration if it is being trained (not fully trained)."""
        return self._its[-1] if self._its and not self._its[-1].done else None

    def _next(self) -> tuple[int, int]:
        """(epoch, global start) where training stands when no iteration is live."""
        it = self._its[-1] if self._its else None
        return (it.epoch + 1, 0) if it is not None else self._cursor

    @property
    def position(self) -> Position:
        """Where training stands: ``Position(epoch, trained, length)`` in the epoch's global order
        (never plans: ``length`` is 0 for an epoch not planned yet)."""
        it = self._live()
        if it is not None:
            return Position(it.epoch, it.plan.kept_before(it.order_position), it.plan.num_kept)
        epoch, start = self._next()
        latest = self._plan
        if latest is not None and latest.epoch == epoch:
            return Position(epoch, latest.kept_before(start), latest.num_kept)
        return Position(epoch, start, 0)

    @property
    def epoch(self) -> int:
        """The epoch training stands in: the one being trained, or the next once it is fully trained."""
        return self.position.epoch

    @property
    def progress(self) -> float:
        """Fraction of training done, counted in trained samples (:func:`~leanbatch.training_progress`)."""
        pos = self.position
        if pos.epoch >= self.num_epochs:
            return 1.0
        return training_progress(
            epoch=pos.epoch, num_epochs=self.num_epochs, batch_idx=pos.trained, batches_per_epoch=pos.length
        )

    def plan(self) -> Plan:
        """The plan of the epoch training stands in: the one whose weights apply to the next batch
        trained (made now if needed; never re-made)."""
        it = self._live()
        return it.plan if it is not None else self._plan_of(self._next()[0])

    def left(self) -> int:
        """Samples of the iteration being trained that are not trained yet (0 without one)."""
        it = self._live()
        return 0 if it is None else it.length - it.trained

    def _plan_of(self, epoch: int) -> Plan:
        """Epoch ``epoch``'s plan: made now if it is not the latest one, never re-made."""
        if self._plan is None or self._plan.epoch != epoch:
            world, rank = self._world_rank()
            stored = self.scores.version != self._merged_at and not self.shard_scores
            check_agreement(world, self.shard, self.process_group, stored, self._unmerged)
            self._plan = None  # let the old plan go before making the new one
            self._plan, stats = plan_epoch(self.policy, self.scores, epoch, self.seed, world, rank,
                                           round_size=self._round, drop_last=self.drop_last,
                                           comm=self.comm, group=self.process_group)  # fmt: skip
            self.epoch_stats = [s for s in self.epoch_stats if s["epoch"] != epoch] + [stats]
        return self._plan

    def _serving(self, n: int, what: str) -> Iteration | None:
        """The iteration whose next ``n`` served samples the next update trains (nothing marked)."""
        its = self._its  # the common step: one iteration, with the batch in flight
        if len(its) == 1 and n <= its[0].served - its[0].trained:
            return its[0]
        it = front(its, n)
        if it is None:
            if self._next()[0] >= self.num_epochs:
                raise RuntimeError(epochs_over(what, self.num_epochs))
            return None
        if n > it.in_flight:
            raise ValueError(not_served(what, n, it.in_flight))
        return it

    def prepare(
        self, n: int, indices: bool = False, batch: bool = False, what: str = "update(loss, indices)"
    ) -> Step:
        """The step that trains the next ``n`` served samples (checked; nothing marked yet): the plan
        that served them, their indices (``indices=True``), how many score. ``batch``: they are one
        fetched batch, so ``n`` is checked against its size. Then :meth:`store` the scores and
        :meth:`commit` the step (without an iteration being served: the current plan; nothing counts).

        Example:
            >>> from leanbatch import InfoBatchPolicy, ScoreTable
            >>> s = PrunedSampler(ScoreTable(6), InfoBatchPolicy(0.5, 2))
            >>> order = list(s)
            >>> step = s.prepare(4, indices=True)
            >>> step.indices.tolist() == order[:4], s.position.trained
            (True, 0)
        """
        it = self._serving(n, what)
        if it is None:
            self._distributed = is_distributed(self.process_group)
            fetched = self.fetches.any
            if indices or fetched:
                raise RuntimeError(no_batch(what, fetched))
            return Step(self.plan(), None, n, n, None)
        if batch:
            self.fetches.check_size(it, n, "loss" if indices else "indices")
        return Step(it.plan, it.peek(n) if indices else None, it.scored(n), n, it)

    def take(self, n: int, gathered: bool = False) -> Step:
        """:meth:`prepare` the next fetched batch of ``n`` served samples (its indices included) and
        :meth:`commit` it at once: for a step that stores its scores after (:meth:`store`, or
        ``table.update(step.indices, losses)`` in a loop of its own)."""
        it = self._serving(n, "update(loss) without indices")
        if it is None:  # the error that says why
            self.prepare(n, indices=True, batch=True, what="update(loss) without indices")
        assert it is not None
        self.fetches.check_batch(it, n)  # checked against the batch fetched, before anything changes
        scored = it.scored(n)  # before the samples are marked
        step = Step(it.plan, it.take(n), scored, n, it)
        if it.account is not None:  # an earlier update named its indices: these count as trained
            it.record(step.indices)
        self._marked(it, n, gathered)
        return step

    @property
    def distributed(self) -> bool:
        """Whether a step's scores go to every rank (a process group of several processes, read when
        an iteration starts, a state loads, or an update finds no iteration)."""
        return self._distributed

    def store(self, indices: Tensor, losses: Tensor) -> None:
        """Store a step's scores, rows checked; in a distributed run every rank stores every rank's
        rows (the same number on every rank), so nothing of them is left to merge: commit with
        ``gathered=True``. A row with index ``num_samples`` scores nothing (padding)."""
        if self._distributed:
            self.exchange.send(indices, losses)
        else:
            self.scores.store(indices, losses, check=False)

    def commit(self, step: Step, gathered: bool = False, indices: Tensor | None = None) -> None:
        """Mark the samples of a :meth:`prepare`-d ``step`` trained (after their scores were stored).
        ``gathered``: their scores reached every rank (:meth:`store`); otherwise, when the epoch ends
        here, the ranks' scores are merged (every rank trains its last sample at the same step).
        ``indices``: those the update named, checked against those served at the iteration's end (not
        with ``shard=False`` under DDP, where a rank trains a share of what it served)."""
        it, n = step.iteration, step.n
        if it is not None:
            if n > it.in_flight:  # marked since it was prepared
                raise ValueError(not_served("commit", n, it.in_flight))
            named = indices if self.shard or not self._distributed else None
            it.record(named, self.scores)
            it.mark(n)
            self._marked(it, n, gathered)

    def _marked(self, it: Iteration, n: int, gathered: bool) -> None:
        """``n`` samples of ``it`` were marked trained: at its end the ranks' scores merge."""
        it.batch = it.batch or n
        self._unmerged = self._unmerged or not gathered
        if it.done:
            self.merge()  # on every rank before any check can raise
            it.close()

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next; merges the ranks' scores (call it on every rank). The epoch
        being served again changes nothing (a resumed epoch keeps its position); any other epoch
        closes the books on the previous iterations; one that skips untrained epochs warns."""
        check_int(epoch, "epoch", 0)
        now = self.position
        nxt = now.epoch + int(now.trained > 0)
        if nxt < epoch and nxt < self.num_epochs:
            warn_skipped(self._warned, epoch, nxt, self.num_epochs)
        self.merge()  # on every rank, before a closing iteration's check can raise
        it = self._its[-1] if self._its else None
        if it is None:
            if epoch != self._cursor[0]:
                self._cursor = (epoch, 0)
        elif epoch != it.epoch or it.ran_out or it.done:
            while self._its:
                self._its.popleft().close()  # the indices trained must be part of those served
            self._cursor = (epoch, 0)

    def merge(self) -> None:
        """Merge what every rank trained since the last merge (a collective in a distributed run: call
        it on every rank, e.g. before saving a checkpoint; a no-op when nothing is new)."""
        if self._unmerged and is_distributed(self.process_group):
            merge_scores(self.scores, self.process_group)
            self._merged_at = self.scores.version
        self._unmerged = False

    def state_dict(self) -> dict[str, Any]:
        """Epoch, global position, the epoch's plan (mid-epoch) and the statistics: plain values.

        Saved as ``epoch``, ``position`` (in the epoch's global order) and ``finished``: a fully
        trained epoch ``e`` is ``(e, its length, True)``, which resumes at ``Position(e + 1, 0, ...)``.
        """
        latest = self._its[-1] if self._its else None
        if latest is not None and latest.done:
            epoch, position, finished, plan = latest.epoch, latest.order_position, True, None
        else:
            epoch, live = self.position.epoch, self._live()
            position = live.order_position if live is not None else self._next()[1]
            plan = latest.plan if latest is not None else self._plan
            keep = plan is not None and plan.epoch == epoch and (position > 0 or plan.trained_before > 0)
            plan, finished = (plan if keep else None), False
        where = (epoch, position, finished, self._world_rank()[0])
        return write_state(self.seed, self.scores.num_samples, where, plan, self.epoch_stats, self.limit)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues the saved epoch at the saved global position.

        The state is checked before anything changes (:func:`~leanbatch.sampler_state.read_state`): a wrong
        key, shape or value is a ``ValueError`` that names it.
        """
        epoch, trained, plan, stats, seed = read_state(state, self.scores, self.limit)
        self.seed = seed
        self.epoch_stats = stats
        self._its.clear()
        self._cursor = (epoch, trained)
        self._unmerged = False
        self._distributed = is_distributed(self.process_group)
        self._merged_at = self.scores.version
        if plan is not None:
            self._plan = plan
