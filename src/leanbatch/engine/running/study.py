"""A study's training: every arm of a task at every seed, in turns (:class:`Study`, :func:`run_study`).

The seeds run one after another; the arms of a seed take turns epoch by epoch
(:mod:`~leanbatch.engine.running.turns`; ``interleave="run"``: whole runs, the order rotated per
seed). A task that raises ends its own arm only: the other arms' runs are kept and the failing
arm is listed in ``failed``. A breach every arm shares
(:class:`~leanbatch.engine.running.data.StudyError`: no metric, batches larger than
``run.batch_size``, a budget the loop cannot train, a hook it never calls) stops the study at its
first sign (``stopped``); a default batch-level method whose hook the task never calls is left out
(``left_out``).

Example:
    >>> from leanbatch.arms.grid import study_arms
    >>> study = Study(lambda run: 1.0, study_arms("baseline", budgets="none", batch_budgets="none"), [0, 1])
    >>> [(r.method, r.seed, r.metric) for r in run_study(study).runs]
    [('baseline', 0, 1.0), ('baseline', 1, 1.0)]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leanbatch.arms.methods import Arm
from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.judging.verdicts import GOALS
from leanbatch.engine.running.contract import TaskError, check_callable, task_identity
from leanbatch.engine.running.data import ContractError, HookMissing, StudyError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.turns import Stopped, take_turns

__all__ = ["Outcome", "Study", "error_line", "run_study"]


@dataclass
class Study:
    """What to run: the ``task``, its ``arms``, the ``seeds``; the ``metric``'s name and ``goal``; how
    the arms take turns (``interleave``: ``epoch`` or ``run``); what results.json records besides
    (``config``: the task's settings; ``data``: what it trains on; ``command``); ``optional``: the
    methods are the defaults, and a batch-level one is left out when the task never calls its hook;
    ``metric_option``: how the caller names the metric, for the messages (``--metric {}``)."""

    task: Callable[[Run], Any]
    arms: list[Arm]
    seeds: list[int]
    metric: str = "metric"
    goal: str = "max"
    interleave: str = "epoch"
    tolerance: float | str = "1%"  # judging.results.DEFAULT_TOLERANCE
    clock: str = "work"
    controls: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    command: str | list[str] | None = None
    optional: bool = False
    metric_option: str = "metric={!r}"
    left_out: list[str] = field(default_factory=list)  # default methods the task has no hook for
    world_size: int | None = None  # processes per run (a Ray run's workers); None: this process's WORLD_SIZE

    def check(self) -> None:
        """Refuse, before anything trains, what cannot run: :class:`~leanbatch.engine.running.contract.TaskError`."""
        check_callable(self.task, f"the task {getattr(self.task, '__name__', self.task)!r}")
        if self.goal not in GOALS:
            raise TaskError(f"goal must be max or min, got {self.goal!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise TaskError(f"seeds must be distinct integers, at least one: got {self.seeds}")

    def new_run(self, arm: Arm, seed: int, on_log: Callable[[Run], None] | None = None) -> Run:
        """A run of ``arm`` at ``seed``, the metric named as the study names it."""
        return Run(arm, seed, self.metric, on_log, metric_option=self.metric_option, optional=self.optional)

    def identity(self) -> dict[str, Any]:
        """What every run of the study depends on besides its arm and seed: a run recorded under
        another identity is another study's (:class:`~leanbatch.engine.judging.journal.Journal`)."""
        return {"task_id": task_identity(self.task), "metric": self.metric, "goal": self.goal,
                "config": dict(self.config), "data": dict(self.data)}  # fmt: skip

    def config_entry(self) -> dict[str, Any]:
        """results.json's ``config``."""
        base = [a for a in self.arms if a.kind == "baseline"]
        return {
            **self.config,
            "task_id": task_identity(self.task),
            "metric": self.metric,
            "goal": self.goal,
            "seeds": list(self.seeds),
            "methods": [a.config() for a in self.arms],
            "budgets": sorted({a.budget for a in base if a.batch == 1.0}),
            "batch_budgets": sorted({a.batch for a in base if a.batch != 1.0}),
            "controls": self.controls,
            "interleave": self.interleave,
            "clock": self.clock,
            "world_size": self.world_size or int(os.environ.get("WORLD_SIZE", "1")),
            **({"left_out": list(self.left_out)} if self.left_out else {}),
        }


@dataclass
class Outcome:
    """The finished runs of a study, the arms that failed (``method``, ``seed``, ``error``), Ctrl-C;
    the breach that stopped it (``stopped``, as a failure), the default methods left out."""

    runs: list[RunRecord] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    stopped: dict[str, Any] | None = None
    left_out: list[str] = field(default_factory=list)


def error_line(e: BaseException) -> str:
    """An arm's failure in one line: the contract's own message, or what the task raised."""
    first = (str(e).strip().splitlines() or [""])[0]
    return (
        first if isinstance(e, (ContractError, TaskError)) else f"the task raised {type(e).__name__}: {first}"
    )


def run_study(
    study: Study,
    on_run: Callable[[RunRecord], None] = lambda r: None,
    on_seed: Callable[[Outcome], None] = lambda o: None,
    on_log: Callable[[Run], None] | None = None,
    kept: Sequence[RunRecord] = (),
) -> Outcome:
    """Train every arm at every seed (``on_run`` after each finished run, ``on_seed`` after each seed,
    ``on_log`` at each ``run.log``) but the runs ``kept`` from an earlier start, which the outcome
    holds first. A default method left out is taken off ``study.arms``."""
    out = Outcome(runs=list(kept))
    done = {(r.method, r.seed) for r in kept}
    try:
        for k, seed in enumerate(study.seeds):
            # rotated per seed, so a slow spell does not always land on the same arm (whole runs: a task
            # that never calls run.log, or interleave="run"; epoch by epoch: the first round)
            # the strictest contracts first (batch budgets, step budgets): a breach shows in the first epoch
            order = sorted(study.arms, key=lambda a: (a.batch == 1.0, not a.limited))
            arms = order[k % len(order) :] + order[: k % len(order)]
            runs = [study.new_run(arm, seed, on_log) for arm in arms if (arm.label, seed) not in done]
            first = len(out.runs)
            take_turns(
                study.task, runs, study.interleave == "run", lambda r, result: _record(out, r, on_run, result)
            )
            labels = [r.label for r in runs]  # recorded as they finished, kept in the turns' order
            out.runs[first:] = sorted(out.runs[first:], key=lambda r: labels.index(r.method))
            study.arms = [a for a in study.arms if a.label not in out.left_out]
            study.left_out = list(out.left_out)
            if out.stopped is not None:
                out.interrupted = False  # the others were stopped by the breach, not by Ctrl-C
                break
            on_seed(out)
            if out.interrupted:
                break
    except KeyboardInterrupt:  # between two seeds' turns: the finished runs are kept
        out.interrupted = True
    return out


def _record(out: Outcome, run: Run, on_run: Callable[[RunRecord], None], result: Any) -> None:
    """One arm's outcome into ``out``."""
    seed = run.seed
    if isinstance(result, RunRecord):
        out.runs.append(result)
        on_run(result)
    elif isinstance(result, StudyError):
        out.stopped = {"method": run.label, "seed": seed, "error": error_line(result)}
    elif isinstance(result, HookMissing):
        out.left_out.append(run.label)
    elif isinstance(result, Stopped):
        out.interrupted = True
    else:
        out.failed.append({"method": run.label, "seed": seed, "error": error_line(result)})
