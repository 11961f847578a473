"""A study's training: every arm of a task at every seed, in turns (:class:`Study`, :func:`run_study`).

The seeds run one after another; the arms of a seed take turns epoch by epoch
(:mod:`~leanbatch.engine.running.turns`; ``interleave="run"``: whole runs, the order rotated per
seed). A task that raises ends its own arm only: the other arms' runs are kept and the failing
arm is listed in ``failed``.

Example:
    >>> from leanbatch.arms.grid import study_arms
    >>> study = Study(lambda run: 1.0, study_arms("baseline", budgets="none", batch_budgets="none"), [0, 1])
    >>> [(r.method, r.seed, r.metric) for r in run_study(study).runs]
    [('baseline', 0, 1.0), ('baseline', 1, 1.0)]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leanbatch.arms.methods import DEFAULT_METHODS, Arm
from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.judging.verdicts import GOALS
from leanbatch.engine.running.contract import TaskError, calls_selection, check_callable, task_identity
from leanbatch.engine.running.data import ContractError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.turns import Stopped, take_turns

__all__ = ["Outcome", "Study", "default_methods", "run_study"]


def default_methods(task: Any) -> str:
    """``--methods``' default for ``task``: every default kind, but the batch-level ones (``sb``,
    ``infobatch+sb``) only for a task whose code calls the selection hook (``run.select``, or a
    Hugging Face task's ``run.trainer``, whose trainer selects itself).

    Example:
        >>> default_methods(lambda run: run.wrap([1], 1))
        'baseline,random,infobatch'
    """
    from leanbatch.arms.registry import REGISTRY

    selects = calls_selection(task)
    return ",".join(k for k in DEFAULT_METHODS if selects or not REGISTRY[k].selects)


@dataclass
class Study:
    """What to run: the ``task``, its ``arms``, the ``seeds``; the ``metric``'s name and ``goal``; how
    the arms take turns (``interleave``: ``epoch`` or ``run``); what results.json records besides
    (``config``: the task's settings; ``data``: what it trains on; ``command``)."""

    task: Callable[[Run], Any]
    arms: list[Arm]
    seeds: list[int]
    metric: str = "metric"
    goal: str = "max"
    interleave: str = "epoch"
    tolerance: float = 0.2
    clock: str = "work"
    controls: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    command: str | list[str] | None = None

    def check(self) -> None:
        """Refuse, before anything trains, what cannot run: :class:`~leanbatch.engine.running.contract.TaskError`."""
        check_callable(self.task, f"the task {getattr(self.task, '__name__', self.task)!r}")
        if self.goal not in GOALS:
            raise TaskError(f"goal must be max or min, got {self.goal!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise TaskError(f"seeds must be distinct integers, at least one: got {self.seeds}")
        selecting = [a.label for a in self.arms if a.selects]
        if selecting and not calls_selection(self.task):
            raise TaskError(
                f"{', '.join(selecting)} select(s) rows of each batch, but the task never calls run.select(...), "
                "the batch-level selection hook: add it to the loop (docs/bench.md) or drop them from --methods"
            )

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
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        }


@dataclass
class Outcome:
    """The finished runs of a study, the arms that failed (``method``, ``seed``, ``error``), Ctrl-C."""

    runs: list[RunRecord] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


def _line(e: BaseException) -> str:
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
) -> Outcome:
    """Train every arm at every seed (``on_run`` after each finished run, ``on_seed`` after each seed,
    ``on_log`` at each ``run.log``)."""
    out = Outcome()
    try:
        for k, seed in enumerate(study.seeds):
            # rotated per seed, so a slow spell does not always land on the same arm (whole runs: a task
            # that never calls run.log, or interleave="run"; epoch by epoch: the first round)
            arms = study.arms[k % len(study.arms) :] + study.arms[: k % len(study.arms)]
            runs = [Run(arm, seed, study.metric, on_log) for arm in arms]
            for run, result in take_turns(study.task, runs, whole=study.interleave == "run"):
                if isinstance(result, RunRecord):
                    out.runs.append(result)
                    on_run(result)
                elif isinstance(result, Stopped):
                    out.interrupted = True
                else:
                    out.failed.append({"method": run.label, "seed": seed, "error": _line(result)})
            on_seed(out)
            if out.interrupted:
                break
    except KeyboardInterrupt:  # between two seeds' turns: the finished runs are kept
        out.interrupted = True
    return out
