"""A study's progress on stderr: a tqdm bar of the runs done of all, the time elapsed and the ETA,
and the arm that trains now (its seed, its epoch, its last metric), for ``leanbatch bench`` and
``bench(..., progress=True)``.

The bar counts runs, each in fractions as it trains (its data's ``progress``): the arms of a seed
take turns and finish together, so the fraction grows evenly and the ETA holds. Lines printed
while it runs (:meth:`Progress.write`) go above it.

Example:
    >>> import io
    >>> from leanbatch.arms.grid import study_arms
    >>> from leanbatch.engine.running.study import Study, run_study
    >>> study = Study(lambda run: 1.0, study_arms("baseline", budgets="none", batch_budgets="none"), [0, 1])
    >>> with Progress(study, file=io.StringIO()) as bar:
    ...     _ = run_study(study, on_run=bar.done, on_log=bar.log)
    >>> bar.runs_done, "2 of 2 runs done" in bar.file.getvalue()
    (2, True)
"""

from __future__ import annotations

import sys
from typing import IO, Any

from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.study import Study

__all__ = ["Progress"]

_FORMAT = "{desc} {percentage:3.0f}%|{bar:16}| {elapsed} elapsed, ETA {remaining}{postfix}"


class Progress:
    """The bar over ``study``'s runs (its arms times its seeds) on ``file`` (default stderr), as
    wide as the terminal; its :meth:`log` and :meth:`done` are ``run_study``'s ``on_log`` and ``on_run``."""

    def __init__(self, study: Study, file: IO[str] | None = None) -> None:
        from tqdm import tqdm

        self.study, self.file = study, file if file is not None else sys.stderr
        self.runs_done = 0
        self._live: dict[tuple[str, int], float] = {}  # runs under way: their trained fraction
        self._bar = tqdm(total=self._total(), file=self.file, bar_format=_FORMAT, dynamic_ncols=True,
                         desc=self._desc(), postfix="", mininterval=0.5)  # fmt: skip

    def _total(self) -> int:
        return max(1, len(self.study.arms) * len(self.study.seeds))

    def _desc(self) -> str:
        return f"{self.runs_done} of {self._total()} runs done,"

    def _move(self) -> None:
        self._bar.total = self._total()  # a default method left out shortens the study
        self._bar.set_description_str(self._desc(), refresh=False)
        self._bar.update(self.runs_done + sum(self._live.values()) - self._bar.n)

    def log(self, run: Run) -> None:
        """At each ``run.log``: the run's fraction trained, and what trains now."""
        self._live[(run.label, run.seed)] = min(1.0, max(0.0, run.progress))
        last = run.epochs[-1]
        value = "" if last.metric is None else f", {self.study.metric} {last.metric:.4g}"
        self._bar.set_postfix_str(f"{run.label} seed {run.seed} epoch {last.epoch}{value}", refresh=False)
        self._move()

    def done(self, record: RunRecord) -> None:
        """A run finished."""
        self._live.pop((record.method, record.seed), None)
        self.runs_done += 1
        self._move()

    def write(self, line: str) -> None:
        """Print ``line`` on stdout above the bar."""
        self._bar.write(line, file=sys.stdout)

    def close(self) -> None:
        """Draw the bar a last time and leave it."""
        self._bar.refresh()
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
