"""What ``run.wrap(dataset, num_epochs)`` returns: the arm's data, its budget, and what it counts.

- A pruning arm gets a :class:`CountedInfoBatch`: the library's :class:`~leanbatch.InfoBatch` with
  the arm's policy and seed, which also counts the steps and rows its ``update()`` trains.
- Every other arm (the baseline, its budgets, batch-level selection) gets a :class:`KeepAll`: the
  same calls (``sampler``, ``set_epoch``, ``update``, ``epoch``, ``progress``, ``num_epochs``,
  ``weights``, ``next_indices``), every sample kept with weight 1, in a fresh uniformly random
  order each epoch (``torch.randperm`` from a generator seeded by the arm's seed, one draw per
  epoch; under torch.distributed each rank serves positions ``rank, rank + world, ...``).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from leanbatch import InfoBatch

__all__ = [
    "Budget",
    "ContractError",
    "Counts",
    "CountedInfoBatch",
    "HookMissing",
    "KeepAll",
    "StudyError",
    "world_size",
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


def world_size() -> int:
    """The processes of torch.distributed's default group (1 outside a distributed run)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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

    def add(self, loss: Any, indices: Any) -> None:
        n = int(len(loss) if indices is None else len(indices))
        self.steps, self.rows = self.steps + 1, self.rows + n


def _indices_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("indices")


class CountedInfoBatch(InfoBatch):
    """:class:`~leanbatch.InfoBatch`, counting the steps and rows its ``update()`` trains (``counts``);
    ``on_step(rows)`` hears of every step before it trains (the run's checks).

    Example:
        >>> ds = CountedInfoBatch(range(8), num_epochs=1, seed=0)
        >>> _ = ds.update(torch.ones(8), torch.tensor(list(ds.sampler)))
        >>> ds.counts.steps, ds.counts.rows
        (1, 8)
    """

    def __init__(self, *args: Any, on_step: Callable[[int], None] = lambda rows: None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.counts, self._on_step = Counts(), on_step

    def update(self, loss: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        indices = _indices_of(args, kwargs)
        self._on_step(int(len(loss) if indices is None else len(indices)))
        out = super().update(loss, *args, **kwargs)
        self.counts.add(loss, indices)
        return out


class _Serving(Sampler[int]):
    """:class:`KeepAll`'s sampler: this rank's share of the epoch's order, cut at the arm's budget."""

    def __init__(self, data: KeepAll):
        self.data = data

    def __iter__(self) -> Iterator[int]:
        return self.data.serve()

    def __len__(self) -> int:
        return self.data.to_serve(self.data.epoch)  # the epoch being served, or the next one

    def set_epoch(self, epoch: int) -> None:
        self.data.set_epoch(epoch)


class KeepAll(Dataset):
    """The data of an arm that keeps every sample: see the module docstring.

    ``batch_size()`` returns the loader's batch size once the task has asked ``run.batch_size``
    (None before); a budget needs it when an epoch is served.

    Example:
        >>> ds = KeepAll(list(range(10)), 2, seed=0, budget=Budget(steps=0.5), batch_size=lambda: 5)
        >>> len(list(ds.sampler)), [float(ds.update(torch.tensor([1.0, 3.0, 2.0, 2.0, 2.0]))) for _ in range(2)]
        (10, [2.0, 2.0])
        >>> ds.progress, ds.num_epochs, len(list(ds.sampler))
        (1.0, 1, 0)
    """

    def __init__(
        self,
        dataset: Any,
        num_epochs: int,
        *,
        seed: int = 0,
        budget: Budget = Budget(),
        batch_size: Callable[[], int | None] = lambda: None,
        on_step: Callable[[int], None] = lambda rows: None,
    ):
        self.dataset, self.seed, self.budget = dataset, seed, budget
        self._num_epochs, self._batch_size, self._on_step = int(num_epochs), batch_size, on_step
        self._samples = len(dataset)
        self.sampler = _Serving(self)
        self.counts = Counts()
        self.served: dict[int, int] = {}  # samples served per epoch (this rank's)
        self.exhausted = False  # the loader fetched the whole of the current epoch
        self._next, self._current, self._trained_in_epoch = 0, -1, 0
        self._epoch_steps, self._served_total, self._checked = 0, 0, -1
        self._drawn: tuple[int, torch.Generator, Tensor] | None = None

    # ------------------------------------------------------------------ the dataset
    def __len__(self) -> int:
        return self._samples

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        many = getattr(self.dataset, "__getitems__", None)
        return list(many(indices)) if callable(many) else [self.dataset[i] for i in indices]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "dataset" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["dataset"], name)

    # ------------------------------------------------------------------ serving
    def _world(self) -> tuple[int, int]:
        import torch.distributed as dist

        return (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)

    def _share(self) -> int:
        return math.ceil(self._samples / self._world()[1])

    def _rows(self) -> int:
        size = self._batch_size()
        if size is None:
            raise StudyError(
                "its budget needs the loader's batch size, and the task never asked run.batch_size(B): build "
                "the DataLoader with batch_size=run.batch_size(B)"
            )
        return size

    def to_serve(self, epoch: int) -> int:
        """Samples this arm serves in ``epoch`` (this process's share)."""
        if not self.budget.limited:
            return self._share() if epoch < self._num_epochs else 0
        return self.budget.served(epoch, self._share(), self._num_epochs, self._rows())

    def _order(self, epoch: int) -> Tensor:
        """Epoch ``epoch``'s order: the ``epoch + 1``-th ``randperm`` of the arm's generator, this rank's share."""
        if self._drawn is None or self._drawn[0] > epoch:
            gen = torch.Generator().manual_seed(self.seed)
            self._drawn = (-1, gen, torch.empty(0, dtype=torch.int64))
        at, gen, perm = self._drawn
        for _ in range(epoch - at):
            perm = torch.randperm(self._samples, generator=gen)
        self._drawn = (epoch, gen, perm)
        rank, world = self._world()
        if world == 1:
            return perm
        padded = torch.cat([perm, perm[: self._share() * world - perm.numel()]])
        return padded[rank::world]

    def serve(self) -> Iterator[int]:
        """The next epoch's indices (this rank's share, cut at the budget): what ``iter(ds.sampler)`` gives."""
        self.end_epoch()  # the epoch before, if it was not checked at its run.log
        epoch = self._next
        self._next, self._current, self._trained_in_epoch, self._epoch_steps = epoch + 1, epoch, 0, 0
        n = self.to_serve(epoch)
        order = self._order(epoch)[:n].tolist()
        self.served[epoch], self._served_total, self.exhausted = n, self._served_total + n, False
        return self._yield(order)

    def _yield(self, order: list[int]) -> Iterator[int]:
        yield from order
        self.exhausted = True  # the loader fetched the whole epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._next = epoch

    # ------------------------------------------------------------------ training
    def update(
        self, loss: Tensor, indices: Tensor | None = None, *, positions: Tensor | None = None
    ) -> Tensor:
        """The mean of ``loss`` (every sample weighs 1); counts one step of ``len(indices)`` rows
        (``len(loss)`` without indices). ``positions``: the rows of the batch the losses are of."""
        if not isinstance(loss, Tensor) or loss.ndim != 1 or not loss.is_floating_point():
            raise ValueError(
                "update() takes the per-sample loss: a 1-D float tensor, e.g. "
                "F.cross_entropy(out, y, reduction='none')"
            )
        rows = int(loss.shape[0] if indices is None else len(indices))
        self._on_step(rows)
        if self.counts.rows + rows > self._served_total:
            raise StudyError(
                f"trained {self.counts.rows + rows} samples but its data served {self._served_total}: pass "
                "sampler=ds.sampler to the DataLoader (not shuffle=True)"
            )
        self.counts.add(loss, indices)
        self._trained_in_epoch += rows
        self._epoch_steps += 1
        return loss.mean()

    def end_epoch(self) -> None:
        """Check the epoch being trained, once, when it has ended (its sampler exhausted, or the next
        begun): its steps are what its served samples make in batches of the arm's rows, or one fewer
        when the loader drops a partial last batch (learned here, once); :class:`StudyError`
        otherwise, for a budget arm."""
        e = self._current
        if e < 0 or self._checked == e or self._batch_size() is None:
            return
        self._checked = e
        n, rows, steps = self.served[e], self.budget.rows(self._rows()), self._epoch_steps
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

    def weights(self, indices: Tensor) -> Tensor:
        """Every sample's loss weight: 1."""
        return torch.ones(indices.shape, dtype=torch.float32, device=indices.device)

    def next_indices(self, n: int) -> Tensor:
        """Not kept by this wrapper: batches that need their indices carry them (``WithIndex``)."""
        raise TypeError("this arm keeps every sample: take the batch's indices from the batch itself")

    @property
    def num_epochs(self) -> int:
        """Epochs the arm serves samples in (fewer than the task's for a budget below 1)."""
        if not self.budget.limited or self._batch_size() is None:
            return self._num_epochs
        return self.budget.epochs(self._share(), self._num_epochs, self._rows())

    @property
    def total_steps(self) -> int | None:
        """The arm's steps when its length is fixed in steps (a budget), else None."""
        if not self.budget.limited:
            return None
        return self.budget.total_steps(self._share(), self._num_epochs, self._rows())

    @property
    def epoch(self) -> int:
        """The epoch training stands in: the one being trained, or the next once it is trained."""
        done = self._current < 0 or self._trained_in_epoch >= self.served.get(self._current, 0)
        return self._next if done else self._current

    @property
    def progress(self) -> float:
        """The fraction of the arm trained: steps / its steps with a budget, else by epochs and samples."""
        total = self.total_steps
        if total is not None:
            return min(1.0, self.counts.steps / total)
        if self._current < 0:
            return 0.0
        served = self.served.get(self._current, 0)
        if self.budget.drop_last:  # the loader never trains a partial last batch
            served -= served % self.budget.rows(self._rows())
        part = min(1.0, self._trained_in_epoch / served) if served else 1.0
        return min(1.0, (self._current + part) / self._num_epochs)
