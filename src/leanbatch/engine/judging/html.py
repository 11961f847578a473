"""``report.html``: the whole study in one self-contained page (tables and plots inline) to forward to a colleague.

The page holds the command, the answer (one line per method), the summary, the envelope and the
controls tables, and every plot as an inline PNG (``data:`` URI): no other file, no network.

Example:
    >>> page = render("the answer\\n\\n| a | b |\\n|---|--:|\\n| x | 1 |", [], "leanbatch bench --quick")
    >>> "<table>" in page and "<td>x</td>" in page and "leanbatch bench --quick" in page
    True
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from leanbatch.engine.judging.files import atomic_write_text

__all__ = ["render", "write_html"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}"
    "td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:right}td:first-child,th:first-child{text-align:left}"
    "th{background:#f3f3f3}p.note{font-size:.85rem;color:#555}img{max-width:100%;margin:.5rem 0}"
    "code{background:#f3f3f3;padding:.1rem .3rem}"
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _blocks(text: str) -> list[str]:
    """Each paragraph of the terminal report as HTML: Markdown tables as tables, the rest as notes."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        rows = [ln for ln in lines if ln.lstrip().startswith("|")]
        notes = [ln for ln in lines if not ln.lstrip().startswith("|")]
        out += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
        if rows:
            head, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
            table = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"
            table += "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body
            )
            out.append(f"<table>{table}</table>")
    return out


def render(text: str, plots: list[Path], command: str | list[str] | None) -> str:
    """The page: the terminal report ``text`` (its tables as HTML tables) and the ``plots`` inline."""
    commands = command if isinstance(command, list) else [command or "leanbatch"]
    parts = ["<h1>leanbatch: did skipping the work pay?</h1>"]
    parts += [f"<p><code>{html.escape(str(c))}</code></p>" for c in commands]
    parts += _blocks(text)
    for plot in plots:
        data = base64.b64encode(plot.read_bytes()).decode("ascii")
        parts.append(f'<img alt="{html.escape(plot.stem)}" src="data:image/png;base64,{data}">')
    body = "\n".join(parts)
    return f'<!doctype html>\n<html><head><meta charset="utf-8"><title>leanbatch report</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n'


def write_html(path: Path, text: str, plots: list[Path], command: str | list[str] | None) -> Path:
    """Write :func:`render`'s page to ``path`` (atomically); the path."""
    atomic_write_text(path, render(text, plots, command))
    return path
