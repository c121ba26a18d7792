"""The directory store: blobs named by the SHA-256 of their sealed bytes, written atomically.

Anyone can check a blob's integrity against its id; only key holders can read it. A local
directory is the default store; anything that maps hash -> bytes can replace it.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from game.fsio import atomic_write, fsync_dir
from game.store.sealing import ByteProgress, StoreError

_READ = 1 << 20  # bytes a read when hashing or copying a file


class BlobNotFound(StoreError):
    """No blob of that id in the store (yet: a store synced between machines may lag the chain)."""


def blob_id(blob: bytes) -> bytes:
    """Content address of a blob: SHA-256 of its (sealed) bytes."""
    return hashlib.sha256(blob).digest()


class _HashingWriter(io.RawIOBase):
    """Writes through to ``out`` and hashes what passes (the blob's id as it is written)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.hash = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.hash.update(data)
        self.out.write(data)
        return len(data)


class _HashingReader(io.RawIOBase):
    """Reads from ``src`` and hashes what passes (a blob's id checked as it is read)."""

    def __init__(self, src: BinaryIO, progress: ByteProgress | None = None, size: int = 0) -> None:
        self.src = src
        self.hash = hashlib.sha256()
        self._progress, self._size, self._read = progress, size, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.hash.update(data)
        if self._progress is not None and data:
            self._read += len(data)
            self._progress(self._read, max(self._size, self._read))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> bytes:
        """Read the rest, hashing it; the hash of everything read."""
        while self.read(_READ):
            pass
        return self.hash.digest()


class _PartsReader(io.RawIOBase):
    """A readable stream over an iterator of byte strings (the plaintext, segment by segment)."""

    def __init__(self, parts: Iterator[bytes]) -> None:
        self._parts = parts
        self._part, self._at = b"", 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while self._at >= len(self._part):
            part = next(self._parts, None)
            if part is None:
                return b""
            self._part, self._at = part, 0
        end = len(self._part) if n < 0 else self._at + n
        out = self._part[self._at : end]
        self._at += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _corrupt(store: BlobStore, bid: bytes) -> StoreError:
    return StoreError(f"blob {bid.hex()} in store {store.root} is corrupt (hash mismatch)")


class BlobStore:
    """A directory of blobs named by the hex SHA-256 of their bytes; writes are atomic."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, bid: bytes) -> Path:
        h = bid.hex()
        return self.root / h[:2] / h

    def put(self, blob: bytes) -> bytes:
        bid = blob_id(blob)
        dest = self.path(bid)
        if dest.exists():
            return bid
        atomic_write(dest, blob)
        return bid

    def put_streamed(self, write: Callable[[BinaryIO], None]) -> bytes:
        """Store the blob that ``write(fh)`` writes, a piece at a time; returns its id."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".incoming-", suffix=".tmp", dir=self.root)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                hashing = _HashingWriter(fh)
                write(hashing)  # type: ignore[arg-type]
                fh.flush()
                os.fsync(fh.fileno())
            bid = hashing.hash.digest()
            dest = self.path(bid)
            if dest.exists():
                tmp.unlink()
                return bid
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            fsync_dir(dest.parent)
            return bid
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def open(self, bid: bytes, *, check: bool = True) -> BinaryIO:
        """The blob, open for reading, once its bytes are checked against its id (``check=False``:
        not read through first, for a reader that authenticates what it reads, :class:`SealedFile`)."""
        p = self.path(bid)
        try:
            fh = open(p, "rb")  # noqa: SIM115 - handed to the caller
        except FileNotFoundError:
            raise BlobNotFound(f"blob {bid.hex()} not found in store {self.root}") from None
        if not check:
            return fh
        h = hashlib.sha256()
        for block in iter(lambda: fh.read(_READ), b""):
            h.update(block)
        if h.digest() != bid:
            fh.close()
            raise _corrupt(self, bid)
        fh.seek(0)
        return fh

    def get(self, bid: bytes) -> bytes:
        with self.open(bid) as fh:
            return fh.read()

    def check(self, bid: bytes) -> None:
        """Raise :class:`StoreError` unless the blob is there, whole (read, not kept in memory)."""
        self.open(bid).close()
