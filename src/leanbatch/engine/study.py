"""``bench``: a study from Python, run (:mod:`~leanbatch.engine.running`) and judged (:mod:`~leanbatch.engine.judging`).

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
    >>> [row["method"] for row in report["summary"]], [r["steps"] for r in report["runs"] if r["seed"] == 0]
    (['baseline', 'baseline[budget=0.5]', 'random'], [8, 16, 16])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from leanbatch.arms.grid import study_arms
from leanbatch.arms.methods import DEFAULT_METHODS, ArmError
from leanbatch.engine.judging.report import Report
from leanbatch.engine.judging.results import DEFAULT_TOLERANCE, build_results, parse_tolerance
from leanbatch.engine.judging.verdicts import default_goal
from leanbatch.engine.progress import Progress
from leanbatch.engine.running.data import StudyError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.study import Study, run_study

__all__ = ["bench"]


def bench(
    task: Callable[[Run], Any],
    *,
    methods: str | Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    budgets: str | Sequence[float] | None = None,
    batch_budgets: str | Sequence[float] | None = None,
    controls: bool = False,
    metric: str = "metric",
    goal: str | None = None,
    interleave: str = "epoch",
    tolerance: float | str = DEFAULT_TOLERANCE,
    clock: str = "work",
    out: str | Path | None = None,
    plots: bool = True,
    progress: bool = False,
) -> Report:
    """Run ``task`` under every arm (``methods``, default ``baseline,random,infobatch,sb,infobatch+sb``,
    the batch-level ones left out when the task trains a step without ``run.select``;
    the baseline's ``budgets`` and ``batch_budgets``, default ``0.5,0.7,0.85,1`` and ``0.5,0.7``; the
    twins with ``controls``) at every seed and return the :class:`~leanbatch.engine.judging.report.Report`;
    with ``out``, also write results.json, the plots and report.html there. ``goal``: ``max`` or
    ``min`` (default: :func:`~leanbatch.engine.judging.verdicts.default_goal` of the ``metric``'s name);
    ``clock``: what the arms are compared at, ``work`` (FLOP-weighted passes: the same training gives
    the same verdicts on any machine), ``wall`` or ``cpu``; ``tolerance``: how near the baseline's
    final metric counts as reaching it (``t->target``), ``"N%"`` of that metric (default ``"1%"``,
    the same on any scale) or a number in the metric's units; ``progress``: a bar on stderr (runs
    done of all, elapsed, ETA, the arm training now).
    Bad input, and a breach of the contract every arm shares (no ``metric``, batches larger than
    ``run.batch_size``, a budget the loop cannot train), found at its first sign:
    ``ValueError`` of one line (:class:`~leanbatch.engine.running.data.StudyError`), nothing judged."""
    try:
        arms = study_arms(",".join(DEFAULT_METHODS) if methods is None else methods, budgets=budgets,
                          batch_budgets=batch_budgets, controls=controls)  # fmt: skip
        tolerance = parse_tolerance(tolerance)
    except ArmError as e:
        raise ValueError(str(e)) from None
    name = getattr(task, "__qualname__", type(task).__name__)
    study = Study(task, arms, [int(s) for s in seeds], metric, goal or default_goal(metric), interleave,
                  tolerance, clock, controls, {"task": name}, {"name": name}, f"leanbatch.engine.bench({name})",
                  optional=methods is None)  # fmt: skip
    study.check()
    with Progress(study) if progress else contextlib.nullcontext() as bar:
        outcome = run_study(study) if bar is None else run_study(study, on_run=bar.done, on_log=bar.log)
    if outcome.stopped is not None:
        s = outcome.stopped
        raise StudyError(f"{s['method']} seed {s['seed']}: {s['error']}; the study stopped, nothing judged")
    payload = build_results(
        outcome.runs, study.config_entry(), study.data, tolerance=tolerance, interrupted=outcome.interrupted,
        command=study.command, failed=outcome.failed,
    )  # fmt: skip
    report = Report(payload)
    if out is not None:
        report.save(out, plots)
    return report
