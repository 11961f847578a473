"""The ``leanbatch bench`` subcommand (:func:`run_bench`): the study from the options (your ``--task``, or
the built-in image task), the arms trained in turns, the results published. Torch and the task load
inside these functions, never at import.

Under torchrun every process runs the same study; the first (``RANK`` 0) prints and writes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leanbatch.cli_args import (
    IMAGE_OPTIONS,
    MAX_SEED,
    CLIError,
    check_out_folder,
    check_training_options,
    int_list,
)

if TYPE_CHECKING:  # torch loads inside the functions: these are for the types only
    from leanbatch.engine.running.study import Outcome, Study

__all__ = ["resolve_device", "run_bench"]


def resolve_device(name: str) -> str:
    """``--device``: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``; :class:`CLIError`
    if unusable."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise CLIError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"device {name!r} requested but CUDA is not available: use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise CLIError(f"unsupported device {name!r}: use auto, cpu, cuda or cuda:N")
    return str(dev)


def _arms(args: argparse.Namespace) -> list[Any]:
    """The arms: ``--methods`` (or the default ones), their twins (``--controls``), the baseline's budgets."""
    from leanbatch.arms.grid import study_arms
    from leanbatch.arms.methods import DEFAULT_METHODS, OPTIONS

    return study_arms(
        args.methods or ",".join(DEFAULT_METHODS), budgets=args.budgets, batch_budgets=args.batch_budgets,
        controls=bool(args.controls), options={k: getattr(args, k) for k in OPTIONS},
    )  # fmt: skip


def _image_task(args: argparse.Namespace, arms: list[Any]) -> tuple[Any, dict[str, Any], dict[str, Any], str]:
    """The built-in image task from its options: the task, its config, its data, the seeds' text."""
    from leanbatch.tasks.images.config import TrainConfig
    from leanbatch.tasks.images.data import load_data
    from leanbatch.tasks.images.presets import resolve
    from leanbatch.tasks.images.task import ImageTask, check_batches

    if args.quick and args.preset not in (None, "quick"):
        raise CLIError(f"--quick and --preset {args.preset} conflict: give one of them")
    if args.metric not in (None, "accuracy") or args.goal not in (None, "max"):
        raise CLIError("the image task's metric is accuracy (max): --metric and --goal are for --task")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise CLIError(
            "the built-in image task trains in one process: under torchrun give --task a distributed task (examples/distributed_task.py)"
        )
    preset = "quick" if args.quick else args.preset
    opts = resolve(preset, {k: getattr(args, k) for k in ("data", "epochs", "seeds", "model", "widths")})
    if opts["epochs"] < 1:
        raise CLIError(f"--epochs must be >= 1, got {opts['epochs']}")
    widths = None if opts["widths"] is None else tuple(int_list(opts["widths"], "--widths", positive=True))
    # TrainConfig's fields from the options of the same name, what the preset and --device resolve over them
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(TrainConfig)}
    given |= {"epochs": opts["epochs"], "model": opts["model"], "widths": widths}
    given["device"] = resolve_device(args.device or "auto")
    cfg = TrainConfig(**{k: v for k, v in given.items() if v is not None})
    data = load_data(opts["data"], args.limit_train, args.limit_test)
    for note in data.notes:
        print(f"leanbatch: note: {note}", flush=True)
    dropped = check_batches(data, arms, cfg)
    config = {
        **cfg.as_dict(),
        "model": cfg.resolved_model(data),
        "augment": cfg.resolved_augment(data),
        "preset": preset,
        "dropped_last_batch": dropped,
    }
    task = ImageTask(data, cfg)
    header = f"{data.name} ({data.num_train} train / {data.num_test} test, {tuple(data.x_train.shape[1:])}), model {config['model']}, {cfg.epochs} epochs, batch {cfg.batch_size}, device {cfg.device}"
    return task, {"task": "images", "task_config": config, "header": header}, data.describe(), opts["seeds"]


def _user_task(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any], str]:
    from leanbatch.engine.running.contract import load_task

    given = [o for o in IMAGE_OPTIONS if getattr(args, o) not in (None, False)]
    if given:
        opt = "--" + given[0].replace("_", "-")
        raise CLIError(
            f"{opt} is an option of the built-in image task: with --task, your task sets its own training"
        )
    task = load_task(args.task)
    return task, {"task": args.task, "header": f"task {args.task}"}, {"name": args.task}, args.seeds or "0"


def study_from(args: argparse.Namespace) -> Study:
    """Every option checked and the task loaded, before anything trains: the :class:`~leanbatch.engine.running.study.Study`."""
    import torch

    from leanbatch.engine.judging.verdicts import default_goal
    from leanbatch.engine.running.study import Study

    check_training_options(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.task:
        task, config, data, seeds_text = _user_task(args)
        arms = _arms(args)
    else:
        arms = _arms(args)
        task, config, data, seeds_text = _image_task(args, arms)
    seeds = int_list(seeds_text, "--seeds", high=MAX_SEED)
    if not seeds or len(set(seeds)) != len(seeds):
        raise CLIError(f"--seeds must be distinct integers, at least one: got {seeds_text!r}")
    metric = "accuracy" if not args.task else args.metric or "metric"
    goal = args.goal or default_goal(metric)
    command = "leanbatch " + " ".join(shlex.quote(a) for a in (args.argv or []))
    study = Study(
        task,
        arms,
        seeds,
        metric,
        goal,
        args.interleave,
        args.tolerance,
        args.clock,
        bool(args.controls),
        config,
        data,
        command,
        optional=args.methods is None,
        metric_option="--metric {}",
    )
    study.check()
    return study


def run_bench(args: argparse.Namespace) -> int:
    """``leanbatch bench``: the study, its arms in turns, the results published; the exit status (0; 2
    when an arm failed, after the others' results are written; 130 after Ctrl-C). Bad input is a
    :class:`CLIError` (or the engine's one-line errors), raised before anything trains."""
    main = os.environ.get("RANK", "0") == "0"
    with contextlib.nullcontext() if main else contextlib.redirect_stdout(io.StringIO()):
        return _bench(args, main)


def _bench(args: argparse.Namespace, main: bool) -> int:
    from leanbatch.engine.judging.outputs import RESULTS, unfinished_path, write_results
    from leanbatch.engine.judging.report import closing, publish, terminal_width
    from leanbatch.engine.judging.results import build_results

    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CLIError(
                'the plots need matplotlib: pip install "leanbatch[bench]", or pass --no-plots'
            ) from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    study = study_from(args)
    if main:
        check_out_folder(out)
    unfinished = unfinished_path(out)  # decided before anything is written
    header = study.config.pop("header")
    title = f"leanbatch bench: {header}, {len(study.arms)} arms, seeds {study.seeds}, metric {study.metric} ({study.goal})"
    print("\n".join(textwrap.wrap(title, terminal_width(), subsequent_indent="  ")), flush=True)

    def payload(outcome: Outcome, interrupted: bool) -> dict[str, Any]:
        return build_results(
            outcome.runs, study.config_entry(), study.data, tolerance=study.tolerance, interrupted=interrupted,
            command=study.command, failed=outcome.failed,
        )  # fmt: skip

    wrote: list[Path] = []

    def saved(outcome: Outcome) -> None:
        if main:
            write_results(unfinished, payload(outcome, True))
            wrote.append(unfinished)

    t0 = time.perf_counter()
    outcome, journal = _execute(study, args, out, main, saved)
    if _stopped(outcome, wrote[-1:] + ([journal.path] if main and journal else [])):
        return 2
    if not main:
        return 130 if outcome.interrupted else 0
    if not outcome.runs:
        unfinished.unlink(missing_ok=True)
        if outcome.interrupted:
            print("leanbatch: interrupted before any run finished; nothing written", file=sys.stderr)
            return 130
    target = unfinished if outcome.interrupted else out / RESULTS
    final = payload(outcome, outcome.interrupted)
    written = publish(final, target, None if args.no_plots or target != out / RESULTS else out)
    if target != unfinished:
        unfinished.unlink(missing_ok=True)  # this study's own per-seed saves, now complete
    if journal is not None and target == out / RESULTS and not outcome.failed:
        journal.close()  # complete: results.json is its record now
    print(closing(final, written, args.tables, time.perf_counter() - t0), flush=True)
    return _status(outcome, target, out / RESULTS)


def _execute(
    study: Study, args: argparse.Namespace, out: Path, main: bool, saved: Any
) -> tuple[Outcome, Any]:
    """The study run (on Ray with ``--ray``), a progress bar on a terminal, each run's line as it ends."""
    from leanbatch.cli_cluster import cluster_from
    from leanbatch.engine.progress import Progress
    from leanbatch.engine.study import execute

    bar = Progress(study) if main and not args.no_progress and sys.stderr.isatty() else None
    try:
        return execute(
            study, out, fresh=args.fresh, write=main, on_seed=saved, cluster=cluster_from(args, out),
            on_run=lambda r: _done(r, study.metric, bar), on_log=None if bar is None else bar.log,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()


def _stopped(outcome: Outcome, saves: list[Path]) -> bool:
    """The default methods left out (a note), and whether a shared breach stopped the study (then its
    one line, and this study's own ``saves`` removed: nothing half-judged is kept)."""
    if outcome.left_out:
        print(f"leanbatch: note: {', '.join(outcome.left_out)} left out: the task trains without run.select(...), "
              "the batch-level selection hook (the default methods select only in a loop that calls it)")  # fmt: skip
    if outcome.stopped is None:
        return False
    for path in saves:
        path.unlink(missing_ok=True)
    s = outcome.stopped
    print(f"leanbatch: error: {s['method']} seed {s['seed']}: {s['error']}; the study stopped, nothing written",
          file=sys.stderr)  # fmt: skip
    return True


def _status(outcome: Outcome, target: Path, results: Path) -> int:
    """The exit status of a published study, and the one line that says why it is not 0."""
    if outcome.interrupted:
        kept = "" if target == results else f"; {results} from before is kept, and no plots drawn"
        print(
            f"leanbatch: interrupted; kept the {len(outcome.runs)} finished run(s) in {target}{kept}",
            file=sys.stderr,
        )
        return 130
    if outcome.failed:
        first, n = outcome.failed[0], len(outcome.failed)
        more = f" (and {n - 1} more arm(s), listed in results.json's failed)" if n > 1 else ""
        kept = f"the {len(outcome.runs)} finished run(s) are in {target}"
        print(
            f"leanbatch: error: {first['method']} seed {first['seed']}: {first['error']}{more}; {kept}",
            file=sys.stderr,
        )
        return 2
    return 0


def _done(run: Any, metric: str, bar: Any) -> None:
    """A finished run: its compact line, wrapped to the terminal (above the bar), and the bar moved on.
    Called on a Ray driver through a Tune callback that Tune pickles: it holds no builtin (``print``
    is looked up here)."""
    from leanbatch.engine.judging.report import terminal_width

    tot = run.totals()
    fwd, bwd = tot["forward_fraction"], tot["backward_fraction"]
    dropped = sum(e.dropped for e in run.epochs)
    line = f"{run.method} seed {run.seed}: {metric} {run.metric:.4g}, {run.train_time_s:.1f} s"
    line += "" if fwd is None else f", fwd {fwd:.2f} bwd {bwd:.2f}"
    line += f", {dropped} served not trained" if dropped else ""
    text = "\n".join(textwrap.wrap(line, terminal_width(), initial_indent="  ", subsequent_indent="    "))
    if bar is None:
        print(text, flush=True)
    else:
        bar.write(text)
        bar.done(run)
