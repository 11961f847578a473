"""The ``leanbatch`` command: judge your own training, or the built-in image task, against the envelope.

``leanbatch bench`` trains a task under each method with the same seeds, beside the baseline trained
shorter and on smaller batches, and prints the answer last (the tables with ``--tables``; always in
report.html and results.json); ``leanbatch report`` recomputes them from results.json files (merging parts of one study); ``leanbatch micro plan|update|select`` times
the library's own overheads. A base install (torch only) runs ``leanbatch --help`` and
``--version``; what needs the ``bench`` extra says so. Bad input prints one line on stderr and exits
with status 2; Ctrl-C stops cleanly (status 130) and keeps the finished runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from leanbatch.cli_args import CLIError, build_parser, check_micro_options, check_out_folder, int_list

__all__ = ["main", "build_parser"]

# what the bench extra installs
_EXTRA = {"numpy", "scipy", "mlxtend", "sklearn", "matplotlib", "tqdm", "PIL"}


def run_report(args: argparse.Namespace) -> int:
    """``leanbatch report``: the tables and plots of finished benches, recomputed from their runs.

    They go to ``--out`` or to ``<name>.report/`` beside the input, and replace nothing but an
    earlier report's output there (:func:`leanbatch.engine.judging.outputs.check_report_folder`).
    """
    from leanbatch.engine.judging.outputs import (
        REPORT_KEY,
        check_report_folder,
        read_results,
        report_folder,
        results_file,
    )
    from leanbatch.engine.judging.parts import merge_results, rebuild
    from leanbatch.engine.judging.plots import PLOT_NAMES
    from leanbatch.engine.judging.report import closing, publish

    sources = [results_file(Path(r)) for r in args.results]
    if len(sources) > 1 and not args.out:
        raise CLIError("several results merge into one report: give --out a folder for it")
    try:
        payloads = [read_results(s) for s in sources]
        merged = payloads[0] if len(sources) == 1 else merge_results(payloads, [str(s) for s in sources])
        payload = rebuild(merged, str(sources[0]), args.clock)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CLIError(
            str(e)
            if isinstance(e, ValueError)
            else f"{sources[0]}: not a results.json ({type(e).__name__}: {e})"
        ) from None
    payload[REPORT_KEY] = str(sources[0]) if len(sources) == 1 else [str(s) for s in sources]
    out = Path(args.out) if args.out else report_folder(sources[0])

    def check(folder: Path) -> None:  # it holds nothing but an earlier report of these sources
        for s in sources:
            check_report_folder(folder, s, (*PLOT_NAMES, "report.html"))

    check_out_folder(out, check)
    written = publish(payload, out / "results.json", None if args.no_plots else out)
    print(closing(payload, written, args.tables))
    return 0


def run_micro(args: argparse.Namespace) -> int:
    """``leanbatch micro plan|update|select``."""
    from leanbatch.cli_bench import resolve_device
    from leanbatch.micro import overheads as micro

    json_path = check_micro_options(args)
    if args.micro == "plan":
        sizes = int_list(args.sizes, "--sizes", positive=True, parse=lambda v: int(float(v)))  # 1e8 too
        if args.world is not None and not args.shard:
            raise CLIError("--world simulates the ranks of a sharded plan: add --shard")
        if args.shard:
            from leanbatch.micro import sharded as micro_sharded

            world = 8 if args.world is None else args.world
            if world < 1 or min(sizes) < world:
                raise CLIError(f"--world must be >= 1 and at most the smallest size, got {world}")
            rows = micro_sharded.bench_plan_sharded(sizes, world, args.repeats, args.policy)
            print(micro_sharded.format_plan_sharded(rows))
        else:
            rows = micro.bench_plan(sizes, repeats=args.repeats, policy=args.policy)
            print(micro.format_plan(rows))
    elif args.micro == "update":
        rows = micro.bench_update(args.num_samples, args.batch_size, args.steps, resolve_device(args.device))
        print(micro.format_update(rows))
    else:
        rows = micro.bench_select(args.batch_size, args.steps, resolve_device(args.device))
        print(micro.format_select(rows))
    if json_path is not None:
        micro.write_json(json_path, args.micro, rows)
        print(f"wrote {json_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``leanbatch`` console script and ``python -m leanbatch``; returns the exit status.

    Bad input is one line on stderr and status 2; Ctrl-C at any point (imports and data loading
    included) is one line and status 130.
    """
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("leanbatch: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    import warnings

    # torch's own note when numpy is absent (a base install): the command needs no numpy to start
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a one-line usage error already printed
        return e.code if isinstance(e.code, int) else 2
    args.argv = argv
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _EXTRA:
            raise
        need = f'leanbatch {args.command} needs the bench extra: pip install "leanbatch[bench]" (no module {e.name!r})'
        print(f"leanbatch: error: {need}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:  # a write failed (disk full, a file vanished): the reason, not a traceback
        print(f"leanbatch: error: {e}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from leanbatch.arms.methods import ArmError
    from leanbatch.cli_bench import run_bench
    from leanbatch.engine.judging.journal import JournalError
    from leanbatch.engine.running.cluster import ClusterError
    from leanbatch.engine.running.contract import TaskError

    bad: tuple[type[Exception], ...] = (CLIError, ArmError, TaskError, JournalError, ClusterError)
    if args.command == "bench" and not args.task:
        from leanbatch.tasks.images.data import DataError
        from leanbatch.tasks.images.presets import PresetError

        bad += (DataError, PresetError)
    try:
        if args.command == "bench":
            return run_bench(args)
        if args.command == "report":
            return run_report(args)
        return run_micro(args)
    except bad as e:
        print(f"leanbatch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
