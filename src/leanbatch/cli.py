"""The ``leanbatch`` command: measure the speed-up on real data.

``leanbatch bench`` trains the same model with the same seeds under each method and prints a
side-by-side table; ``leanbatch micro plan|update|select`` times the library's own overheads.
Run ``leanbatch bench --help`` for the options. Bad input prints one line on stderr and exits
with status 2; Ctrl-C stops cleanly (status 130) and keeps the finished runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "build_parser"]


from leanbatch.cli_args import (  # argparse only: torch loads inside main()
    CLIError,
    build_parser,
    check_micro_options,
)
from leanbatch.cli_bench import int_list, publish, resolve_device, run_bench


def run_report(args: argparse.Namespace) -> int:
    """``leanbatch report``: the tables and plots of a finished bench, recomputed from its runs.

    They go to ``--out`` or to ``<name>.report/`` beside the input, and replace nothing but an
    earlier report's output there (:func:`leanbatch.bench.outputs.check_report_folder`).
    """
    from leanbatch.bench.outputs import REPORT_KEY, check_report_folder, report_folder, results_file
    from leanbatch.bench.plots import PLOT_NAMES
    from leanbatch.bench.report import merge_results, read_results, rebuild

    sources = [results_file(Path(r)) for r in args.results]
    source = sources[0]
    if len(sources) > 1 and not args.out:
        raise CLIError("several results merge into one report: give --out a folder for it")
    try:
        payloads = [read_results(s) for s in sources]
        payload = rebuild(
            payloads[0] if len(sources) == 1 else merge_results(payloads, [str(s) for s in sources])
        )
    except ValueError as e:
        raise CLIError(str(e)) from None
    except (KeyError, TypeError) as e:
        names = ", ".join(str(s) for s in sources)
        raise CLIError(f"{names}: a results.json without the runs' details ({e})") from None
    payload["config"]["clock"] = args.clock
    payload[REPORT_KEY] = str(source) if len(sources) == 1 else [str(s) for s in sources]
    out = Path(args.out) if args.out else report_folder(source)
    try:
        if out.exists() and not out.is_dir():
            raise CLIError(f"--out {out} exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        for s in sources:
            check_report_folder(out, s, PLOT_NAMES)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None
    except ValueError as e:
        raise CLIError(str(e)) from None
    written = publish(payload, out / "results.json", None if args.no_plots else out)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


# ---------------------------------------------------------------------------- micro
def run_micro(args: argparse.Namespace) -> int:
    """``leanbatch micro plan|update|select``."""
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
        device = resolve_device(args.device)
        rows = micro.bench_update(args.num_samples, args.batch_size, args.steps, device)
        print(micro.format_update(rows))
    else:
        device = resolve_device(args.device)
        rows = micro.bench_select(args.batch_size, args.steps, device)
        print(micro.format_select(rows))
    if json_path is not None:
        micro.write_json(json_path, args.micro, rows)
        print(f"wrote {json_path}")
    return 0


# ---------------------------------------------------------------------------- entry point
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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a one-line usage error already printed
        return e.code if isinstance(e.code, int) else 2
    args.argv = argv
    if args.command is None:
        parser.print_help()
        return 2
    from leanbatch.bench.data import DataError
    from leanbatch.bench.methods import MethodError
    from leanbatch.bench.presets import PresetError

    try:
        if args.command == "bench":
            return run_bench(args)
        if args.command == "report":
            return run_report(args)
        return run_micro(args)
    except (CLIError, DataError, MethodError, PresetError) as e:
        print(f"leanbatch: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:  # a write failed (disk full, a file vanished): the reason, not a traceback
        print(f"leanbatch: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
