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
from typing import Any, NoReturn

__all__ = ["main", "build_parser"]


class CLIError(Exception):
    """Bad input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show a default only where it says something: not None/False, not already in the help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action) or text


def _int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return v


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``leanbatch`` command."""
    from leanbatch.bench.data import BUILTIN_DATASETS
    from leanbatch.bench.methods import METHODS
    from leanbatch.bench.presets import DEFAULT_BUDGETS, PRESETS

    parser = _Parser(
        prog="leanbatch", description="leanbatch: cheaper PyTorch training at the same accuracy."
    )
    sub = parser.add_subparsers(dest="command", metavar="{bench,report,micro}", parser_class=_Parser)

    b = sub.add_parser(
        "bench",
        help="train with each method on real data and compare time and accuracy",
        description=(
            "Train the same model with the same seeds under each method; print a table "
            "and write results.json and PNG plots to --out."
        ),
        formatter_class=_Formatter,
    )
    g = b.add_argument_group("what to run")
    g.add_argument(
        "--data",
        default=None,
        help=f"built-in dataset ({', '.join(BUILTIN_DATASETS)}; default mnist-5k) or a path: .npz with "
        "x_train/y_train/x_test/y_test, a CIFAR-10 python-batches folder, or an ImageFolder",
    )
    g.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated methods, each optionally with overrides, e.g. 'infobatch+sb[sb_start=0.2]'",
    )
    g.add_argument("--epochs", type=_int, default=None, help="epochs per run (default 8)")
    g.add_argument("--seeds", default=None, help="comma-separated seeds (default 0)")
    g.add_argument("--batch-size", type=_int, default=128, help="samples per batch")
    g.add_argument(
        "--budgets",
        default=None,
        help="the baseline also trained for these fractions of its steps, with its schedule ending at "
        "its own end: the frontier every method is compared with at equal time; 'none' to skip "
        f"(default {DEFAULT_BUDGETS})",
    )
    g.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=None,
        help="quick: a first look, 5,000 bundled MNIST digits, 8 epochs, seeds 0,1,2 (under 2 minutes on 2 "
        "CPU cores); cifar10: CIFAR-10 from --data, small CNN, 15 epochs, seeds 0,1,2 (see the README "
        "for its time); explicit options win",
    )
    g.add_argument("--quick", action="store_true", help="the same as --preset quick")
    g.add_argument(
        "--interleave",
        choices=("epoch", "run"),
        default="epoch",
        help="epoch: the methods of a seed train side by side, one epoch of each in turn, so a busy "
        "spell of the machine slows them alike; run: one whole run after another",
    )
    g.add_argument("--limit-train", type=_int, default=None, help="use only this many training samples")
    g.add_argument("--limit-test", type=_int, default=None, help="use only this many test samples")

    t = b.add_argument_group("training (the same for every method)")
    t.add_argument(
        "--model",
        choices=("cnn", "resnet"),
        default=None,
        help="default: resnet for 32x32 RGB, else cnn (--preset cifar10: cnn)",
    )
    t.add_argument("--widths", default=None, help="channel widths of the model's stages, e.g. 16,32,64")
    t.add_argument("--lr", type=_float, default=0.1, help="peak learning rate (SGD, per-step cosine)")
    t.add_argument("--momentum", type=_float, default=0.9, help="SGD momentum (Nesterov)")
    t.add_argument("--weight-decay", type=_float, default=5e-4, help="SGD weight decay")
    t.add_argument("--warmup", type=_float, default=0.03, help="fraction of training with linear LR warm-up")
    t.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random crop + flip (default: on for RGB images)",
    )
    t.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="channels-last memory format (faster convolutions on CPU)",
    )
    t.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1")
    t.add_argument("--threads", type=_int, default=None, help="torch CPU threads (default: torch's)")

    h = b.add_argument_group("method hyperparameters (defaults: the published ones)")
    h.add_argument(
        "--prune-ratio", type=_float, default=0.5, help="InfoBatch/random: share of below-mean pruned"
    )
    h.add_argument("--delta", type=_float, default=0.875, help="InfoBatch/random: share of epochs that prune")
    h.add_argument(
        "--sb-keep", type=_float, default=0.5, help="Selective Backprop: share of a batch trained on"
    )
    h.add_argument(
        "--sb-start", type=_float, default=0.5, help="Selective Backprop: start (share of training)"
    )
    h.add_argument("--sb-end", type=_float, default=0.9, help="Selective Backprop: end (share of training)")
    h.add_argument(
        "--sb-scale", type=_float, default=0.5, help="Selective Backprop: selection-pass downsampling"
    )
    h.add_argument(
        "--sb-interrupt", type=int, default=2, help="Selective Backprop: every n-th batch trains in full"
    )
    h.add_argument(
        "--stack-scores",
        choices=("selection", "trained"),
        default="selection",
        help="infobatch+sb: scores from the selection pass (all examples) or the trained ones",
    )

    o = b.add_argument_group("output")
    o.add_argument("--out", default="leanbatch-results", help="folder for results.json and the plots")
    o.add_argument(
        "--tolerance", type=_float, default=0.2, help="accuracy points below baseline for t->target"
    )
    o.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time axis of the equal-time table and plot: training wall-clock, or the process's CPU time "
        "(steadier on a shared machine with --threads 1); results.json holds both",
    )
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument(
        "--no-progress", action="store_true", help="no progress bars (they hide off a terminal anyway)"
    )

    r = sub.add_parser(
        "report",
        help="recompute the tables and plots of a finished bench from its results.json",
        description="Read a results.json (or the folder holding it), recompute the summary and the "
        "equal-time comparison from its runs with this version, print both tables, and write the "
        "updated results.json and plots to --out (default: the results' own folder).",
        formatter_class=_Formatter,
    )
    r.add_argument("results", help="a results.json, or the folder that holds it")
    r.add_argument(
        "--out", default=None, help="folder for results.json and the plots (default: the results')"
    )
    r.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="time axis of the equal-time table"
    )
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")

    m = sub.add_parser(
        "micro",
        help="micro-benchmarks of the library's overheads",
        description="Micro-benchmarks: epoch planning time and memory, update() and selection cost per step.",
    )
    msub = m.add_subparsers(dest="micro", metavar="{plan,update,select}", parser_class=_Parser)
    mp = msub.add_parser(
        "plan",
        help="time and memory to plan one pruning epoch, for N samples",
        formatter_class=_Formatter,
    )
    mp.add_argument("--sizes", default="1280000,10000000,100000000", help="comma-separated dataset sizes")
    mp.add_argument("--repeats", type=_int, default=5, help="plans timed per size (best is reported)")
    mp.add_argument("--policy", choices=("infobatch", "random"), default="infobatch")
    mu = msub.add_parser(
        "update",
        help="microseconds per InfoBatch.update() call",
        formatter_class=_Formatter,
    )
    mu.add_argument("--batch-size", type=_int, default=128)
    mu.add_argument("--num-samples", type=_int, default=60000)
    mu.add_argument("--steps", type=_int, default=300, help="steps per timed block")
    mu.add_argument("--device", default="cpu")
    ms = msub.add_parser(
        "select",
        help="Selective Backprop's selection cost per step vs a training step",
        formatter_class=_Formatter,
    )
    ms.add_argument("--batch-size", type=_int, default=128)
    ms.add_argument("--steps", type=_int, default=50)
    ms.add_argument("--device", default="cpu")
    for p in (mp, mu, ms):
        p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return parser


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

    from leanbatch.bench.data import load_data
    from leanbatch.bench.methods import parse_methods
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
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.tolerance < 0:
        raise CLIError(f"--tolerance must be >= 0, got {args.tolerance}")
    if not 0.0 <= args.warmup < 1.0:
        raise CLIError(f"--warmup must be in [0, 1), got {args.warmup}")
    if args.lr <= 0:
        raise CLIError(f"--lr must be > 0, got {args.lr}")
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
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"cannot create --out {out}: {e.strerror}") from None

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
    results_path = out / "results.json"
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
        write_results(
            results_path, build_results(runs, config, data.describe(), args.tolerance, True, command)
        )

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
    written = _publish(payload, out, args.no_plots)
    print(f"\nwrote {', '.join(str(p) for p in written)} ({time.perf_counter() - t_start:.0f} s in all)")
    if interrupted:
        print(
            f"leanbatch: interrupted; kept the {len(runs)} finished run(s) in {results_path}", file=sys.stderr
        )
        return 130
    return 0


def _publish(payload: dict[str, Any], out: Path, no_plots: bool) -> list[Path]:
    """Write results.json, print both tables (the equal-time one on ``config.clock``), draw the plots."""
    from leanbatch.bench.plots import write_plots
    from leanbatch.bench.report import format_equal_time, format_table, write_results

    results_path = out / "results.json"
    write_results(results_path, payload)
    print()
    print(format_table(payload["summary"], payload["tolerance_points"]))
    print()
    cpu = payload["config"].get("clock") == "cpu"
    print(format_equal_time(payload["equal_time_cpu" if cpu else "equal_time"]))
    return [results_path] + ([] if no_plots else write_plots(payload, out))


def run_report(args: argparse.Namespace) -> int:
    """``leanbatch report``: the tables and plots of a finished bench, recomputed from its runs."""
    from leanbatch.bench.report import read_results, rebuild

    source = Path(args.results)
    try:
        payload = rebuild(read_results(source))
    except ValueError as e:
        raise CLIError(str(e)) from None
    except (KeyError, TypeError) as e:
        raise CLIError(f"{source}: a results.json without the runs' details ({e})") from None
    payload["config"]["clock"] = args.clock
    out = Path(args.out) if args.out else (source if source.is_dir() else source.parent)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"cannot create --out {out}: {e.strerror}") from None
    written = _publish(payload, out, args.no_plots)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


# ---------------------------------------------------------------------------- micro
def run_micro(args: argparse.Namespace) -> int:
    """``leanbatch micro plan|update|select``."""
    from leanbatch.bench import micro

    if args.micro is None:
        raise CLIError("micro needs a benchmark: plan, update or select (see leanbatch micro --help)")
    if args.micro == "plan":
        sizes = _int_list(args.sizes, "--sizes", positive=True, parse=lambda v: int(float(v)))  # 1e8 too
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
    if args.json:
        micro.write_json(Path(args.json), args.micro, rows)
        print(f"wrote {args.json}")
    return 0


# ---------------------------------------------------------------------------- entry point
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``leanbatch`` console script and ``python -m leanbatch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
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
    except KeyboardInterrupt:
        print("leanbatch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
