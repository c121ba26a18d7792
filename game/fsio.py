"""Crash-safe file writes shared by the transcript, the rounding log, the store and the agents.

Why one module: "no lost data when a process dies" is the same three moves everywhere (write a
hidden temporary file, fsync it, rename it over the target, fsync the directory), and a subtle
difference between copies (temporary names that a resume does not clean up, a directory not
synced) is exactly the bug this prevents.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def temp_name(path: Path) -> Path:
    """The temporary name used while ``path`` is written: hidden, so directory packers skip it."""
    return path.with_name(temp_file_name(path.name))


def temp_file_name(name: str) -> str:
    """:func:`temp_name` of a file called ``name``, as a name."""
    return f".{name}.tmp"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_fsync(path: Path, data: bytes) -> None:
    """Append ``data`` and make it durable before returning."""
    with open(path, "ab") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def truncate_fsync(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes durably (drops a half-written tail after a crash)."""
    with open(path, "r+b") as fh:
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())
