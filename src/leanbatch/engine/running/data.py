"""What ``run.wrap(dataset, num_epochs)`` returns: the arm's data, its budget, and what it counts.

Every arm gets a :class:`CountedInfoBatch`: the library's :class:`~leanbatch.InfoBatch`, with the
arm's seed, which also counts the steps and rows its ``update()`` trains. For a pruning arm it
prunes by the arm's policy; for every other arm (the baseline, its budgets, batch-level selection)
it keeps every sample with weight 1 (nothing pruned: ``update`` returns the plain mean), in the
sampler's keyed random order, fresh each epoch (under torch.distributed rank ``r`` serves the
positions ``r, r + world, ...``), and the arm's budget is a setting of that sampler
(:meth:`~leanbatch.PrunedSampler.set_limit`: the samples each rank serves in an epoch).

A :class:`Budget` is the arithmetic of the baseline's step and batch budgets (AlgoPerf's
``step_hint`` is the same idea: the steps a workload's schedule is laid over). With ``S`` the
steps of a full epoch, a step budget ``b`` trains ``T = round(b x num_epochs x S)`` steps, and a
batch budget ``c`` trains the full run's ``num_epochs x S`` steps on batches of ``round(c x B)``
rows; the last epoch stops where the steps run out, later epochs serve nothing, and ``progress``
(what :class:`~leanbatch.ProgressLR` reads) is ``steps / T``, so the schedule ends at the arm's
own end. ``S`` counts the steps the task's loader really makes: a loader that drops its last
partial batch (``drop_last=True``) shows it at the end of the arm's first whole epoch, and from
there ``S`` leaves that batch out.

What the task trains is checked as it trains, and a breach every arm shares stops the whole study
(:class:`StudyError`): a step larger than ``run.batch_size(B)`` gave, samples trained that the
arm's sampler never served, an epoch whose steps are not what its samples make in batches of
``run.batch_size(B)`` (a budget the loop cannot train).

>>> b = Budget(steps=0.5)
>>> b.total_steps(100, 4, 32), b.epochs(100, 4, 32), [b.served(e, 100, 4, 32) for e in range(4)]
(8, 2, [100, 100, 0, 0])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from leanbatch import InfoBatch
from leanbatch.checks import check_per_sample_loss
from leanbatch.ranks import world_size

__all__ = [
    "Budget",
    "ContractError",
    "Counts",
    "CountedInfoBatch",
    "HookMissing",
    "StudyError",
]


class ContractError(ValueError):
    """A task broke the run contract (a budget not trained, a wrong return value): one line; the engine
    names the arm and the seed before it."""


class StudyError(ContractError):
    """A breach of the contract that every arm of the study shares (no metric, batches larger than
    ``run.batch_size``, a budget the loop cannot train, a missing hook): the study stops at its
    first sign, and nothing is judged."""


class HookMissing(ContractError):
    """A batch-level arm the user did not ask for (a default method) trained a step without the
    selection hook (``run.select``): the arm is left out of the study."""


def _round(x: float) -> int:
    return math.floor(x + 0.5)  # halves up, as the budgets were always rounded


@dataclass(frozen=True)
class Budget:
    """A baseline's budget: ``steps`` of the full run's steps, or its steps on ``batch`` of the batch size.

    ``min_batch``: a last batch of an epoch with fewer rows is not trained (2 for a model that
    normalises by batch statistics), so it does not count as a step; ``drop_last``: the loader
    leaves out every partial last batch.

    Example:
        >>> Budget(batch=0.5).rows(32), Budget(batch=0.5).total_steps(100, 4, 32), Budget().total_steps(100, 4, 32)
        (16, 16, None)
        >>> Budget(steps=0.5).total_steps(100, 4, 32), Budget(steps=0.5, drop_last=True).total_steps(100, 4, 32)
        (8, 6)
    """

    steps: float = 1.0
    batch: float = 1.0
    min_batch: int = 1
    drop_last: bool = False

    @property
    def limited(self) -> bool:
        """The arm trains a fixed number of steps (a step or batch budget), not ``num_epochs`` epochs."""
        return self.steps != 1.0 or self.batch != 1.0

    def rows(self, batch_size: int) -> int:
        """Rows per step: ``round(batch x batch_size)``."""
        return batch_size if self.batch == 1.0 else _round(self.batch * batch_size)

    def steps_per_epoch(self, samples: int, rows: int) -> int:
        """Steps that train ``samples`` in batches of ``rows`` (a last batch below ``min_batch`` left out).

        Example:
            >>> Budget(min_batch=2).steps_per_epoch(201, 8), Budget().steps_per_epoch(201, 8)
            (25, 26)
        """
        rest = samples % rows
        if self.drop_last:
            return samples // rows
        return math.ceil(samples / rows) - int(samples > 1 and 0 < rest < self.min_batch)

    def total_steps(self, samples: int, num_epochs: int, batch_size: int) -> int | None:
        """The arm's steps (None: it trains ``num_epochs`` epochs): at least one."""
        if not self.limited:
            return None
        full = self.steps_per_epoch(samples, batch_size)
        return max(1, _round(self.steps * num_epochs * full))

    def epochs(self, samples: int, num_epochs: int, batch_size: int) -> int:
        """Epochs the arm serves samples in."""
        total = self.total_steps(samples, num_epochs, batch_size)
        if total is None:
            return num_epochs
        return math.ceil(total / self.steps_per_epoch(samples, self.rows(batch_size)))

    def served(self, epoch: int, samples: int, num_epochs: int, batch_size: int) -> int:
        """Samples the arm serves in ``epoch``: all, the last epoch's share of its steps, or none."""
        total = self.total_steps(samples, num_epochs, batch_size)
        if total is None:
            return samples if epoch < num_epochs else 0
        rows = self.rows(batch_size)
        per_epoch = self.steps_per_epoch(samples, rows)
        left = total - epoch * per_epoch
        return 0 if left <= 0 else samples if left >= per_epoch else min(samples, left * rows)


class Counts:
    """Steps and rows a wrapper's ``update()`` trained."""

    def __init__(self) -> None:
        self.steps = self.rows = 0

    def add(self, rows: int) -> None:
        self.steps, self.rows = self.steps + 1, self.rows + rows


class CountedInfoBatch(InfoBatch):
    """:class:`~leanbatch.InfoBatch`, counting the steps and rows its ``update()`` trains (``counts``);
    ``on_step(rows)`` hears of every step before it trains (the run's checks).

    ``budget``: an arm that keeps every sample (nothing pruned, weight 1), with that budget: each
    epoch's sampler serves :meth:`to_serve` samples on this rank, and what it trains is checked (see
    the module docstring). ``batch_size()``: the loader's batch size once the task has asked
    ``run.batch_size`` (None before); a budget needs it when an epoch is served.

    Example:
        >>> import torch
        >>> ds = CountedInfoBatch(range(8), num_epochs=1, seed=0)
        >>> _ = ds.update(torch.ones(8), torch.tensor(list(ds.sampler)))
        >>> ds.counts.steps, ds.counts.rows
        (1, 8)
        >>> ds = CountedInfoBatch(range(10), 2, seed=0, budget=Budget(steps=0.5), batch_size=lambda: 5)
        >>> len(list(ds.sampler)), [float(ds.update(torch.tensor([1.0, 3.0, 2.0, 2.0, 2.0]))) for _ in range(2)]
        (10, [2.0, 2.0])
        >>> ds.progress, ds.num_epochs, ds.served, len(list(ds.sampler))
        (1.0, 1, {0: 10}, 0)
    """

    def __init__(
        self,
        dataset: Any,
        num_epochs: int,
        *args: Any,
        on_step: Callable[[int], None] = lambda rows: None,
        budget: Budget | None = None,
        batch_size: Callable[[], int | None] = lambda: None,
        **kwargs: Any,
    ):
        if budget is not None:  # nothing pruned
            args, kwargs = (0.0,), {**kwargs, "policy": "random"}
        super().__init__(dataset, num_epochs, *args, **kwargs)
        self.counts, self._on_step = Counts(), on_step
        self.budget, self._batch_size, self._task_epochs = budget, batch_size, int(num_epochs)
        self._cut: dict[int, int] = {}  # a budget's samples served in each epoch, this rank's
        self._steps: dict[int, int] = {}  # steps trained in each epoch (an arm that keeps every sample)
        self._checked = -1  # the latest epoch checked (end_epoch)
        if budget is not None and budget.limited:
            self.sampler.set_limit(self.to_serve)

    def update(self, loss: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """:meth:`InfoBatch.update`, counted; a call the library refuses (a reduced loss, indices
        that do not match the batch, ...) breaks the contract every arm shares, so it stops the study
        (:class:`StudyError`, the library's own message) instead of failing each arm in turn."""
        try:
            indices = args[0] if args else kwargs.get("indices")
            if type(loss) is not Tensor or loss.dim() != 1:
                check_per_sample_loss(loss)  # raises, naming the fix, before anything is counted
            rows = int(len(loss) if indices is None else len(indices))
            self._on_step(rows)
            if self.budget is not None:
                if rows > self.sampler.left() and self.counts.rows + rows > (n := sum(self.served.values())):
                    raise StudyError(
                        f"trained {self.counts.rows + rows} samples but its data served {n}: pass "
                        "sampler=ds.sampler to the DataLoader (not shuffle=True)"
                    )
                self._steps[self.sampler.epoch] = self._steps.get(self.sampler.epoch, 0) + 1
            out = super().update(loss, *args, **kwargs)
        except ContractError:
            raise
        except (TypeError, ValueError, RuntimeError) as e:
            raise StudyError(f"update(): {e}") from e
        self.counts.add(rows)
        return out

    # ------------------------------------------------------------------ an arm that keeps every sample
    def _share(self) -> int:
        return math.ceil(len(self) / world_size())

    def _rows(self) -> int:
        size = self._batch_size()
        if size is None:
            raise StudyError(
                "its budget needs the loader's batch size, and the task never asked run.batch_size(B): build "
                "the DataLoader with batch_size=run.batch_size(B)"
            )
        return size

    def to_serve(self, epoch: int) -> int:
        """Samples the arm serves in ``epoch`` (this process's share): what its sampler serves, fixed when
        the epoch is first served (the epoch before checked first: its loader's steps may change the
        budget's arithmetic), and the sampler's epochs then the budget's, if more."""
        assert self.budget is not None, "to_serve() is an arm's that keeps every sample"
        if not self.budget.limited:
            return self._share() if epoch < self._task_epochs else 0
        if epoch not in self._cut:
            self.end_epoch()
            self._cut[epoch] = self.budget.served(epoch, self._share(), self._task_epochs, self._rows())
            self.sampler.num_epochs = max(self._task_epochs, self.num_epochs)  # a budget above 1: more
        return self._cut[epoch]

    @property
    def served(self) -> dict[int, int]:
        """Samples served in each epoch planned (this rank's), for an arm that keeps every sample."""
        return {int(s["epoch"]): self.to_serve(int(s["epoch"])) for s in self.epoch_stats}

    def end_epoch(self) -> None:
        """Check the epoch last trained, once, when the loader's pass over it is over: its steps are what
        its served samples make in batches of the arm's rows, or one fewer when the loader drops a
        partial last batch (learned here, once); :class:`StudyError` otherwise, for a budget arm."""
        e = max(self._steps, default=-1)
        if self.budget is None or e <= self._checked or self._batch_size() is None:
            return
        if self.sampler.epoch == e and not self.sampler.ran_out:
            return  # still being trained
        self._checked = e
        n, rows, steps = self.to_serve(e), self.budget.rows(self._rows()), self._steps[e]
        if steps == self.budget.steps_per_epoch(n, rows):
            return
        if not self.budget.drop_last and n % rows and steps == n // rows:
            self.budget = dataclasses.replace(self.budget, drop_last=True)  # the loader's own count
            return
        if not self.budget.limited:
            return  # no budget rests on its steps
        raise StudyError(
            f"epoch {e} trained {steps} steps where its {n} samples make {self.budget.steps_per_epoch(n, rows)} "
            f"batches of {rows} (run.batch_size): its budget cannot be trained; build the DataLoader with "
            "batch_size=run.batch_size(B), sampler=ds.sampler, one update() per batch"
        )

    @property
    def num_epochs(self) -> int:
        """Epochs the arm serves samples in (fewer than the task's for a budget below 1)."""
        budget = self.budget
        if budget is None or not budget.limited or self._batch_size() is None:
            return self._task_epochs
        return budget.epochs(self._share(), self._task_epochs, self._rows())

    @property
    def total_steps(self) -> int | None:
        """The arm's steps when its length is fixed in steps (a budget), else None."""
        if self.budget is None or not self.budget.limited:
            return None
        return self.budget.total_steps(self._share(), self._task_epochs, self._rows())

    @property
    def progress(self) -> float:
        """The fraction of the arm trained: steps / its steps with a budget, or once the loader is seen to
        drop its partial last batches (its epochs' whole batches); else the sampler's."""
        total = self.total_steps
        if total is None and self.budget is not None and self.budget.drop_last:
            total = self._task_epochs * self.budget.steps_per_epoch(self._share(), self._rows())
        return super().progress if total is None else min(1.0, self.counts.steps / total)
