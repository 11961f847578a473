"""Build hook: the package index's long description is README.md with its relative links made absolute.

Everything else is in pyproject.toml. On GitHub and in a checkout the README's links are relative
(they follow the branch you read); on a package index a relative link points nowhere, so each
``](path)`` that is not already a URL or an anchor becomes ``](<Source>/blob/main/path)``
(``/tree/main/`` for a folder), with ``Source`` the project URL in pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def absolute_links(text: str, source: str, root: Path = ROOT) -> str:
    """``text`` with every relative Markdown link target made a URL under ``source``."""

    def repl(m: re.Match[str]) -> str:
        target = m.group(1)
        path = target.split("#", 1)[0]
        kind = "tree" if path.endswith("/") or (root / path).is_dir() else "blob"
        return f"]({source.rstrip('/')}/{kind}/main/{target})"

    return LINK.sub(repl, text)


def long_description() -> str:
    source = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"]
    return absolute_links((ROOT / "README.md").read_text(encoding="utf-8"), source)


if __name__ == "__main__":
    setup(long_description=long_description(), long_description_content_type="text/markdown")
