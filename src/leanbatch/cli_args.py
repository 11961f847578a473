"""The ``leanbatch`` command's arguments: the parser of ``bench``, ``report`` and ``micro``.

>>> args = build_parser().parse_args(["bench", "--quick", "--seeds", "0,1"])
>>> args.command, args.quick
('bench', True)
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["CLIError", "build_parser"]


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
        prog="leanbatch",
        description="leanbatch: skip the training work your model does not need, and measure whether it paid.",
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
