"""``TrainingRecord``: what has been *trained*, one owner for where training stands.

Loaders read ahead (worker processes, Lightning's prefetching loop, accelerate's one batch
ahead), so "served", "consumed" and "trained" differ. The record keeps a ledger per iteration
of what the sampler served (:class:`~leanbatch.ledger.Iteration`) and counts what updates
took off it. Training, not serving, decides everything that matters: the epoch, the position
inside it, the plan whose weights apply to the next batch, the progress, the epoch's end and
the checkpointed position.

One position type, one convention: :class:`Position` ``(epoch, trained, length)`` counts
samples in the epoch's *global* order (all ranks together), and a fully trained epoch ``e``
reads ``Position(e + 1, 0, ...)``. Because the position is global, a checkpoint resumes on any
number of ranks.

The record is where ranks meet: when an epoch's last sample is trained (every rank at the same
step, shards being equal) and at ``set_epoch``, it merges the ranks' scores (a collective, in a
distributed run only). Planning, serving and ``len()`` then need no collective.

Example:
    >>> import torch
    >>> from leanbatch import InfoBatchPolicy, PrunedSampler, ScoreTable
    >>> sampler = PrunedSampler(ScoreTable(6), InfoBatchPolicy(0.5, num_epochs=2), seed=0)
    >>> record = sampler.record
    >>> order = list(sampler)                  # served; nothing trained yet
    >>> record.position, record.progress
    (Position(epoch=0, trained=0, length=6), 0.0)
    >>> step = record.take(4, indices=True)    # a batch of 4 trained (prepare, then commit)
    >>> step.indices.tolist() == order[:4], record.position.trained, round(record.progress, 3)
    (True, 4, 0.333)
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

from torch import Tensor

from leanbatch.checks import check_int
from leanbatch.ledger import Fetches, Iteration, Position, Step
from leanbatch.planner import EpochPlanner
from leanbatch.policies import Plan
from leanbatch.progress import training_progress
from leanbatch.rng import is_distributed
from leanbatch.sharding import Sharding

__all__ = ["Position", "Step", "TrainingRecord"]


class TrainingRecord:
    """The ledger, the position and the epochs of one training run; see the module docstring.

    Args:
        planner: makes each epoch's plan (and knows the seed and the sharding).
        num_epochs: the run's length; an epoch past it serves nothing (with a warning) and
            an update past it is an error.
    """

    def __init__(self, planner: EpochPlanner, num_epochs: int):
        self.planner = planner
        self.num_epochs = check_int(num_epochs, "num_epochs", 1)
        self._its: deque[Iteration] = deque()  # iterations with samples that may still be trained
        self._cursor = (0, 0)  # (epoch, global start) served next while no iteration is live
        self._unmerged = False  # trained since the last merge (the same on every rank)
        self._warned_past_end = False
        self.fetches = Fetches()  # the sizes of the batches a DataLoader fetched through the dataset

    @property
    def sharding(self) -> Sharding:
        """How epochs are split between ranks (the planner's)."""
        return self.planner.sharding

    @property
    def distributed(self) -> bool:
        """Whether training runs in a process group of several processes (read now, host-side)."""
        return is_distributed(self.sharding.process_group)

    # ------------------------------------------------------------------ where
    def _live(self) -> Iteration | None:
        """The latest iteration if it is being trained (not fully trained)."""
        it = self._its[-1] if self._its else None
        return it if it is not None and not it.done else None

    def _next(self) -> tuple[int, int]:
        """(epoch, global start) where training stands when no iteration is live."""
        it = self._its[-1] if self._its else None
        return (it.epoch + 1, 0) if it is not None else self._cursor

    @property
    def position(self) -> Position:
        """Where training stands (never plans: ``length`` is 0 for an epoch not planned yet)."""
        it = self._live()
        if it is not None:
            return Position(it.epoch, it.global_trained, it.plan.num_kept)
        epoch, start = self._next()
        latest = self.planner.latest
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
        """The plan of the epoch training stands in (made now if needed; never re-made)."""
        it = self._live()
        if it is not None:
            return it.plan
        self._check_merged()
        return self.planner.plan(self._next()[0])

    def local_length(self) -> int:
        """Samples this rank serves in the iteration being trained, or in the next one.

        Past the last epoch nothing is planned or served, and the length stays the last
        iteration's (a loop that divides by ``len(loader)`` after its last update keeps working).
        """
        it = self._live()
        if it is not None:
            return it.length
        epoch, start = self._next()
        if epoch >= self.num_epochs:
            return self._its[-1].length if self._its else 0
        return self.sharding.local_length(self.plan().order_length, start)

    def left(self) -> int:
        """Samples of the iteration being trained that are not trained yet (0 without one)."""
        it = self._live()
        return 0 if it is None else it.length - it.trained

    def set_round(self, size: int, drop_last: bool = False) -> None:
        """Serve every epoch in whole rounds of ``size`` samples per rank: padded, wrapping to the
        epoch's start, or with ``drop_last`` truncated.

        For a framework that shards the *batches* of one global order (accelerate: ``size`` =
        processes x batch size): it then never pads the last round itself, from the start of
        its current pass, which after a mid-epoch resume is not the epoch's start.
        """
        self.sharding.multiple = check_int(size, "size", 1)
        self.sharding.drop_last = bool(drop_last)

    def epoch_length(self) -> int:
        """Samples this rank serves in the whole epoch training stands in (its trained part included)."""
        if self._next()[0] >= self.num_epochs and self._live() is None:
            return 0
        return self.sharding.local_length(self.plan().order_length, 0)

    # ------------------------------------------------------------------ serving
    def begin(self) -> Iteration | None:
        """Start the iteration a new ``iter()`` serves (``None`` past the last epoch).

        After a fully trained epoch, or one that was served to its end (a consumer reading
        ahead across the boundary), the next epoch; an abandoned iteration restarts its epoch;
        after a resume or ``set_epoch``, the cursor.
        """
        latest = self._its[-1] if self._its else None
        if latest is not None and (latest.done or latest.ran_out):
            epoch, start = latest.epoch + 1, 0
        elif latest is not None:
            epoch, start = latest.epoch, 0
        else:
            epoch, start = self._cursor
        # Keep only iterations that ran to their end with samples still in flight (a consumer
        # that reads ahead across the epoch boundary); an abandoned one's read-ahead is gone.
        kept = deque(x for x in self._its if x.ran_out and not x.done)
        if len(kept) < len(self._its) or not kept:
            self.fetches.clear()  # what was fetched for an abandoned iteration is never trained
        self._its = kept
        self._cursor = (epoch, 0)
        if epoch >= self.num_epochs:
            self._warn_past_end(epoch)
            return None
        self._check_merged()
        plan = self.planner.plan(epoch)
        world, rank = self.sharding.resolve()
        it = Iteration(
            epoch, plan, world, rank, start, self.sharding.local_length(plan.order_length, start, world)
        )
        self._its.append(it)
        return it

    def _warn_past_end(self, epoch: int) -> None:
        if not self._warned_past_end:
            self._warned_past_end = True
            warnings.warn(
                f"all {self.num_epochs} epochs (num_epochs={self.num_epochs}) are trained: epoch {epoch} "
                "serves nothing (training on would run at progress 1.0, where a ProgressLR schedule is "
                "at its end); build the wrapper with num_epochs= the number of epochs you train",
                RuntimeWarning,
                stacklevel=4,
            )

    # ------------------------------------------------------------------ training
    def _front(self, n: int) -> Iteration | None:
        """The iteration the next ``n`` trained samples come from.

        An older iteration (one a consumer reading ahead across epochs has not finished
        training) keeps receiving updates while they fit in what it has in flight; what it
        served but nobody trained (a DataLoader's ``drop_last`` remainder) is left behind.
        """
        its = self._its
        while len(its) > 1 and (its[0].done or its[0].in_flight < n):
            its.popleft()
        return its[0] if its else None

    def serving(self, n: int, what: str = "update(loss, indices)") -> Iteration | None:
        """The iteration whose next ``n`` served samples the next update trains (nothing marked).

        ``None`` when no iteration is being served (a loop that does not draw from the
        sampler); an error when fewer than ``n`` served samples await their update, or when
        every epoch is trained already.
        """
        it = self._front(n)
        if it is None:
            if self._next()[0] >= self.num_epochs:
                raise RuntimeError(
                    f"{what}: all {self.num_epochs} epochs are trained (num_epochs={self.num_epochs}); "
                    "build the wrapper with num_epochs= the number of epochs you train"
                )
            return None
        if n > it.in_flight:
            raise ValueError(
                f"{what}: {n} samples but the sampler has served only {it.in_flight} samples "
                "not yet updated: call update() once per batch with one loss per sample (reduction='none'), "
                "or pass positions= for a selected subset of the batch"
            )
        return it

    def prepare(
        self,
        n: int,
        indices: bool = False,
        batch: bool = False,
        what: str = "update(loss, indices)",
        subject: str = "loss",
    ) -> Step:
        """The step that trains the next ``n`` served samples: checked, nothing marked yet.

        Returns the plan that served them, their dataset indices (``indices=True``) and how many
        of them score. ``batch``: the ``n`` samples are one batch a DataLoader fetched (one
        ``update()``), so ``n`` is checked against the batch's size (see :meth:`fetched`; the error
        says ``subject`` has ``n`` entries). Store
        the step's scores, then :meth:`commit` it. Without an iteration being served, the
        current plan is returned and committing counts nothing.
        """
        it = self.serving(n, what)
        if it is None:
            if indices:
                raise RuntimeError(
                    f"{what} found no batch served by this sampler: build the DataLoader with "
                    "sampler=ds.sampler (and iterate it), or pass indices explicitly: update(loss, indices)"
                )
            return Step(self.plan(), None, n)
        if batch:
            self.fetches.check(it, n, implicit=indices, subject=subject)
        return Step(it.plan, it.peek(n) if indices else None, it.scored(n))

    def commit(self, n: int, merged: bool = False) -> None:
        """Mark the next ``n`` served samples trained (after their scores were stored).

        ``merged``: their scores were stored on every rank (gathered), so nothing of them is left
        to merge. Otherwise, when the epoch ends here, the ranks' scores are merged: every rank
        trains its last sample at the same step, shards being equal.
        """
        it = self.serving(n)
        if it is None:
            return
        self.fetches.trained()
        it.batch = it.batch or n
        it.take(n, indices=False)
        self._unmerged = self._unmerged or not merged
        if it.done:
            self.merge()

    def take(self, n: int, indices: bool = False) -> Step:
        """:meth:`prepare` and :meth:`commit` at once (when no scores are stored in between)."""
        step = self.prepare(n, indices)
        self.commit(n)
        return step

    def claim(self, n: int) -> tuple[Tensor, Plan]:
        """The dataset indices and plan of the next batch of ``n``, marked trained (checked as a batch)."""
        step = self.prepare(n, indices=True, batch=True, what="update(loss) without indices")
        self.commit(n)
        assert step.indices is not None
        return step.indices, step.plan

    def peek(self, n: int) -> Tensor:
        """The dataset indices (int64, CPU) of the next ``n`` served samples, without marking them."""
        it = self.serving(n, "next_indices()")
        if it is None:
            raise RuntimeError(
                "next_indices() found no batch served by this sampler: build the DataLoader with "
                "sampler=ds.sampler and fetch the batch first"
            )
        return it.peek(n)

    # ------------------------------------------------------------------ epochs and ranks
    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next; merges the ranks' scores (call it on every rank).

        Setting the epoch being served again changes nothing (a resumed epoch keeps its
        position); any other epoch closes the books on the previous iterations.
        """
        check_int(epoch, "epoch", 0)
        it = self._its[-1] if self._its else None
        if it is None:
            if epoch != self._cursor[0]:
                self._cursor = (epoch, 0)
        elif epoch != it.epoch or it.ran_out or it.done:
            self._its.clear()
            self._cursor = (epoch, 0)
        self.merge()

    def merge(self) -> None:
        """Merge what every rank trained since the last merge (a collective in distributed runs: call
        it on every rank, e.g. before saving a checkpoint; a no-op when nothing is new)."""
        group = self.sharding.process_group
        if self._unmerged and is_distributed(group):
            self.planner.scores.sync(group)
        self._unmerged = False

    def _check_merged(self) -> None:
        if self._unmerged and is_distributed(self.sharding.process_group):
            raise RuntimeError(
                "the scores trained since the last merge are not merged with the other ranks' yet, so "
                "this rank would plan a different epoch: call set_epoch(epoch) on every rank at the start "
                "of each epoch (as with DistributedSampler), which merges them"
            )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Epoch, global position, the epoch's plan (mid-epoch) and the statistics: plain values.

        Saved as ``epoch``, ``position`` (in the epoch's global order) and ``finished``: a fully
        trained epoch ``e`` is ``(e, its length, True)``, which resumes at ``Position(e + 1, 0, ...)``.
        """
        latest = self._its[-1] if self._its else None
        if latest is not None and latest.done:
            return self._state(latest.epoch, latest.order_position, True, None)
        epoch, live = self.position.epoch, self._live()
        trained = live.order_position if live is not None else self._next()[1]
        plan = latest.plan if latest is not None else self.planner.latest
        keep = plan is not None and plan.epoch == epoch and (trained > 0 or plan.done > 0)
        return self._state(epoch, trained, False, plan if keep else None)

    def _state(self, epoch: int, position: int, finished: bool, plan: Plan | None) -> dict[str, Any]:
        return {
            "version": 2,
            "seed": self.planner.seed,
            "num_samples": self.planner.scores.num_samples,
            "epoch": epoch,
            "position": position,  # in the epoch's global order (all ranks); version 1 counted this rank's
            "finished": finished,
            "world": self.sharding.resolve()[0],
            "plan": None if plan is None else plan.state_dict(),
            "epoch_stats": self.planner.state_dict()["epoch_stats"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues the saved epoch at the saved global position."""
        from leanbatch.state import record_state  # validation of a loaded state

        epoch, trained, plan, stats, seed = record_state(
            state, self.planner.scores.num_samples, self.sharding
        )
        self.planner.seed = seed
        self.planner.load_state_dict({"epoch_stats": stats})
        self._its.clear()
        self._cursor = (epoch, trained)
        self._unmerged = False
        if plan is not None:
            self.planner.restore(plan)
