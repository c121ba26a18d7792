"""Crash-safe file writes shared by the transcript, the rounding log, the store and the agents.

Why one module: "no lost data when a process dies" is the same three moves everywhere (write a
hidden temporary file, fsync it, rename it over the target, fsync the directory), and a subtle
difference between copies (temporary names that a resume does not clean up, a directory not
synced) is exactly the bug this prevents.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from game.errors import DirectoryInUse

if sys.platform != "win32":
    import fcntl


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


def atomic_write(path: Path, data: bytes | memoryview, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half.
    ``mode`` (less the umask) holds from the file's first byte: 0o600 keeps a secret its owner's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    tmp.unlink(missing_ok=True)  # a crash's leftover would keep its own mode
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as fh:
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


@contextlib.contextmanager
def exclusive_directory(directory: Path, busy: str) -> Iterator[Path]:
    """Hold ``directory`` (made if missing) for this process alone while the block runs, or raise
    :class:`DirectoryInUse` with ``busy`` at once if another process holds it.

    Why: two writers of one transcript (a second `vgame train` started on the same ``--out``, two
    nodes on one workdir) would cut and append each other's steps. The lock is an advisory
    ``flock`` on the directory itself: no lock file to publish with the transcript or to clean up,
    and the kernel lets go when the process dies, so a killed run never leaves a stale lock.
    (Where ``flock`` does not exist, Windows, nothing is held.)"""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if sys.platform == "win32":
        yield directory
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUse(busy) from None
        yield directory
    finally:
        os.close(fd)  # closing the descriptor lets the lock go
