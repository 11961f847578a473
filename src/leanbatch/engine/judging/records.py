"""What the engine records of a run: one :class:`EpochRecord` per ``run.log``, one :class:`RunRecord` per arm and seed.

Everything here is counted by the engine itself, task-free: the clock (training only), and from
the arm's data wrapper and selection hook the samples served (``loaded``), the rows forwarded and
backpropagated in training steps, the rows a selection pass scored (``select_forwarded``), the
optimizer steps, and what was served but never trained (``dropped``). A task adds its own numbers
through ``run.log(epoch=, metric=, **values)`` (per epoch) and ``run.note(**values)`` (per run).

>>> e = EpochRecord(0, 90.0, 1.0, 1.0, steps=1, loaded=100, forwarded=100, backpropagated=100)
>>> r = RunRecord("baseline", "baseline", 0, 90.0, [e], 1.0, 1.0, num_samples=100, num_epochs=1)
>>> r.totals()["work_fraction"]
1.0
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EpochRecord", "RunRecord"]


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
    threshold: float | None = (
        None  # a pruning arm's plan of this epoch: its threshold (InfoBatch's mean score)
    )
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
    counts: dict[str, int] = field(
        default_factory=dict
    )  # the run's totals of the epochs' counts (unlogged steps too)
    histograms: list[dict[str, Any]] = field(default_factory=list)
    load_avg: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> dict[str, float | None]:
        """Fractions of the full run's work (``num_epochs x num_samples`` samples forward and backward);
        None without a wrapper. A backward pass costs two forwards, a selection pass ``scale`` of one.

        Example:
            >>> e = EpochRecord(0, 90.0, 1.0, 1.0, 1, 100, 50, 100, 50)
            >>> r = RunRecord("sb", "sb", 0, 90.0, [e], num_samples=100, num_epochs=1, scale=0.25)
            >>> {k: round(v, 3) for k, v in r.totals().items()}
            {'loaded_fraction': 1.0, 'forward_fraction': 1.5, 'backward_fraction': 0.5, 'work_fraction': 0.583}
        """
        if not self.num_samples or not self.num_epochs:
            return dict.fromkeys(
                ("loaded_fraction", "forward_fraction", "backward_fraction", "work_fraction")
            )
        full = float(self.num_samples * self.num_epochs)
        n = {
            k: self.counts.get(k, sum(getattr(e, k) for e in self.epochs))
            for k in ("loaded", "forwarded", "select_forwarded", "backpropagated")
        }
        fwd = n["forwarded"] + self.charged.get("forwarded", 0.0)
        sel = n["select_forwarded"]
        bwd = n["backpropagated"] + self.charged.get("backpropagated", 0.0)
        cost = self.charged.get("cost", 1.0)
        own_fwd, own_bwd = (
            fwd - self.charged.get("forwarded", 0.0),
            bwd - self.charged.get("backpropagated", 0.0),
        )
        work = own_fwd + sel * self.scale + 2.0 * own_bwd
        work += cost * (self.charged.get("forwarded", 0.0) + 2.0 * self.charged.get("backpropagated", 0.0))
        return {
            "loaded_fraction": n["loaded"] / full,
            "forward_fraction": (fwd + sel) / full,
            "backward_fraction": bwd / full,
            "work_fraction": work / (3.0 * full),
        }

    def time_of(self, clock: str) -> float:
        """The run's training time on ``clock``: ``wall`` or ``cpu``."""
        return self.train_time_s if clock == "wall" else self.train_cpu_time_s

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
