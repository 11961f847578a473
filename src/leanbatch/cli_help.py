"""The texts of ``leanbatch bench --help``: what the command does, examples to copy, and the note
that a bracketed method needs quotes in a shell. Every line is at most 100 columns.

>>> max(len(line) for line in (BENCH_DESCRIPTION + EXAMPLES).splitlines()) <= 100
True
"""

from __future__ import annotations

import argparse
import shutil

__all__ = ["BENCH_DESCRIPTION", "EXAMPLES", "HelpFormatter"]

WIDTH = 100  # the widest line of the help, whatever the terminal


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the epilog's lines as written (tables, examples) and wraps the
    options' help to the terminal, at most :data:`WIDTH` columns."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=min(shutil.get_terminal_size().columns, WIDTH) - 2)


BENCH_DESCRIPTION = """\
Train a task (yours with --task, else the built-in image task) under each method with the same
seeds, beside the baseline trained shorter and on smaller batches (the envelope) and, where it ran,
each method's uniform twin. Prints a compact line per finished run, then the answer last (no wider
than the terminal); the full tables go to report.html and results.json in --out (--tables prints
them too)."""

EXAMPLES = """\
examples:
  leanbatch bench --quick                                   # built-in task: 5,000 MNIST digits
  leanbatch bench --task path/to/file.py:train --seeds 0,1,2   # your train(run) (or pkg.mod:train)
  leanbatch bench --task my_tasks:train --metric eval_loss --controls   # a loss: lower is better
  leanbatch bench --preset cifar10 --data .data/cifar10     # CIFAR-10, small CNN, 15 epochs
  leanbatch bench --methods 'baseline,infobatch,obs[keep=0.7]' --budgets 0.5,0.7,1 --controls
  leanbatch bench --task my_tasks:train --tolerance 0.5%    # t->target within 0.5% of the baseline
  leanbatch report leanbatch-results --clock wall --tables  # judged again from a results.json

Quote a method with brackets in a shell: 'baseline[budget=0.5]' or "sb[keep=0.7]" (unquoted, the
shell reads [...] as a file pattern). docs/bench.md has the whole guide.
"""
