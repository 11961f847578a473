"""A study: every arm of a task at every seed, in turns, into one report (:func:`bench`, :func:`run_study`).

The seeds run one after another; the arms of a seed take turns epoch by epoch
(:mod:`~leanbatch.engine.interleave`; ``interleave="run"``: whole runs, the order rotated per
seed). A task that raises ends its own arm only: the other arms' runs are kept and the failing
arm is listed in ``failed``. :func:`bench` is the Python call: it returns the report, the same
object ``leanbatch bench`` writes as results.json.

Example:
    >>> import torch
    >>> def train(run):  # a toy task: the metric is the mean of the weights the loop trained
    ...     ds = run.wrap(torch.arange(64.0), num_epochs=2)
    ...     w = torch.zeros(())
    ...     for epoch in range(ds.epoch, 2):
    ...         ds.set_epoch(epoch)
    ...         for x in torch.utils.data.DataLoader(ds, batch_size=run.batch_size(8), sampler=ds.sampler):
    ...             w = w + ds.update(x / 64.0).detach()
    ...         run.log(epoch=epoch, metric=float(w))
    ...     return float(w)
    >>> report = bench(train, methods="baseline,random", seeds=[0, 1], budgets=[0.5, 1.0], batch_budgets=[])
    >>> [row["method"] for row in report["summary"]], report["runs"][1]["steps"]
    (['baseline', 'baseline[budget=0.5]', 'random'], 8)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leanbatch.arms.methods import (
    DEFAULT_BATCH_BUDGETS,
    DEFAULT_BUDGETS,
    DEFAULT_METHODS,
    Arm,
    ArmError,
    parse_budgets,
    parse_methods,
    with_budgets,
)
from leanbatch.arms.twins import with_controls
from leanbatch.engine.contract import TaskError, calls_selection, check_callable
from leanbatch.engine.data import ContractError
from leanbatch.engine.interleave import Stopped, take_turns
from leanbatch.engine.records import RunRecord
from leanbatch.engine.run import Run
from leanbatch.engine.verdicts import GOALS

__all__ = ["Report", "Study", "bench", "default_goal", "default_methods", "publish", "run_study"]


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


def default_goal(metric: str) -> str:
    """The goal of a metric when none is given: ``min`` for a loss, a perplexity or an error, else ``max``.

    Example:
        >>> default_goal("accuracy"), default_goal("eval_loss"), default_goal("perplexity")
        ('max', 'min', 'min')
    """
    name = metric.lower()
    return "min" if any(w in name for w in ("loss", "perplexity", "ppl", "error", "mse", "mae")) else "max"


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
    clock: str = "wall"
    controls: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    command: str | list[str] | None = None

    def check(self) -> None:
        """Refuse, before anything trains, what cannot run: :class:`~leanbatch.engine.contract.TaskError`."""
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


class Report(dict):  # type: ignore[type-arg]
    """The results of a study: the same object (keys and values) as its results.json, plus
    :attr:`text` (the terminal report) and :meth:`save` (results.json, the plots, report.html)."""

    @property
    def text(self) -> str:
        """The answer, one line per method, then the full tables."""
        from leanbatch.engine.tables import format_results

        return format_results(self)

    def save(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """Write ``results.json``, the plots and ``report.html`` into ``folder``; the files written."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        return publish(dict(self), out / "results.json", out if plots else None, quiet=True)


def publish(payload: dict[str, Any], results: Path, plots: Path | None, quiet: bool = False) -> list[Path]:
    """Write ``results`` (results.json), print the report (unless ``quiet``), draw the plots and write
    ``report.html`` into the folder ``plots`` (None: neither); every file atomically. The files written."""
    from leanbatch.engine.outputs import write_results
    from leanbatch.engine.tables import format_results

    write_results(results, payload)
    text = format_results(payload)
    if not quiet:
        print()
        print(text)
    written = [results]
    if plots is not None:
        from leanbatch.engine.html import write_html
        from leanbatch.engine.plots import write_plots

        images = write_plots(payload, plots)
        written += images + [write_html(plots / "report.html", text, images, payload.get("command"))]
    return written


def _arms(methods: str | Sequence[str], budgets: Any, batch_budgets: Any, controls: bool) -> list[Arm]:
    text = methods if isinstance(methods, str) else ",".join(methods)
    arms = parse_methods(text)
    arms = with_controls(arms) if controls else arms
    steps = parse_budgets(budgets) if isinstance(budgets, str) else sorted(float(b) for b in budgets)
    batch = (
        parse_budgets(batch_budgets, "--batch-budgets")
        if isinstance(batch_budgets, str)
        else sorted(float(b) for b in batch_budgets)
    )
    return with_budgets(arms, steps, batch)


def bench(
    task: Callable[[Run], Any],
    *,
    methods: str | Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    budgets: str | Sequence[float] = DEFAULT_BUDGETS,
    batch_budgets: str | Sequence[float] = DEFAULT_BATCH_BUDGETS,
    controls: bool = False,
    metric: str = "metric",
    goal: str | None = None,
    interleave: str = "epoch",
    tolerance: float = 0.2,
    clock: str = "wall",
    out: str | Path | None = None,
    plots: bool = True,
) -> Report:
    """Run ``task`` under every arm (``methods``, default :func:`default_methods`; the baseline's
    ``budgets`` and ``batch_budgets``; the twins with ``controls``) at every seed and return the :class:`Report`; with ``out``, also write
    results.json, the plots and report.html there. ``goal``: ``max`` or ``min`` (default:
    :func:`default_goal` of the ``metric``'s name). Bad input: ``ValueError`` of one line."""
    from leanbatch.engine.results import build_results

    try:
        arms = _arms(default_methods(task) if methods is None else methods, budgets, batch_budgets, controls)
    except ArmError as e:
        raise ValueError(str(e)) from None
    name = getattr(task, "__qualname__", type(task).__name__)
    study = Study(task, arms, [int(s) for s in seeds], metric, goal or default_goal(metric), interleave,
                  tolerance, clock, controls, {"task": name}, {"name": name}, f"leanbatch.engine.bench({name})")  # fmt: skip
    study.check()
    outcome = run_study(study)
    payload = build_results(
        outcome.runs, study.config_entry(), study.data, tolerance=tolerance, interrupted=outcome.interrupted,
        command=study.command, failed=outcome.failed,
    )  # fmt: skip
    report = Report(payload)
    if out is not None:
        report.save(out, plots)
    return report
