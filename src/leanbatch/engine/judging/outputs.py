"""What the ``leanbatch`` command writes, where, and what it may write over: ``leanbatch bench --out
DIR`` replaces a ``results.json`` there only with a complete result (:func:`unfinished_path`), never
one that is not a leanbatch result (:func:`check_bench_out`); ``leanbatch report FILE`` writes beside
its input (:func:`report_folder`) and replaces only an earlier report's output
(:func:`check_report_folder`). Every file is written atomically (:mod:`leanbatch.engine.judging.files`).

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> unfinished_path(out).name
    'results.json'
    >>> write_results(out / "results.json", {"schema": SCHEMA_PREFIX + "2", "x": float("nan")})
    >>> unfinished_path(out).name, read_results(out)["x"] is None
    ('results.partial.json', True)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.files import atomic_write_text, check_target

__all__ = [
    "RESULTS",
    "PARTIAL",
    "REPORT_KEY",
    "SCHEMA_PREFIX",
    "write_results",
    "read_results",
    "results_file",
    "unfinished_path",
    "check_bench_out",
    "report_folder",
    "check_report_folder",
]

RESULTS = "results.json"
PARTIAL = "results.partial.json"
REPORT_KEY = "recomputed_from"  # set in the results.json that ``leanbatch report`` writes
SCHEMA_PREFIX = "leanbatch.bench/"


def write_results(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON, atomically: a Ctrl-C, a ``kill -9`` or a second writer leaves a whole file."""
    atomic_write_text(path, json.dumps(_clean(payload), indent=1, allow_nan=False))


def _clean(o: Any) -> Any:
    """Non-finite floats become None (JSON has no NaN); tuples become lists."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def results_file(path: Path) -> Path:
    """The results file that ``path`` names: ``path/results.json`` for a folder, else ``path`` itself."""
    return path / RESULTS if path.is_dir() else path


def read_results(path: Path) -> dict[str, Any]:
    """The payload of a results.json, given the file or the folder that holds it.

    Raises ``ValueError`` with a one-line reason when it is missing or not a bench results file.
    """
    file = results_file(path)
    try:
        check_target(file)
        payload = json.loads(file.read_text())
    except FileNotFoundError:
        raise ValueError(f"{file}: no such file (give a results.json or the folder that holds it)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read as JSON ({e})") from None
    except RecursionError:  # json nests deeper than Python's stack
        raise ValueError(f"{file}: nested too deeply to be a results.json") from None
    if not isinstance(payload, dict) or not str(payload.get("schema", "")).startswith(SCHEMA_PREFIX):
        raise ValueError(f"{file}: not a leanbatch bench results.json (no leanbatch.bench schema)")
    return payload


def _peek(file: Path) -> dict[str, Any] | None:
    """The payload of ``file`` when it is a leanbatch results file, else None."""
    try:
        return read_results(file)
    except ValueError:
        return None


def unfinished_path(out: Path) -> Path:
    """Where ``leanbatch bench`` saves results that are not complete yet (after a seed, on Ctrl-C).

    ``results.json`` while ``out`` holds none, else ``results.partial.json``: a result that was
    there before is only replaced by a complete one. Decide it once, before training starts.
    """
    return out / (PARTIAL if (out / RESULTS).exists() else RESULTS)


def check_bench_out(out: Path) -> None:
    """Raise ``ValueError`` when ``out/results.json`` exists and is not a leanbatch result to replace."""
    target = out / RESULTS
    if not target.exists():
        return
    try:
        check_target(target)
    except OSError as e:
        raise ValueError(str(e)) from None
    if _peek(target) is None:
        raise ValueError(
            f"{target} exists and is not a leanbatch bench result, so it is not written over: "
            "give --out a new folder (or move the file)"
        )


def report_folder(source: Path) -> Path:
    """Where ``leanbatch report`` writes by default: ``<stem>.report/`` beside the results file.

    Example:
        >>> report_folder(Path("runs/other.json")).as_posix()
        'runs/other.report'
    """
    return source.parent / f"{source.stem}.report"


def check_report_folder(folder: Path, source: Path, plot_names: Iterable[str]) -> None:
    """Raise ``ValueError`` unless writing results.json and the plots into ``folder`` replaces
    nothing but the output of an earlier ``leanbatch report`` (and never ``source`` itself).
    """
    target = folder / RESULTS
    fix = "give --out a new folder, or leave --out out to write beside the input"
    if target.exists():
        if source.exists() and target.resolve() == source.resolve():
            raise ValueError(f"{target} is the input: the report would write over it; {fix}")
        earlier = _peek(target)
        if earlier is None or REPORT_KEY not in earlier:
            raise ValueError(f"{target} exists and was not written by leanbatch report, so it is kept; {fix}")
        return  # an earlier report's folder: its results.json and plots are replaced together
    for name in plot_names:
        if (folder / name).exists():
            raise ValueError(
                f"{folder / name} exists and was not written by leanbatch report, so it is kept; {fix}"
            )
