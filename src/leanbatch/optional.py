"""Optional dependencies: importing a framework adapter's module, or saying which extra it needs.

The adapters (:mod:`leanbatch.lightning`, :mod:`leanbatch.hf`) keep their plain-torch helpers
importable without the framework; their framework classes load on first use through
:func:`import_with_extra`, so a missing framework is one error that names the extra to install,
not a bare ``No module named 'lightning'``.

Example:
    >>> import_with_extra("json", "lightning", ("lightning",)).__name__
    'json'
    >>> try:
    ...     import_with_extra("leanbatch_no_such_module", "lightning", ("leanbatch_no_such_module",))
    ... except ModuleNotFoundError as e:
    ...     print(e)
    leanbatch_no_such_module is not installed: pip install "leanbatch[lightning]"
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

__all__ = ["import_with_extra"]


def import_with_extra(module: str, extra: str, requires: Sequence[str]) -> ModuleType:
    """Import ``module``; if one of the top-level packages ``requires`` is missing, name the extra.

    Any other import error propagates unchanged (a broken install of the framework is not
    hidden behind the install hint).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in requires:
            raise
        raise ModuleNotFoundError(
            f'{missing} is not installed: pip install "leanbatch[{extra}]"', name=e.name
        ) from e
