"""The record of a study's finished runs in its ``--out`` folder (:class:`Journal`): what lets a study
killed at any point (``kill -9``, a lost node, a lost driver) start again and train only the rest.

``runs.jsonl`` holds one line of the study's identity (what the runs depend on: the task's identity,
its metric and goal, its settings, its data), then one line per finished run: the run's record and
its arm's settings, each line flushed and fsync-ed as the run finishes. Started again on the same
folder, a study keeps every recorded run of an arm and seed it still has (the same settings), and
trains only the others; a folder holding another study's runs is refused (or, with ``fresh``,
started afresh). A line cut short by a kill is dropped. The study removes the file when it ends
complete (:meth:`Journal.close`): what stays is results.json.

Example:
    >>> import tempfile
    >>> from leanbatch.engine.judging.records import RunRecord
    >>> folder = Path(tempfile.mkdtemp())
    >>> identity = {"task_id": {"function": "train"}, "metric": "metric"}
    >>> arms = {"baseline": {"label": "baseline", "settings": {}}}
    >>> journal = Journal.open(folder, identity, arms, [0, 1])
    >>> journal.append(RunRecord("baseline", "baseline", 0, 1.0, []))
    >>> again = Journal.open(folder, identity, arms, [0, 1])
    >>> [(r.method, r.seed) for r in again.kept], again.line(total=2)
    ([('baseline', 0)], 'leanbatch: resumed from runs.jsonl: kept 1 finished run (baseline seed 0), 1 to train')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.files import atomic_write_text
from leanbatch.engine.judging.outputs import _clean
from leanbatch.engine.judging.records import RunRecord

__all__ = ["JOURNAL", "Journal", "JournalError", "dumps"]

JOURNAL = "runs.jsonl"
_FORMAT = "leanbatch.runs/1"


class JournalError(ValueError):
    """An ``--out`` whose recorded runs are not this study's: one line naming what differs and the fix."""


class Journal:
    """The finished runs of one study, recorded in ``folder/runs.jsonl`` (:meth:`open`, :meth:`append`)."""

    def __init__(
        self, path: Path, kept: list[RunRecord], header: dict[str, Any], arms: Mapping[str, Mapping[str, Any]]
    ):
        self.path, self.kept, self._header, self._arms = path, kept, header, dict(arms)

    @classmethod
    def open(
        cls,
        folder: Path,
        identity: Mapping[str, Any],
        arms: Mapping[str, Mapping[str, Any]],
        seeds: Sequence[int],
        fresh: bool = False,
        write: bool = True,
    ) -> Journal:
        """The journal of ``folder``: the recorded runs of this study's ``arms`` (label to its entry in
        ``config.methods``) and ``seeds`` kept, the file rewritten with them (``fresh``: with none;
        ``write=False``: read only).
        :class:`JournalError` when the recorded study differs in ``identity`` or an arm's settings."""
        path = Path(folder) / JOURNAL
        header = {"format": _FORMAT, "study": _clean(dict(identity))}
        lines = [] if fresh else _read(path)
        kept: list[RunRecord] = []
        if lines:
            _check_same(path, lines[0].get("study"), header["study"])
            wanted, seen = {int(s) for s in seeds}, set()
            for line in lines[1:]:
                record, arm = line["run"], line.get("arm") or {}
                label, seed = record.get("method"), record.get("seed")
                if label not in arms or seed not in wanted or (label, seed) in seen:
                    continue  # an arm or seed this study no longer has; a run recorded twice
                if _settings(arm) != _settings(arms[label]):
                    raise JournalError(
                        f"{path} holds {label} seed {seed} with other settings ({_settings(arm)} against "
                        f"{_settings(arms[label])}): give --out a new folder, or pass --fresh to train it all again"
                    )
                seen.add((label, seed))
                kept.append(RunRecord.from_dict(record))
        journal = cls(path, kept, header, arms)
        if write:
            journal._rewrite([{"run": r.as_dict(), "arm": dict(arms[r.method])} for r in kept])
        return journal

    def _rewrite(self, runs: list[dict[str, Any]]) -> None:
        text = "".join(dumps(line) + "\n" for line in [self._header, *runs])
        atomic_write_text(self.path, text)

    def append(self, run: RunRecord) -> None:
        """Record a finished run (one line, flushed and fsync-ed before this returns)."""
        line = {"run": run.as_dict(), "arm": dict(self._arms.get(run.method, {}))}
        if not self.path.exists():  # closed by a second study on the same folder that ended first
            self._rewrite([line])
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def line(self, total: int) -> str:
        """The one line that says what was kept, of ``total`` runs (empty when nothing was)."""
        if not self.kept:
            return ""
        n = len(self.kept)
        shown = ", ".join(f"{r.method} seed {r.seed}" for r in self.kept[:4])
        more = f" and {n - 4} more" if n > 4 else ""
        return (
            f"leanbatch: resumed from {self.path.name}: kept {n} finished run{'s' if n > 1 else ''} "
            f"({shown}{more}), {total - n} to train"
        )

    def close(self) -> None:
        """The study ended complete: its record is results.json now, the journal goes."""
        self.path.unlink(missing_ok=True)


def dumps(value: Any) -> str:
    """``value`` as one line of JSON, as results.json writes it (a non-finite float as null).

    Example:
        >>> dumps({"a": (1, float("nan"))})
        '{"a": [1, null]}'
    """
    return json.dumps(_clean(value), allow_nan=False)


def _settings(arm: Mapping[str, Any]) -> dict[str, Any]:
    return {k: arm.get(k) for k in ("kind", "settings", "budget", "batch")}


def _read(path: Path) -> list[dict[str, Any]]:
    """The journal's lines (the header first); [] when there is none; a last line cut short is dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise JournalError(f"{path}: cannot read it ({e}): move it away, or pass --fresh") from None
    lines: list[dict[str, Any]] = []
    rows = text.split("\n")
    for i, row in enumerate(rows):
        if not row.strip():
            continue
        try:
            line = json.loads(row)
        except json.JSONDecodeError:
            if i == len(rows) - 1:  # the last line, cut short by a kill mid-write
                break
            raise JournalError(f"{path}: line {i + 1} is not JSON: move it away, or pass --fresh") from None
        lines.append(line)
    if lines and lines[0].get("format") != _FORMAT:
        raise JournalError(
            f"{path} is not a leanbatch record of finished runs: move it away, or pass --fresh"
        )
    if any(not isinstance(line.get("run"), dict) for line in lines[1:]):
        raise JournalError(f"{path}: a line holds no run: move it away, or pass --fresh")
    return lines


def _check_same(path: Path, recorded: Any, identity: dict[str, Any]) -> None:
    """Refuse runs recorded by another study: what differs, named."""
    recorded = recorded if isinstance(recorded, dict) else {}
    differ = sorted(k for k in recorded.keys() | identity.keys() if recorded.get(k) != identity.get(k))
    if differ:
        raise JournalError(
            f"{path} holds the finished runs of another study ({', '.join(differ)} differ): give --out a new "
            "folder, or pass --fresh to train it all again"
        )
