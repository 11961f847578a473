"""A study's report: :class:`Report` (what ``bench()`` returns, results.json's object), :func:`publish`
(the files) and :func:`closing` (what the command prints last: the answer).

Example:
    >>> Report({"a": 1})["a"], issubclass(Report, dict)
    (1, True)
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.files import atomic_write_text
from leanbatch.engine.judging.html import render
from leanbatch.engine.judging.outputs import write_results
from leanbatch.engine.judging.plots import write_plots
from leanbatch.engine.judging.tables import format_brief, format_results

__all__ = ["Report", "closing", "publish", "terminal_width"]


class Report(dict):  # type: ignore[type-arg]
    """The results of a study: the same object (keys and values) as its results.json, plus
    :attr:`answer` (the short answer), :attr:`text` (the full tables) and :meth:`save` (results.json,
    the plots, report.html)."""

    @property
    def answer(self) -> str:
        """The answer in a few lines per method, as wide as the terminal (what the command prints last)."""
        return format_brief(self, terminal_width())

    @property
    def text(self) -> str:
        """The full tables: the answer, one row per method, then the realisation, the summary, the envelope and the controls."""
        return format_results(self)

    def save(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """Write ``results.json``, the plots and ``report.html`` into ``folder``; the files written."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        return publish(dict(self), out / "results.json", out if plots else None)


def terminal_width() -> int:
    """The terminal's width in columns (``COLUMNS`` first; 80 when there is no terminal), at least 40."""
    return max(40, shutil.get_terminal_size().columns)


def publish(payload: dict[str, Any], results: Path, plots: Path | None) -> list[Path]:
    """Write ``results`` (results.json), draw the plots and write ``report.html`` into the folder
    ``plots`` (None: neither); every file atomically. The files written."""
    write_results(results, payload)
    if plots is None:
        return [results]
    images = write_plots(payload, plots)
    atomic_write_text(plots / "report.html", render(payload, images))
    return [results, *images, plots / "report.html"]


def closing(
    payload: dict[str, Any], written: list[Path], tables: bool = False, seconds: float | None = None
) -> str:
    """What the command prints when a study is judged: the full tables (``tables``), the files
    ``written``, and last the answer, no line wider than the terminal."""
    width = terminal_width()
    html = next((p for p in written if p.suffix == ".html"), None)
    folder = written[0].parent
    took = "" if seconds is None else f" ({seconds:.0f} s in all)"
    where = " and ".join(str(p) for p in (html, written[0]) if p) + ("" if tables else " (or --tables)")
    parts = [format_results(payload)] if tables else []
    wrote = textwrap.fill(f"wrote {len(written)} file(s) to {folder}{took}", width, subsequent_indent="  ",
                          break_on_hyphens=False, break_long_words=False)  # fmt: skip
    parts += [wrote, format_brief(payload, width, where)]
    return "\n" + "\n\n".join(parts)
