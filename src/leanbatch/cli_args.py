"""The ``leanbatch`` command's arguments: the parser of ``bench``, ``report`` and ``micro``, and the
checks of what it parsed. Building the parser needs torch only (no extra), so a base install's
``leanbatch --help`` works; a subcommand that needs the ``bench`` extra says so when it runs.

>>> args = build_parser().parse_args(["bench", "--quick", "--seeds", "0,1"])
>>> args.command, args.quick
('bench', True)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "IMAGE_OPTIONS",
    "MAX_SEED",
    "CLIError",
    "build_parser",
    "check_micro_options",
    "check_out_folder",
    "check_training_options",
    "int_list",
]

MAX_SEED = 2**31 - 1  # a seed every generator takes (torch, numpy, Python), with room for offsets
# the built-in image task's options: refused with --task, which brings its own training
IMAGE_OPTIONS = (
    "data", "preset", "quick", "epochs", "batch_size", "limit_train", "limit_test", "model", "widths", "lr",
    "momentum", "weight_decay", "warmup", "lr_rule", "augment", "channels_last", "device",
)  # fmt: skip


class CLIError(Exception):
    """Bad input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    """A finite float: ``nan`` and ``inf`` are refused here, for every float option at once."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_list(
    text: str, option: str, positive: bool = False, high: int | None = None, parse: Any = int
) -> list[int]:
    """The comma-separated integers of ``option`` (each read with ``parse``, at most ``high``);
    :class:`CLIError` of one line if not.

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
    if high is not None and any(not 0 <= v <= high for v in values):
        raise CLIError(f"{option} must be integers from 0 to {high}, got {text!r}")
    return values


def _bench_parser(sub: Any) -> None:
    from leanbatch.arms.registry import kinds_help
    from leanbatch.cli_cluster import ray_options
    from leanbatch.cli_help import BENCH_DESCRIPTION, EXAMPLES, HelpFormatter

    b = sub.add_parser(
        "bench", help="train a task under each method and compare time and metric",
        description=BENCH_DESCRIPTION, epilog=f"{EXAMPLES}\n{kinds_help()}", formatter_class=HelpFormatter,
    )  # fmt: skip
    _run_options(b)
    _image_options(b)
    _method_options(b)
    ray_options(b, _int)
    _output_options(b)


def _run_options(b: Any) -> None:
    """``bench``'s options of what to run: the task, the arms, the seeds, the metric."""
    from leanbatch.arms.methods import DEFAULT_BATCH_BUDGETS, DEFAULT_BUDGETS, DEFAULT_METHODS

    g = b.add_argument_group("what to run")
    g.add_argument(
        "--task",
        help="your task: path/to/file.py:train or package.module:train, a function train(run) -> metric (docs/bench.md); default: the built-in image task",
    )
    g.add_argument(
        "--methods",
        help=f"comma-separated method kinds, each optionally with settings in brackets (an arm of its own), e.g. 'infobatch+sb[start=0.2,keep=0.7]' (default {','.join(DEFAULT_METHODS)}; those that select are left out when a --task trains without run.select); every kind below",
    )
    g.add_argument("--seeds", help="comma-separated seeds (default 0; --quick: 0,1,2)")
    g.add_argument(
        "--budgets",
        help=f"the baseline also trained for these shares of its steps, its schedule ending at its own end; 'none' to skip (default {DEFAULT_BUDGETS})",
    )
    g.add_argument(
        "--batch-budgets",
        help=f"the baseline also trained for all its steps on batches of these shares of the batch size; 'none' to skip (default {DEFAULT_BATCH_BUDGETS})",
    )
    g.add_argument(
        "--controls",
        action="store_true",
        help="run each method that has a uniform twin beside it (the same budget chosen at random; below): what the choosing buys",
    )
    g.add_argument(
        "--metric",
        help="the name of the metric the task logs and returns (default: metric; the image task's: accuracy)",
    )
    g.add_argument(
        "--goal",
        choices=("max", "min"),
        help="max: higher is better; min: lower is better (default: min for a name holding loss, perplexity or error, else max)",
    )
    g.add_argument(
        "--interleave",
        choices=("epoch", "run"),
        default="epoch",
        help="epoch (default): the arms of a seed take turns, an epoch each (at run.log), so a busy spell slows them alike; run: whole runs, the order rotated per seed",
    )
    g.add_argument("--threads", type=_int, help="torch CPU threads (default: torch's)")


def _image_options(b: Any) -> None:
    """``bench``'s options of the built-in image task."""
    from leanbatch.tasks.images.presets import BUILTIN_DATASETS, PRESETS

    t = b.add_argument_group("the built-in image task (without --task)")
    t.add_argument(
        "--data",
        help=f"built-in dataset ({', '.join(BUILTIN_DATASETS)}; default mnist-5k) or a path: .npz with x_train/y_train/x_test/y_test, a CIFAR-10 python-batches folder, or an ImageFolder",
    )
    t.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help="quick: 5,000 bundled MNIST digits, 8 epochs, seeds 0,1,2 (about 2.2 minutes on 2 idle CPU cores); cifar10: CIFAR-10 from --data, small CNN, 15 epochs, seeds 0,1,2; explicit options win",
    )
    t.add_argument("--quick", action="store_true", help="the same as --preset quick")
    t.add_argument("--epochs", type=_int, help="epochs of the full run (default 8)")
    t.add_argument("--batch-size", type=_int, help="samples per batch (default 128)")
    t.add_argument("--limit-train", type=_int, help="use only this many training samples")
    t.add_argument("--limit-test", type=_int, help="use only this many test samples")
    t.add_argument(
        "--model",
        choices=("cnn", "resnet"),
        help="default: resnet for 32x32 RGB, else cnn (--preset cifar10: cnn)",
    )
    t.add_argument("--widths", help="channel widths of the model's stages, e.g. 16,32,64")
    t.add_argument("--lr", type=_float, help="peak learning rate (SGD, per-step cosine; default 0.1)")
    t.add_argument("--momentum", type=_float, help="SGD momentum, Nesterov (default 0.9)")
    t.add_argument("--weight-decay", type=_float, help="SGD weight decay (default 5e-4)")
    t.add_argument("--warmup", type=_float, help="share of training with linear LR warm-up (default 0.03)")
    t.add_argument(
        "--lr-rule",
        choices=("same", "scaled"),
        help="LR of a step that trains fewer rows than --batch-size (a batch budget, a selected batch): the same (default), or scaled by rows / batch size",
    )
    t.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        help="random crop + flip (default: on for RGB images)",
    )
    t.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        help="channels-last memory format (default: on)",
    )
    t.add_argument("--device", help="auto (default: cuda when available, else cpu), cpu, cuda, cuda:1")


def _method_options(b: Any) -> None:
    """``bench``'s options that set a method setting in every arm that has it."""
    from leanbatch.arms.methods import OPTIONS, option_setting

    h = b.add_argument_group(
        "method settings for every arm that has them (brackets win; defaults: the papers')"
    )
    for option in OPTIONS:
        name, kinds, default = option_setting(option)
        kind = str if option == "stack_scores" else _int if isinstance(default, int) else _float
        h.add_argument(
            "--" + option.replace("_", "-"),
            type=kind,
            help=f"{name} of {', '.join(kinds)} (default {default})",
        )


def _output_options(b: Any) -> None:
    """``bench``'s output options."""
    o = b.add_argument_group("output")
    o.add_argument(
        "--out",
        default="leanbatch-results",
        help="folder for results.json, the plots and report.html (default leanbatch-results); a results.json already there is replaced only by a complete study (an interrupted one goes to results.partial.json)",
    )
    o.add_argument(
        "--tolerance",
        default="1%",
        help="how near the baseline's final metric counts as reaching it (t->target): N%% of that metric "
        "(default 1%%, the same on any scale) or a number in the metric's units",
    )
    o.add_argument(
        "--clock",
        choices=("work", "wall", "cpu"),
        default="work",
        help="what the verdicts compare arms at: work (default: FLOP-weighted passes, the same on any machine), wall (training wall-clock, for one quiet machine) or cpu (the process's CPU time, steadier with --threads 1); the wall clock is reported beside in every case",
    )
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots and report.html")
    o.add_argument("--tables", action="store_true", help="also print the full tables, before the answer")
    o.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (on a terminal: runs done of all, elapsed, ETA, the arm, its epoch, its metric)",
    )


def _report_parser(sub: Any) -> None:
    r = sub.add_parser(
        "report", help="recompute the tables and plots of finished benches from their results.json, merging parts",
        description="Read a results.json (or the folder that holds it), recompute the answer, the summary, the envelope "
        "and the controls from its runs, print them, and write results.json, the plots and report.html to --out "
        "(default: <name>.report/ beside the results file). Several files (parts of one study: other --seeds or "
        "--methods, one per core, machine or torchrun job) merge into one report. Nothing is written over its input.",
    )  # fmt: skip
    r.add_argument("results", nargs="+", help="results.json files, or the folders that hold them")
    r.add_argument("--out", help="folder for the report (default: <name>.report/ beside the one input)")
    r.add_argument(
        "--clock",
        choices=("work", "wall", "cpu"),
        help="judge the stored runs again on this clock (default: the one the study ran on)",
    )
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots and report.html")
    r.add_argument("--tables", action="store_true", help="also print the full tables, before the answer")


def _micro_parser(sub: Any) -> None:
    m = sub.add_parser(
        "micro",
        help="micro-benchmarks of the library's overheads",
        description="Micro-benchmarks: epoch planning time and memory, update() and selection cost per step.",
    )
    msub = m.add_subparsers(dest="micro", metavar="{plan,update,select}", parser_class=_Parser)
    mp = msub.add_parser("plan", help="time and memory to plan one pruning epoch, for N samples")
    mp.add_argument("--sizes", default="1280000,10000000,100000000", help="comma-separated dataset sizes")
    mp.add_argument("--repeats", type=_int, default=5, help="plans timed per size (best is reported)")
    mp.add_argument("--policy", choices=("infobatch", "random"), default="infobatch")
    mp.add_argument("--world", type=_int, help="ranks simulated in one process (with --shard; 8)")
    mp.add_argument(
        "--shard",
        action="store_true",
        help="sharded scores and plans (shard_scores=True), per simulated rank",
    )
    mu = msub.add_parser("update", help="microseconds per InfoBatch.update() call")
    mu.add_argument("--num-samples", type=_int, default=60000)
    ms = msub.add_parser("select", help="Selective Backprop's selection cost per step vs a training step")
    for p, steps in ((mu, 300), (ms, 50)):
        p.add_argument("--batch-size", type=_int, default=128)
        p.add_argument("--steps", type=_int, default=steps, help="steps per timed block")
        p.add_argument("--device", default="cpu")
    for p in (mp, mu, ms):
        p.add_argument("--json", help="also write the figures to this JSON file")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``leanbatch`` command."""
    import leanbatch

    parser = _Parser(
        prog="leanbatch",
        description="leanbatch: skip the training work your model does not need, and measure whether it paid.",
    )
    parser.add_argument("--version", action="version", version=f"leanbatch {leanbatch.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{bench,report,micro}", parser_class=_Parser)
    _bench_parser(sub)
    _report_parser(sub)
    _micro_parser(sub)
    return parser


# ---------------------------------------------------------------------------- checks of parsed values
def _checked(check: Callable[..., Any], value: Any, option: str, *args: Any, **kw: Any) -> Any:
    """``check(value, option, ...)``, its refusal a :class:`CLIError`."""
    try:
        return check(value, option, *args, **kw)
    except (TypeError, ValueError) as e:
        raise CLIError(str(e)) from None


def check_training_options(args: argparse.Namespace) -> None:
    """Raise :class:`CLIError` unless the options every arm shares are in range (the image task's
    with it; the methods' own ranges are checked per arm)."""
    from leanbatch.checks import check_int, check_real
    from leanbatch.engine.judging.results import parse_tolerance

    nesterov = "the SGD is Nesterov, which needs a momentum > 0"
    share = {"low": 0.0, "high": 1.0, "high_open": True}
    for name, check, bounds in (
        ("batch_size", check_int, {"minimum": 1}),
        ("lr", check_real, {"low": 0.0, "low_open": True}),
        ("momentum", check_real, {**share, "low_open": True, "hint": nesterov}),
        ("weight_decay", check_real, {"low": 0.0}),
        ("warmup", check_real, share),
        ("threads", check_int, {"minimum": 1}),
    ):
        if getattr(args, name) is not None:
            _checked(check, getattr(args, name), "--" + name.replace("_", "-"), **bounds)
    args.tolerance = _checked(parse_tolerance, args.tolerance, "--tolerance")


def check_out_folder(out: Path, check: Callable[[Path], None] | None = None) -> None:
    """Create ``--out`` and raise :class:`CLIError` unless a file can be written in it and ``check``
    passes (default: it holds no results.json that is not a leanbatch result, which would be
    written over).

    Example:
        >>> try:
        ...     check_out_folder(Path("/dev/null"))
        ... except CLIError as e:
        ...     print(e)
        --out /dev/null exists and is not a folder
    """
    from leanbatch.engine.judging.files import check_writable_folder
    from leanbatch.engine.judging.outputs import check_bench_out

    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        check_writable_folder(out)
        (check or check_bench_out)(out)
    except OSError as e:
        raise CLIError(f"cannot write --out {out}: {e.strerror or e}") from None
    except ValueError as e:
        raise CLIError(str(e)) from None


def check_micro_options(args: argparse.Namespace) -> Path | None:
    """The ``--json`` file of ``leanbatch micro`` (None without one), after checking, before anything
    runs, that every count is at least 1 (a batch to select from at least 2) and the file writable."""
    from leanbatch.checks import check_int
    from leanbatch.engine.judging.files import check_target, check_writable_folder

    if args.micro is None:
        raise CLIError("micro needs a benchmark: plan, update or select (see leanbatch micro --help)")
    for name in ("repeats", "steps", "batch_size", "num_samples"):
        if hasattr(args, name):
            low = 2 if args.micro == "select" and name == "batch_size" else 1
            _checked(check_int, getattr(args, name), "--" + name.replace("_", "-"), low)
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
