"""A study's report: :class:`Report` (what ``bench()`` returns, results.json's object) and :func:`publish`.

Example:
    >>> Report({"a": 1})["a"], issubclass(Report, dict)
    (1, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["Report", "publish"]


class Report(dict):  # type: ignore[type-arg]
    """The results of a study: the same object (keys and values) as its results.json, plus
    :attr:`text` (the terminal report) and :meth:`save` (results.json, the plots, report.html)."""

    @property
    def text(self) -> str:
        """The answer, one line per method, then the full tables."""
        from leanbatch.engine.judging.tables import format_results

        return format_results(self)

    def save(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """Write ``results.json``, the plots and ``report.html`` into ``folder``; the files written."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        return publish(dict(self), out / "results.json", out if plots else None, quiet=True)


def publish(payload: dict[str, Any], results: Path, plots: Path | None, quiet: bool = False) -> list[Path]:
    """Write ``results`` (results.json), print the report (unless ``quiet``), draw the plots and write
    ``report.html`` into the folder ``plots`` (None: neither); every file atomically. The files written."""
    from leanbatch.engine.judging.outputs import write_results
    from leanbatch.engine.judging.tables import format_results

    write_results(results, payload)
    text = format_results(payload)
    if not quiet:
        print()
        print(text)
    written = [results]
    if plots is not None:
        from leanbatch.engine.judging.html import write_html
        from leanbatch.engine.judging.plots import write_plots

        images = write_plots(payload, plots)
        written += images + [write_html(plots / "report.html", text, images, payload.get("command"))]
    return written
