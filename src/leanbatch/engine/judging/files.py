"""Atomic file writing for everything the ``leanbatch`` command writes (results, plots, micro figures).

A file is written to a temporary file with a unique name in the same folder, flushed and
``fsync``-ed, then renamed over the target with ``os.replace``: a reader (or a second process
writing the same target) sees the old file or the new one, never a half-written one, and a
Ctrl-C or ``kill -9`` in the middle leaves the old file as it was. Only regular files are
replaced: a target that is a folder, a device or a FIFO (``/dev/null``) is refused.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> atomic_write_text(folder / "a.json", '{"ok": true}')
    >>> (folder / "a.json").read_text(), sorted(p.name for p in folder.iterdir())
    ('{"ok": true}', ['a.json'])
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_open", "atomic_write_text", "check_target", "check_writable_folder"]


def check_target(path: Path) -> None:
    """Raise ``OSError`` unless ``path`` is absent or a regular file (so replacing it is safe).

    Example:
        >>> try:
        ...     check_target(Path("/dev/null"))
        ... except OSError as e:
        ...     print(e)
        /dev/null exists and is not a regular file (a folder, device or FIFO): give another file name
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise OSError(
            f"{path} exists and is not a regular file (a folder, device or FIFO): give another file name"
        )


def check_writable_folder(folder: Path) -> None:
    """Raise ``OSError`` with the reason unless a file can be created in ``folder`` (tried for real).

    Example:
        >>> try:
        ...     check_writable_folder(Path("/no/such/folder"))
        ... except OSError as e:
        ...     print(e)
        cannot write in /no/such/folder: No such file or directory
    """
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".leanbatch-probe-", suffix=".tmp")
    except OSError as e:
        raise OSError(f"cannot write in {folder}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(name)


def _mode_for_new_file() -> int:
    """The permission bits an ordinary ``open(path, "w")`` would give: 0o666 less the umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the ``with`` block ends without an exception.

    The data goes to a uniquely named temporary file next to ``path`` (two processes writing
    the same target never share one), is flushed and fsync-ed, then renamed over ``path``. On an
    exception (KeyboardInterrupt included) the temporary file is removed and ``path`` is untouched.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.bin"
        >>> with atomic_open(target) as fh:
        ...     _ = fh.write(b"data")
        >>> target.read_bytes()
        b'data'
    """
    path = Path(path)
    check_target(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else _mode_for_new_file())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # fsync the folder: the rename itself survives a crash
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_open`."""
    with atomic_open(path) as fh:
        fh.write(text.encode("utf-8"))
