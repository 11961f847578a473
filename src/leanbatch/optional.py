"""Optional dependencies: a package's names loaded on first use, and the extra a missing framework needs.

The adapters (:mod:`leanbatch.lightning`, :mod:`leanbatch.hf`) keep their plain-torch helpers
importable without the framework; their framework classes load on first use through the
``__getattr__`` :func:`lazy_getattr` builds, so a missing framework is one error that names the
extra to install, not a bare ``No module named 'lightning'``. ``leanbatch`` loads its names (and
torch with them) the same way.

Example:
    >>> demo = {"__name__": "demo"}
    >>> g = lazy_getattr(demo, {"dumps": "json", "X": "no_such_module"}, "lightning", ("no_such_module",))
    >>> g("dumps").__name__, "dumps" in demo
    ('dumps', True)
    >>> for name in ("X", "Y"):
    ...     try:
    ...         g(name)
    ...     except (ImportError, AttributeError) as e:
    ...         print(e)
    no_such_module is not installed: pip install "leanbatch[lightning]"
    module 'demo' has no attribute 'Y'
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    namespace: dict[str, Any], homes: Mapping[str, str], extra: str = "", requires: Sequence[str] = ()
) -> Callable[[str], Any]:
    """A package's ``__getattr__`` (``namespace``: its ``globals()``): each name of ``homes`` (name ->
    module) imported on first use and kept in the package. Where a top-level package of ``requires``
    is missing, the error names ``extra``; any other import error propagates unchanged (a broken
    install of the framework is not hidden behind the install hint). A package that requires nothing
    (``leanbatch``) loads its other public submodules on first use too (``leanbatch.selection``).
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in homes:
            try:
                value = getattr(importlib.import_module(homes[name]), name)
            except ModuleNotFoundError as e:
                if (missing := (e.name or "").split(".")[0]) not in requires:
                    raise
                raise ModuleNotFoundError(
                    f'{missing} is not installed: pip install "leanbatch[{extra}]"', name=e.name
                ) from e
        elif not requires and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    return __getattr__
