"""What the engine records of a run (one :class:`EpochRecord` per ``run.log``, one :class:`RunRecord`
per arm and seed), and what it cost on each clock.

Everything here is counted by the engine itself, task-free: the clock (training only), and from
the arm's data wrapper and selection hook the samples served (``loaded``), the rows forwarded and
backpropagated in training steps, the rows a selection pass scored (``select_forwarded``), the
optimizer steps, and what was served but never trained (``dropped``). A task adds its own numbers
through ``run.log(epoch=, metric=, **values)`` (per epoch) and ``run.note(**values)`` (per run).

The clocks (:data:`CLOCKS`) a run's cost is read on: ``work``, the FLOP-weighted passes it made (a
training forward 1, a backward 2, a selection pass ``scale`` of a forward, the work a task charged
with ``run.charge`` at its cost) as a share of the full baseline's (:func:`work_scale`): a function
of the training alone, the same on any machine; ``wall``, its training wall-clock; ``cpu``, the
process's CPU time over the same spans.

>>> e = EpochRecord(0, 90.0, 1.0, 1.0, steps=1, loaded=100, forwarded=100, backpropagated=100)
>>> r = RunRecord("baseline", "baseline", 0, 90.0, [e], 1.0, 1.0, num_samples=100, num_epochs=1)
>>> r.totals()["work_fraction"], r.cost("work"), r.cost("wall")
(1.0, 1.0, 0.0)
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AXES", "CLOCKS", "EpochRecord", "RunRecord", "work_scale"]

CLOCKS = ("work", "wall", "cpu")
AXES = {  # each clock's column head, axis label and number format
    "work": ("work", "work (share of the full baseline's FLOP-weighted passes)", ".3f"),
    "wall": ("time s", "training wall-clock (s, evaluation excluded)", ".1f"),
    "cpu": ("cpu s", "training CPU time (s, evaluation excluded)", ".1f"),
}
_COUNTS = ("loaded", "forwarded", "select_forwarded", "backpropagated")


@dataclass
class EpochRecord:
    """One ``run.log`` of a run. Times are cumulative seconds of training; counts are this epoch's."""

    epoch: int
    metric: float | None
    train_time_s: float  # training wall-clock so far (run.untimed() blocks and other arms' turns excluded)
    train_cpu_time_s: float  # the process's CPU time over the same spans
    steps: int = 0  # optimizer steps (training batches through the wrapper)
    loaded: int = 0  # samples the arm's data served
    forwarded: int = 0  # rows in training forward passes
    select_forwarded: int = 0  # rows scored by a selection pass (charged at the arm's scale**2)
    backpropagated: int = 0
    dropped: int = 0  # served but not trained (a batch below the wrapper's min_batch)
    threshold: float | None = None  # a pruning arm's threshold this epoch (InfoBatch's: the mean score)
    pruning: bool | None = None
    values: dict[str, float] = field(default_factory=dict)  # the task's other numbers of this epoch


@dataclass
class RunRecord:
    """One finished run of an arm at a seed: its final metric (what the task returned), its curve,
    the clock, and the work: ``num_samples`` x ``num_epochs`` is the full run's (what the task
    passed to ``run.wrap``; None without a wrapper), ``charged`` the work a task added with
    ``run.charge`` (a holdout model's samples and their cost)."""

    method: str
    kind: str
    seed: int
    metric: float
    epochs: list[EpochRecord]
    budget: float = 1.0
    batch: float = 1.0
    train_time_s: float = 0.0
    train_cpu_time_s: float = 0.0
    untimed_s: float = 0.0
    num_samples: int | None = None
    num_epochs: int | None = None
    scale: float = 1.0  # a selection pass's cost, as a share of a forward (scale_factor ** 2)
    charged: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # the run's totals (unlogged steps too)
    histograms: list[dict[str, Any]] = field(default_factory=list)
    load_avg: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def _passes(self, n: dict[str, float]) -> float:
        """FLOP-weighted passes of counts ``n``, in forwards: a backward 2, a selection pass ``scale``."""
        return n["forwarded"] + n["select_forwarded"] * self.scale + 2.0 * n["backpropagated"]

    def _charged(self) -> float:
        c = self.charged
        return c.get("cost", 1.0) * (c.get("forwarded", 0.0) + 2.0 * c.get("backpropagated", 0.0))

    def totals(self) -> dict[str, float | None]:
        """Fractions of the full run's work (``num_epochs x num_samples`` samples forward and backward);
        None without a wrapper. A backward pass costs two forwards, a selection pass ``scale`` of one.

        Example:
            >>> e = EpochRecord(0, 90.0, 1.0, 1.0, 1, 100, 50, 100, 50)
            >>> r = RunRecord("sb", "sb", 0, 90.0, [e], num_samples=100, num_epochs=1, scale=0.25)
            >>> {k: round(v, 3) for k, v in r.totals().items()}
            {'loaded_fraction': 1.0, 'forward_fraction': 1.5, 'backward_fraction': 0.5, 'work_fraction': 0.583}
        """
        keys = ("loaded_fraction", "forward_fraction", "backward_fraction", "work_fraction")
        if not self.num_samples or not self.num_epochs:
            return dict.fromkeys(keys)
        full = float(self.num_samples * self.num_epochs)
        n = {k: float(self.counts.get(k, sum(getattr(e, k) for e in self.epochs))) for k in _COUNTS}
        c = self.charged
        fwd = n["forwarded"] + c.get("forwarded", 0.0) + n["select_forwarded"]
        bwd = n["backpropagated"] + c.get("backpropagated", 0.0)
        work = (self._passes(n) + self._charged()) / (3.0 * full)
        return dict(zip(keys, (n["loaded"] / full, fwd / full, bwd / full, work), strict=True))

    def cost(self, clock: str, scale: float = 1.0) -> float | None:
        """The run's cost on ``clock`` (:data:`CLOCKS`): ``work`` as a share of ``scale`` (the full
        baseline's work fraction, :func:`work_scale`; None without a wrapper), else seconds."""
        if clock == "wall":
            return self.train_time_s
        if clock == "cpu":
            return self.train_cpu_time_s
        work = self.totals()["work_fraction"]
        return None if work is None else work / scale

    def curve(self, clock: str, scale: float = 1.0) -> list[float | None]:
        """Each ``run.log``'s cost so far on ``clock`` (the charged work counts from the start).

        Example:
            >>> es = [EpochRecord(i, None, 2.0 * i, 0.0, forwarded=50, backpropagated=50) for i in (1, 2)]
            >>> RunRecord("b", "baseline", 0, 1.0, es, num_samples=50, num_epochs=2).curve("work")
            [0.5, 1.0]
        """
        if clock != "work":
            return [e.train_time_s if clock == "wall" else e.train_cpu_time_s for e in self.epochs]
        if not self.num_samples or not self.num_epochs:
            return [None for _ in self.epochs]
        full = 3.0 * self.num_samples * self.num_epochs * scale
        passes = (self._passes({k: getattr(e, k) for k in _COUNTS}) for e in self.epochs)
        return [(self._charged() + done) / full for done in itertools.accumulate(passes)]

    def as_dict(self) -> dict[str, Any]:
        """Plain values for results.json's ``runs[]``."""
        d = asdict(self)
        d["steps"] = self.counts.get("steps", sum(e.steps for e in self.epochs))
        d.update(self.totals())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        """A run read back from results.json (checked by :func:`~leanbatch.engine.judging.results.check_payload`)."""
        keys = set(cls.__dataclass_fields__)
        run = cls(**{k: v for k, v in d.items() if k in keys})
        epoch_keys = set(EpochRecord.__dataclass_fields__)
        run.epochs = [EpochRecord(**{k: v for k, v in e.items() if k in epoch_keys}) for e in d["epochs"]]
        return run


def work_scale(runs: Sequence[RunRecord]) -> float:
    """The work clock's unit: the mean work fraction of the runs labelled ``baseline`` (1 without one).

    Example:
        >>> work_scale([RunRecord("baseline", "baseline", 0, 1.0, [], num_samples=4, num_epochs=1,
        ...                       counts={"forwarded": 3, "backpropagated": 3})])
        0.75
    """
    base = [w for r in runs if r.method == "baseline" and (w := r.totals()["work_fraction"])]
    return statistics.fmean(base) if base else 1.0
