"""The ``leanbatch`` command: measure the speed-up on real data.

``leanbatch bench`` trains the same model with the same seeds under each method and prints a
side-by-side table; ``leanbatch micro plan|update|select`` times the library's own overheads.
Run ``leanbatch bench --help`` for the options. Bad input prints one line on stderr and exits
with status 2; Ctrl-C stops cleanly (status 130) and keeps the finished runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


from leanbatch.cli_args import (  # argparse only: torch loads inside main()
    CLIError,
    build_parser,
    check_micro_options,
    check_out_folder,
    check_training_options,
)


# ---------------------------------------------------------------------------- bench
def _int_list(text: str, option: str, positive: bool = False, parse: Callable[[str], int] = int) -> list[int]:
    """The comma-separated integers of ``option``, each read with ``parse``."""
    try:
        values = [parse(v) for v in text.split(",") if v.strip()]
    except (ValueError, OverflowError):
        raise CLIError(f"{option} must be comma-separated integers, got {text!r}") from None
    if positive and (not values or min(values) < 1):
        raise CLIError(f"{option} must be positive integers, got {text!r}")
    return values


def _parse_seeds(text: str) -> list[int]:
    seeds = _int_list(text, "--seeds")
    if not seeds:
        raise CLIError("--seeds is empty")
    if len(set(seeds)) != len(seeds):
        raise CLIError(f"--seeds lists a seed twice: {text}")
    return seeds


def _parse_widths(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(_int_list(text, "--widths", positive=True))


def _resolve_device(name: str) -> str:
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
    """``leanbatch bench``: validate everything first, then train, report and plot."""
    import torch

    from leanbatch.bench.data import check_image_size, load_data
    from leanbatch.bench.methods import parse_methods
    from leanbatch.bench.outputs import RESULTS, unfinished_path
    from leanbatch.bench.presets import parse_budgets, resolve, with_budgets
    from leanbatch.bench.report import build_results, write_results
    from leanbatch.bench.train import RunResult, TrainConfig, train_interleaved, train_run, warm_up

    if args.quick and args.preset not in (None, "quick"):
        raise CLIError(f"--quick and --preset {args.preset} conflict: give one of them")
    given = {k: getattr(args, k) for k in ("data", "epochs", "seeds", "budgets", "model", "widths")}
    opts = resolve("quick" if args.quick else args.preset, given)
    data_spec, epochs = opts["data"], opts["epochs"]
    seeds = _parse_seeds(opts["seeds"])
    if epochs < 1:
        raise CLIError(f"--epochs must be >= 1, got {epochs}")
    check_training_options(args)
    defaults = {
        "prune_ratio": args.prune_ratio,
        "delta": args.delta,
        "sb_keep": args.sb_keep,
        "sb_start": args.sb_start,
        "sb_end": args.sb_end,
        "sb_scale": args.sb_scale,
        "sb_interrupt": args.sb_interrupt,
        "stack_scores": args.stack_scores,
    }
    methods = with_budgets(parse_methods(args.methods, defaults), parse_budgets(opts["budgets"]))
    widths = _parse_widths(opts["widths"])
    device = _resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    data = load_data(data_spec, args.limit_train, args.limit_test)
    for note in data.notes:
        print(f"leanbatch: note: {note}", flush=True)
    if args.batch_size > data.num_train:
        raise CLIError(
            f"--batch-size {args.batch_size} is larger than the training set ({data.num_train} samples)"
        )
    cfg = TrainConfig(
        epochs=epochs,
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
    )
    scales = [m.hyperparameters()["sb_scale"] for m in methods if "sb_scale" in m.hyperparameters()]
    check_image_size(data, cfg.resolved_augment(data), scales)
    check_out_folder(out)

    config = {
        **cfg.as_dict(),
        "model": cfg.resolved_model(data),
        "augment": cfg.resolved_augment(data),
        "seeds": seeds,
        "methods": [{"label": m.label, "kind": m.kind, **m.hyperparameters()} for m in methods],
        "budgets": sorted({m.budget for m in methods if m.kind == "baseline"}),
        "preset": "quick" if args.quick else args.preset,
        "quick": bool(args.quick or args.preset == "quick"),
        "interleave": args.interleave,
        "clock": args.clock,
    }
    command = "leanbatch " + " ".join(shlex.quote(a) for a in (args.argv or []))
    bar = _progress_factory(not args.no_progress)
    results_path = out / RESULTS
    unfinished = unfinished_path(out)  # a result from before is only replaced by a complete one
    print(
        f"leanbatch bench: {data.name} ({data.num_train} train / {data.num_test} test, "
        f"{tuple(data.x_train.shape[1:])}), model {config['model']}, {epochs} epochs, batch {cfg.batch_size}, "
        f"seeds {seeds}, device {device}, {torch.get_num_threads()} threads",
        flush=True,
    )
    runs: list[RunResult] = []
    interrupted = False
    t_start = time.perf_counter()

    width = max(12, *(len(m.label) for m in methods))

    def finished(new_runs: list[RunResult]) -> None:
        for run in new_runs:
            runs.append(run)
            tot = run.totals()
            print(
                f"  {run.label:<{width}} seed {run.seed}: {run.final_acc:6.2f}% in {run.train_time:7.1f} s "
                f"(forwarded {tot['forward_fraction']:.2f}, backpropagated {tot['backward_fraction']:.2f})",
                flush=True,
            )
        write_results(unfinished, build_results(runs, config, data.describe(), args.tolerance, True, command))

    try:
        warm_up(data, cfg)
        for k, seed in enumerate(seeds):
            if args.interleave == "epoch":
                finished(train_interleaved(data, methods, seed, cfg, progress_bar=bar))
                continue
            # rotate the method order per seed, so a slow spell of a shared machine does not
            # always land on the same method
            for spec in methods[k % len(methods) :] + methods[: k % len(methods)]:
                finished([train_run(data, spec, seed, cfg, progress_bar=bar)])
    except KeyboardInterrupt:
        interrupted = True
    if not runs:
        print("leanbatch: interrupted before any run finished; nothing written", file=sys.stderr)
        return 130
    payload = build_results(runs, config, data.describe(), args.tolerance, interrupted, command)
    target = unfinished if interrupted else results_path
    written = _publish(payload, target, None if args.no_plots or target != results_path else out)
    if target != unfinished:
        unfinished.unlink(missing_ok=True)  # this run's own per-seed saves, now complete
    print(f"\nwrote {', '.join(str(p) for p in written)} ({time.perf_counter() - t_start:.0f} s in all)")
    if interrupted:
        kept = "" if target == results_path else f"; {results_path} from before is kept, and no plots drawn"
        print(
            f"leanbatch: interrupted; kept the {len(runs)} finished run(s) in {target}{kept}", file=sys.stderr
        )
        return 130
    return 0


def _publish(payload: dict[str, Any], results_path: Path, plots: Path | None) -> list[Path]:
    """Write ``results_path``, print both tables (the equal-time one on ``config.clock``), draw the
    plots into the folder ``plots`` (None: none); every file atomically."""
    from leanbatch.bench.plots import write_plots
    from leanbatch.bench.report import format_equal_time, format_table, write_results

    write_results(results_path, payload)
    print()
    print(format_table(payload["summary"], payload["tolerance_points"]))
    print()
    cpu = payload["config"].get("clock") == "cpu"
    print(format_equal_time(payload["equal_time_cpu" if cpu else "equal_time"]))
    return [results_path] + ([] if plots is None else write_plots(payload, plots))


def run_report(args: argparse.Namespace) -> int:
    """``leanbatch report``: the tables and plots of a finished bench, recomputed from its runs.

    They go to ``--out`` or to ``<name>.report/`` beside the input, and replace nothing but an
    earlier report's output there (:func:`leanbatch.bench.outputs.check_report_folder`).
    """
    from leanbatch.bench.outputs import REPORT_KEY, check_report_folder, report_folder, results_file
    from leanbatch.bench.plots import PLOT_NAMES
    from leanbatch.bench.report import read_results, rebuild

    source = results_file(Path(args.results))
    try:
        payload = rebuild(read_results(source))
    except ValueError as e:
        raise CLIError(str(e)) from None
    except (KeyError, TypeError) as e:
        raise CLIError(f"{source}: a results.json without the runs' details ({e})") from None
    payload["config"]["clock"] = args.clock
    payload[REPORT_KEY] = str(source)
    out = Path(args.out) if args.out else report_folder(source)
    try:
        if out.exists() and not out.is_dir():
            raise CLIError(f"--out {out} exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        check_report_folder(out, source, PLOT_NAMES)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None
    except ValueError as e:
        raise CLIError(str(e)) from None
    written = _publish(payload, out / "results.json", None if args.no_plots else out)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


# ---------------------------------------------------------------------------- micro
def run_micro(args: argparse.Namespace) -> int:
    """``leanbatch micro plan|update|select``."""
    from leanbatch.bench import micro

    json_path = check_micro_options(args)
    if args.micro == "plan":
        sizes = _int_list(args.sizes, "--sizes", positive=True, parse=lambda v: int(float(v)))  # 1e8 too
        if args.world is not None and not args.shard:
            raise CLIError("--world simulates the ranks of a sharded plan: add --shard")
        if args.shard:
            from leanbatch.bench import micro_sharded

            world = 8 if args.world is None else args.world
            if world < 1 or min(sizes) < world:
                raise CLIError(f"--world must be >= 1 and at most the smallest size, got {world}")
            rows = micro_sharded.bench_plan_sharded(sizes, world, args.repeats, args.policy)
            print(micro_sharded.format_plan_sharded(rows))
        else:
            rows = micro.bench_plan(sizes, repeats=args.repeats, policy=args.policy)
            print(micro.format_plan(rows))
    elif args.micro == "update":
        device = _resolve_device(args.device)
        rows = micro.bench_update(args.num_samples, args.batch_size, args.steps, device)
        print(micro.format_update(rows))
    else:
        device = _resolve_device(args.device)
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
