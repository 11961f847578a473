"""The ``leanbatch bench`` subcommand (:func:`run_bench`), step by step: validated options and the
configuration results.json records, the runs, the published results (:func:`publish`, which
``leanbatch report`` shares, as ``leanbatch micro`` shares the value parsers :func:`int_list` and
:func:`resolve_device`). Torch loads inside these functions, never at import.

>>> int_list("128,256", "--sizes"), resolve_device("cpu")
([128, 256], 'cpu')
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leanbatch.cli_args import CLIError, check_out_folder, check_training_options
from leanbatch.cli_checks import check_batches

if TYPE_CHECKING:  # torch loads inside the functions: these are for the types only
    from leanbatch.bench.config import TrainConfig
    from leanbatch.bench.data import DataSplit
    from leanbatch.bench.methods import MethodRow
    from leanbatch.bench.records import RunResult
    from leanbatch.bench.world import World

__all__ = ["int_list", "publish", "resolve_device", "run_bench"]


def int_list(text: str, option: str, positive: bool = False, parse: Callable[[str], int] = int) -> list[int]:
    """The comma-separated integers of ``option``, each read with ``parse``; :class:`CLIError` if not.

    Example:
        >>> int_list("128,256", "--sizes"), int_list("1e3", "--sizes", parse=lambda v: int(float(v)))
        ([128, 256], [1000])
    """
    try:
        values = [parse(v) for v in text.split(",") if v.strip()]
    except (ValueError, OverflowError):
        raise CLIError(f"{option} must be comma-separated integers, got {text!r}") from None
    if positive and (not values or min(values) < 1):
        raise CLIError(f"{option} must be positive integers, got {text!r}")
    return values


def _parse_seeds(text: str) -> list[int]:
    """``--seeds``: distinct integers, at least one."""
    seeds = int_list(text, "--seeds")
    if not seeds:
        raise CLIError("--seeds is empty")
    if len(set(seeds)) != len(seeds):
        raise CLIError(f"--seeds lists a seed twice: {text}")
    return seeds


def _parse_widths(text: str | None) -> tuple[int, ...] | None:
    """``--widths``: positive integers (None: the model's own)."""
    return None if text is None else tuple(int_list(text, "--widths", positive=True))


def resolve_device(name: str) -> str:
    """``--device``: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``; :class:`CLIError` if unusable.

    Example:
        >>> resolve_device("cpu")
        'cpu'
    """
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


def _progress_factory(enabled: bool) -> Any:
    """tqdm bars on a terminal (``None``: none, off a terminal or without tqdm)."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def make(total: int, desc: str, position: int = 0) -> Any:
        return tqdm(
            total=total,
            desc=desc,
            position=position,
            leave=False,
            file=sys.stderr,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| epoch {n:.1f}/{total} [{elapsed}<{remaining}{postfix}]",
        )

    return make


def run_bench(args: argparse.Namespace) -> int:
    """``leanbatch bench``: validated options and the configuration, then the runs, then the results
    published; the exit status (2 for bad input is the caller's: a :class:`CLIError` propagates).

    Example (a tiny bench; ``args.argv`` is the command line results.json records):
        >>> import contextlib, io, tempfile, torch
        >>> from leanbatch.cli_args import build_parser
        >>> out = tempfile.mkdtemp()
        >>> args = build_parser().parse_args(["bench", "--data", "digits", "--limit-train", "64", "--limit-test",
        ...     "16", "--epochs", "1", "--batch-size", "32", "--widths", "4", "--methods", "baseline,obs[sel_keep=0.7]",
        ...     "--budgets", "none", "--batch-budgets", "none", "--no-plots", "--no-progress", "--out", out])
        >>> args.argv = ["bench", "..."]
        >>> with contextlib.redirect_stdout(io.StringIO()):
        ...     status = run_bench(args)
        >>> import json; methods = json.loads((Path(out) / "results.json").read_text())["config"]["methods"]
        >>> status, [m["label"] for m in methods], methods[1]["sel_keep"], methods[1]["settings"]["keep"]
        (0, ['baseline', 'obs[sel_keep=0.7]'], 0.7, 0.7)
        >>> torch.set_flush_denormal(False)  # the bench flushes denormals for its process
        True
    """
    from leanbatch.bench.world import World

    world = World.from_env(resolve_device(args.device))  # torchrun's processes, or this one alone
    try:
        with contextlib.nullcontext() if world.main else contextlib.redirect_stdout(io.StringIO()):
            return _bench(args, world)  # rank 0 prints and writes; the others train beside it
    finally:
        world.close()


def _bench(args: argparse.Namespace, world: Any) -> int:
    """The bench in ``world``: options, runs, results (rank 0 writes them)."""
    import torch

    job = _bench_options(args, world)
    data, cfg = job.data, job.cfg
    procs = f", {world.size} processes (torchrun)" if world.size > 1 else ""
    print(
        f"leanbatch bench: {data.name} ({data.num_train} train / {data.num_test} test, "
        f"{tuple(data.x_train.shape[1:])}), model {job.config['model']}, {cfg.epochs} epochs, batch {cfg.batch_size}, "
        f"seeds {job.seeds}, device {cfg.device}, {torch.get_num_threads()} threads{procs}",
        flush=True,
    )
    t_start = time.perf_counter()
    runs, interrupted = _train_seeds(job, args)
    if not world.main:
        return 130 if interrupted else 0
    return _finish(job, runs, interrupted, time.perf_counter() - t_start)


@dataclass
class _Job:
    """A validated ``leanbatch bench``: the data, the rows, the seeds, the training configuration,
    the output folder, results.json's ``config``, the command line, ``--tolerance``, ``--no-plots``,
    and where results go until the run completes (:func:`bench_options` makes it; see the module's
    example of :func:`run_bench`)."""

    data: DataSplit
    rows: list[MethodRow]
    seeds: list[int]
    cfg: TrainConfig
    out: Path
    config: dict[str, Any]
    command: str
    tolerance: float
    no_plots: bool
    world: World
    unfinished: Path  # where saves go until the run completes (a result from before is only replaced then)


def bench_rows(args: argparse.Namespace, opts: dict[str, Any]) -> list[MethodRow]:
    """The rows a ``bench`` command trains: its methods, their twins (``--controls``), and the
    baseline's step and batch budgets (``opts``: the options after the preset, :func:`resolve`)."""
    from leanbatch.bench.controls import with_controls
    from leanbatch.bench.methods import GLOBAL_SETTINGS, parse_methods
    from leanbatch.bench.presets import parse_budgets, with_budgets

    defaults = {k: getattr(args, k) for k in GLOBAL_SETTINGS}
    rows = parse_methods(args.methods, defaults, opts["epochs"])
    rows = with_controls(rows) if args.controls else rows
    budgets = parse_budgets(opts["budgets"]), parse_budgets(opts["batch_budgets"], "--batch-budgets")
    return with_budgets(rows, *budgets)


def _bench_options(args: argparse.Namespace, world: World) -> _Job:
    """Every option checked, the data loaded and the rows built, before anything trains or is written;
    results.json's ``config``. Bad input is a :class:`CLIError` (or the data's, the methods' error):
    one line."""
    import torch

    from leanbatch.bench.config import TrainConfig
    from leanbatch.bench.data import load_data
    from leanbatch.bench.outputs import unfinished_path
    from leanbatch.bench.presets import resolve

    if args.quick and args.preset not in (None, "quick"):
        raise CLIError(f"--quick and --preset {args.preset} conflict: give one of them")
    options = ("data", "epochs", "seeds", "budgets", "batch_budgets", "model", "widths")
    given = {k: getattr(args, k) for k in options}
    opts = resolve("quick" if args.quick else args.preset, given)
    seeds = _parse_seeds(opts["seeds"])
    if opts["epochs"] < 1:
        raise CLIError(f"--epochs must be >= 1, got {opts['epochs']}")
    check_training_options(args)
    rows = bench_rows(args, opts)
    widths = _parse_widths(opts["widths"])
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    data = load_data(opts["data"], args.limit_train, args.limit_test)
    for note in data.notes:
        print(f"leanbatch: note: {note}", flush=True)
    cfg = TrainConfig(
        epochs=opts["epochs"],
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        warmup=args.warmup,
        device=device,
        model=opts["model"],
        widths=widths,
        channels_last=args.channels_last,
        augment=args.augment,
        lr_rule=args.lr_rule,
    )
    dropped = check_batches(data, rows, cfg, world)
    check_out_folder(out)
    unfinished = unfinished_path(out)  # decided before anything is written
    command = "leanbatch " + " ".join(shlex.quote(a) for a in (args.argv or []))
    config = {**_bench_config(args, cfg, data, rows, seeds, dropped), "world_size": world.size}
    return _Job(
        data, rows, seeds, cfg, out, config, command, args.tolerance, args.no_plots, world, unfinished
    )


def _bench_config(
    args: argparse.Namespace,
    cfg: TrainConfig,
    data: DataSplit,
    rows: list[MethodRow],
    seeds: list[int],
    dropped: bool,
) -> dict[str, Any]:
    """results.json's ``config``: every training option, the seeds, one entry per row, the budgets."""
    return {
        **cfg.as_dict(),
        "model": cfg.resolved_model(data),
        "augment": cfg.resolved_augment(data),
        "seeds": seeds,
        "methods": [row.config() for row in rows],
        "budgets": sorted({row.budget for row in rows if row.kind == "baseline" and row.batch == 1.0}),
        "batch_budgets": sorted({row.batch for row in rows if row.kind == "baseline" and row.batch != 1.0}),
        "controls": bool(args.controls),
        "preset": "quick" if args.quick else args.preset,
        "quick": bool(args.quick or args.preset == "quick"),
        "interleave": args.interleave,
        "clock": args.clock,
        "dropped_last_batch": dropped,
    }


def _train_seeds(bench: _Job, args: argparse.Namespace) -> tuple[list[RunResult], bool]:
    """Train every row at every seed (after an untimed warm-up), saving the results so far after each
    seed; the finished runs, and whether Ctrl-C stopped them."""
    from leanbatch.bench.interleave import train_interleaved, train_run
    from leanbatch.bench.report import build_results, write_results
    from leanbatch.bench.train import warm_up

    world = bench.world
    bar = _progress_factory(not args.no_progress and world.main)
    runs: list[RunResult] = []
    width = max(12, *(len(row.label) for row in bench.rows))

    def finished(new_runs: list[RunResult]) -> None:
        for run in new_runs:
            runs.append(run)
            tot = run.totals()
            dropped = sum(e.dropped for e in run.epochs)
            print(
                f"  {run.label:<{width}} seed {run.seed}: {run.final_acc:6.2f}% in {run.train_time:7.1f} s "
                f"(forwarded {tot['forward_fraction']:.2f}, backpropagated {tot['backward_fraction']:.2f}"
                f"{f'; {dropped} left out in last batches of one' if dropped else ''})",
                flush=True,
            )
        if world.main:
            payload = build_results(
                runs, bench.config, bench.data.describe(), bench.tolerance, True, bench.command
            )
            write_results(bench.unfinished, payload)

    rows = bench.rows
    try:
        warm_up(bench.data, bench.cfg)
        for k, seed in enumerate(bench.seeds):
            if args.interleave == "epoch":
                finished(train_interleaved(bench.data, rows, seed, bench.cfg, bar, world))
                continue
            # rotate the method order per seed, so a slow spell of a shared machine does not
            # always land on the same method
            for row in rows[k % len(rows) :] + rows[: k % len(rows)]:
                finished([train_run(bench.data, row, seed, bench.cfg, bar, world)])
    except KeyboardInterrupt:
        return runs, True
    return runs, False


def _finish(bench: _Job, runs: list[RunResult], interrupted: bool, elapsed: float) -> int:
    """Publish the finished runs: results.json (or results.partial.json after Ctrl-C), the tables, the
    plots; the exit status (130 after Ctrl-C)."""
    from leanbatch.bench.outputs import RESULTS
    from leanbatch.bench.report import build_results

    if not runs:
        print("leanbatch: interrupted before any run finished; nothing written", file=sys.stderr)
        return 130
    results_path, unfinished = bench.out / RESULTS, bench.unfinished
    payload = build_results(
        runs, bench.config, bench.data.describe(), bench.tolerance, interrupted, bench.command
    )
    target = unfinished if interrupted else results_path
    written = publish(payload, target, None if bench.no_plots or target != results_path else bench.out)
    if target != unfinished:
        unfinished.unlink(missing_ok=True)  # this run's own per-seed saves, now complete
    print(f"\nwrote {', '.join(str(p) for p in written)} ({elapsed:.0f} s in all)")
    if interrupted:
        kept = "" if target == results_path else f"; {results_path} from before is kept, and no plots drawn"
        print(
            f"leanbatch: interrupted; kept the {len(runs)} finished run(s) in {target}{kept}", file=sys.stderr
        )
        return 130
    return 0


def publish(payload: dict[str, Any], results_path: Path, plots: Path | None) -> list[Path]:
    """Write ``results_path``, print the tables (the summary; equal time and the envelope on
    ``config.clock``; the controls when there are some), draw the plots into the folder ``plots``
    (None: none); every file atomically. The files written.

    Example:
        >>> import contextlib, io, tempfile
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> from leanbatch.bench.report import build_results
        >>> run = RunResult("baseline", "baseline", 0, 10, [EpochRecord(0, 1.0, 1.0, 90.0, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)])
        >>> payload = build_results([run], {"epochs": 1, "methods": [{"label": "baseline"}]}, {"num_train": 10}, 0.2)
        >>> with contextlib.redirect_stdout(io.StringIO()):
        ...     written = publish(payload, Path(tempfile.mkdtemp()) / "results.json", None)
        >>> [p.name for p in written]
        ['results.json']
    """
    from leanbatch.bench.outputs import write_results
    from leanbatch.bench.plots import write_plots
    from leanbatch.bench.sync import format_sync
    from leanbatch.bench.tables import format_controls, format_envelope, format_equal_time, format_table

    write_results(results_path, payload)
    print()
    print(format_table(payload["summary"], payload["tolerance_points"]))
    cpu = "_cpu" if payload["config"].get("clock") == "cpu" else ""
    print()
    print(format_equal_time(payload["equal_time" + cpu]))
    print()
    print(format_envelope(payload["envelope" + cpu]))
    if payload["controls"]["rows"]:
        print()
        print(format_controls(payload["controls"]))
    if payload.get("sync", {}).get("world_size", 1) > 1:
        print()
        print(format_sync(payload["sync"]))
    return [results_path] + ([] if plots is None else write_plots(payload, plots))
