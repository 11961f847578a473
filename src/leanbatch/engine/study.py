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
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from leanbatch.arms.grid import study_arms
from leanbatch.arms.methods import DEFAULT_METHODS, ArmError
from leanbatch.engine.judging.journal import Journal
from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.judging.report import Report
from leanbatch.engine.judging.results import DEFAULT_TOLERANCE, build_results, parse_tolerance
from leanbatch.engine.judging.verdicts import default_goal
from leanbatch.engine.progress import Progress
from leanbatch.engine.running.cluster import Cluster, run_on_ray
from leanbatch.engine.running.data import StudyError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.study import Outcome, Study, run_study

__all__ = ["bench", "execute"]


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
    fresh: bool = False,
    ray: bool | str | Cluster | None = None,
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
    done of all, elapsed, ETA). Started again on the same ``out``, the finished runs are kept and only
    the rest train (``fresh``: all again). ``ray``: every run a Ray Tune trial on a local Ray (``True``),
    at an address (``"auto"``, ``"ray://host:port"``) or as a :class:`~leanbatch.engine.running.cluster.Cluster` says.
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
    folder = None if out is None else Path(out)
    outcome, journal = _execute(study, folder, fresh, _cluster(ray, folder), progress)
    payload = build_results(
        outcome.runs, study.config_entry(), study.data, tolerance=tolerance, interrupted=outcome.interrupted,
        command=study.command, failed=outcome.failed,
    )  # fmt: skip
    report = Report(payload)
    if out is not None:
        report.save(out, plots)
    if journal is not None and not (outcome.failed or outcome.interrupted):
        journal.close()
    return report


def _execute(study: Study, folder: Path | None, fresh: bool, cluster: Cluster | None,
             progress: bool) -> tuple[Outcome, Journal | None]:  # fmt: skip
    """:func:`execute` with a progress bar on stderr when asked; a study a shared breach stopped raises."""
    with Progress(study) if progress else contextlib.nullcontext() as bar:
        hooks: dict[str, Any] = {} if bar is None else {"on_run": bar.done, "on_log": bar.log}
        outcome, journal = execute(study, folder, fresh=fresh, cluster=cluster, **hooks)
    if outcome.stopped is not None:
        s = outcome.stopped
        raise StudyError(f"{s['method']} seed {s['seed']}: {s['error']}; the study stopped, nothing judged")
    return outcome, journal


def _cluster(ray: bool | str | Cluster | None, folder: Path | None) -> Cluster | None:
    """``bench``'s ``ray`` as a :class:`~leanbatch.engine.running.cluster.Cluster` (None: no Ray)."""
    storage = None if folder is None else folder / "tune"
    if isinstance(ray, Cluster):
        return ray if ray.storage is not None else dataclasses.replace(ray, storage=storage)
    if ray is None or ray is False:
        return None
    return Cluster(None if ray is True else str(ray), storage=storage, verbose=0)


def execute(
    study: Study,
    out: Path | None,
    *,
    fresh: bool = False,
    write: bool = True,
    on_run: Callable[[RunRecord], None] = lambda r: None,
    on_seed: Callable[[Outcome], None] = lambda o: None,
    on_log: Callable[[Run], None] | None = None,
    cluster: Cluster | None = None,
) -> tuple[Outcome, Journal | None]:
    """Run ``study``, recording each finished run in ``out``'s
    :class:`~leanbatch.engine.judging.journal.Journal` (None: no record) and keeping the runs an
    earlier start recorded (one line says which; ``fresh``: none kept; ``write``: read the record, never
    write it, as every process but the first under torchrun); the outcome and the journal, for the
    caller to close once its results are written; on ``cluster``, every run a Ray Tune trial. A record of
    another study, a cluster that cannot be used: ``ValueError`` of one line."""
    if cluster is not None:
        cluster.check()
        study.world_size = cluster.workers  # results.json records each run's processes
    journal = None
    if out is not None:
        if write:
            out.mkdir(parents=True, exist_ok=True)
        arms = {a.label: a.config() for a in study.arms}
        journal = Journal.open(out, study.identity(), arms, study.seeds, fresh=fresh, write=write)
        if line := journal.line(len(study.arms) * len(study.seeds)):
            print(line, flush=True)

    def recorded(run: RunRecord) -> None:
        if journal is not None and write:
            journal.append(run)
        on_run(run)

    kept = [] if journal is None else journal.kept
    if cluster is not None:
        return run_on_ray(study, cluster, on_run=recorded, on_seed=on_seed, kept=kept), journal
    return run_study(study, on_run=recorded, on_seed=on_seed, on_log=on_log, kept=kept), journal
