"""The ``leanbatch`` command's arguments: the parser of ``bench``, ``report`` and ``micro``, and the
checks of what it parsed that need more than one option or the file system (run before any work).

>>> args = build_parser().parse_args(["bench", "--quick", "--seeds", "0,1"])
>>> args.command, args.quick
('bench', True)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["CLIError", "build_parser", "check_training_options", "check_out_folder", "check_micro_options"]


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


class _TableFormatter(argparse.RawDescriptionHelpFormatter, _Formatter):
    """:class:`_Formatter` that keeps the description's and the epilog's lines as written (tables)."""


def _int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return v


def _float(text: str) -> float:
    """A finite float: ``nan`` and ``inf`` are refused here, for every float option at once."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``leanbatch`` command."""
    from leanbatch.bench.data import BUILTIN_DATASETS
    from leanbatch.bench.help_text import methods_help
    from leanbatch.bench.methods import DEFAULT_METHODS, global_setting
    from leanbatch.bench.presets import DEFAULT_BATCH_BUDGETS, DEFAULT_BUDGETS, PRESETS

    parser = _Parser(
        prog="leanbatch",
        description="leanbatch: skip the training work your model does not need, and measure whether it paid.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{bench,report,micro}", parser_class=_Parser)

    b = sub.add_parser(
        "bench",
        help="train with each method on real data and compare time and accuracy",
        description=(
            "Train the same model with the same seeds under each method; print a table\n"
            "and write results.json and PNG plots to --out."
        ),
        epilog=methods_help(),
        formatter_class=_TableFormatter,
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
        default=",".join(DEFAULT_METHODS),
        help="comma-separated method kinds, each optionally with settings in brackets (a row of its own), "
        "e.g. 'infobatch+sb[start=0.2,keep=0.7]'; every kind and setting is listed below",
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
        "--batch-budgets",
        default=None,
        help="the baseline also trained for all its steps on batches of these fractions of --batch-size "
        "(round(b x B) rows): the envelope's second family; 'none' to skip "
        f"(default {DEFAULT_BATCH_BUDGETS})",
    )
    g.add_argument(
        "--controls",
        action="store_true",
        help="run each method that has a uniform twin beside it (the same budget chosen at random; listed "
        "below) and compare the two: what the choosing buys",
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
        "--lr-rule",
        choices=("same", "scaled"),
        default="same",
        help="LR of a step that trains fewer rows than --batch-size (a batch budget, a selected batch): "
        "the same, or scaled by rows / batch size",
    )
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

    h = b.add_argument_group(
        "method settings for every row that has them (brackets win; defaults: the papers')"
    )
    for option, kind, meaning in (
        ("--prune-ratio", _float, "share of the below-mean samples pruned"),
        ("--delta", _float, "share of the epochs that prune"),
        ("--sb-keep", _float, "share of a batch trained on"),
        ("--sb-start", _float, "start (share of training)"),
        ("--sb-end", _float, "end (share of training)"),
        ("--sb-scale", _float, "selection-pass downsampling"),
        ("--sb-interrupt", _int, "every n-th batch trains in full"),
    ):
        name, kinds, default = global_setting(option[2:].replace("-", "_"))
        h.add_argument(option, type=kind, default=default, help=f"{name} of {', '.join(kinds)}: {meaning}")
    h.add_argument(
        "--stack-scores",
        choices=("selection", "trained"),
        default="selection",
        help="infobatch+sb: scores from the selection pass (all examples) or the trained ones",
    )

    o = b.add_argument_group("output")
    o.add_argument(
        "--out",
        default="leanbatch-results",
        help="folder for results.json and the plots; a results.json already there is replaced only by a "
        "complete run (an interrupted one goes to results.partial.json)",
    )
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
        "updated results.json and plots to --out (default: <name>.report/ beside the results file). "
        "It never writes over its input or a file another command wrote.",
        formatter_class=_Formatter,
    )
    r.add_argument(
        "results",
        nargs="+",
        help="a results.json, or the folder that holds it; several (one bench run on other --seeds, e.g. "
        "one per core) merge into one report, written to --out",
    )
    r.add_argument(
        "--out",
        default=None,
        help="folder for results.json and the plots (default: <name>.report/ beside the results file)",
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
    mp.add_argument(
        "--world", type=_int, default=None, help="ranks simulated in one process (with --shard; 8)"
    )
    mp.add_argument(
        "--shard",
        action="store_true",
        help="sharded scores and plans (shard_scores=True), per simulated rank",
    )
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


# ---------------------------------------------------------------------------- checks of parsed values
def _option(value: Any, option: str, low: float | None = None, high: float | None = None, **kw: Any) -> float:
    """``value`` checked by :func:`leanbatch.checks.check_real` under the option's name; CLIError if not."""
    from leanbatch.checks import check_real

    try:
        return check_real(value, option, low, high, **kw)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _count(value: Any, option: str, minimum: int = 1) -> int:
    """``value`` checked by :func:`leanbatch.checks.check_int` under the option's name; CLIError if not."""
    from leanbatch.checks import check_int

    try:
        return check_int(value, option, minimum)
    except (TypeError, ValueError) as e:
        raise CLIError(str(e)) from None


def check_training_options(args: argparse.Namespace) -> None:
    """Raise :class:`CLIError` unless the training options every method shares are in range.

    NaN and infinity never pass (the parser already refuses them; this holds for a namespace
    built any other way too); the methods' own ranges are checked per method.

    Example:
        >>> args = build_parser().parse_args(["bench", "--momentum", "0"])
        >>> try:
        ...     check_training_options(args)
        ... except CLIError as e:
        ...     print(str(e).split(": ")[0])
        --momentum must be a finite number in (0, 1), got 0.0
    """
    _count(args.batch_size, "--batch-size")
    _option(args.lr, "--lr", 0.0, low_open=True)
    _option(
        args.momentum,
        "--momentum",
        0.0,
        1.0,
        low_open=True,
        high_open=True,
        hint="the SGD is Nesterov, which needs a momentum > 0",
    )
    _option(args.weight_decay, "--weight-decay", 0.0)
    _option(args.warmup, "--warmup", 0.0, 1.0, high_open=True)
    _option(args.tolerance, "--tolerance", 0.0)
    for name in ("prune_ratio", "delta", "sb_keep", "sb_start", "sb_end", "sb_scale"):  # ranges: per method
        _option(getattr(args, name), "--" + name.replace("_", "-"))
    if args.threads is not None:
        _count(args.threads, "--threads")


def check_out_folder(out: Path) -> None:
    """Create ``--out`` and raise :class:`CLIError` unless a file can be written in it and it holds
    no results.json that is not a leanbatch result (which would be written over).

    Example:
        >>> try:
        ...     check_out_folder(Path("/dev/null"))
        ... except CLIError as e:
        ...     print(e)
        --out /dev/null exists and is not a folder
    """
    from leanbatch.bench.files import check_writable_folder
    from leanbatch.bench.outputs import check_bench_out

    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        check_writable_folder(out)
    except OSError as e:
        raise CLIError(f"cannot write --out {out}: {e.strerror or e}") from None
    try:
        check_bench_out(out)
    except ValueError as e:
        raise CLIError(str(e)) from None


def check_micro_options(args: argparse.Namespace) -> Path | None:
    """The ``--json`` file of ``leanbatch micro`` (None without one), after checking, before anything
    runs, that every count is at least 1 (a batch to select from at least 2) and the file writable.

    Example:
        >>> args = build_parser().parse_args(["micro", "update", "--steps", "0"])
        >>> try:
        ...     check_micro_options(args)
        ... except CLIError as e:
        ...     print(e)
        --steps must be an int >= 1, got 0
    """
    from leanbatch.bench.files import check_target, check_writable_folder

    if args.micro is None:
        raise CLIError("micro needs a benchmark: plan, update or select (see leanbatch micro --help)")
    for name in ("repeats", "steps", "batch_size", "num_samples"):
        if hasattr(args, name):
            _count(
                getattr(args, name),
                "--" + name.replace("_", "-"),
                2 if args.micro == "select" and name == "batch_size" else 1,
            )
    if args.micro == "update" and args.batch_size > args.num_samples:
        raise CLIError(f"--batch-size {args.batch_size} is larger than --num-samples {args.num_samples}")
    if not args.json:
        return None
    path = Path(args.json)
    try:
        check_target(path)
        check_writable_folder(path.parent)
    except OSError as e:
        raise CLIError(f"cannot write --json {path}: {e}") from None
    return path
