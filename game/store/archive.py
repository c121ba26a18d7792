"""Directories (transcripts) as blobs: a deterministic tar sealed into the store, and back.

A transcript is published once as one blob and fetched in one pass (hashed, authenticated and
unpacked as it is read); :class:`SealedArchive` reads a few of its files without the rest.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from game.fsio import fsync_dir
from game.store.blobs import _READ, BlobStore, _corrupt, _HashingReader, _PartsReader
from game.store.sealing import (
    MAGIC_V1,
    SEGMENT,
    ByteProgress,
    SealedFile,
    StoreError,
    _plain_segments,
    _read_full,
    _SealingWriter,
    _unseal_v1,
)


def _pack_to(src: Path, out: BinaryIO) -> None:
    """A deterministic tar of a directory (sorted names, zeroed times and owners) into ``out``."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # a file's bytes in segment-sized writes, not 16 KiB ones (typeshed lacks the attribute)
        tar.copybufsize = SEGMENT  # type: ignore[attr-defined]
        for rel, p in _packed_files(src):
            info = tarfile.TarInfo(rel)
            info.mode = 0o644
            with open(p, "rb") as fh:
                info.size = os.fstat(fh.fileno()).st_size
                tar.addfile(info, fh)


def _check_name(name: str, seen: set[str]) -> None:
    """Refuse a member name the packer never writes (``_packed_files``: a relative, normalised,
    ``/``-separated path, no part hidden) or one met before. Why: a reader that unpacks to a
    filesystem (the auditor) and one that looks a member up by its name (the judge) must see the
    same bytes, and ``log/x``, ``./log/x`` and a second ``log/x`` are one file to the first and
    three to the second."""
    parts = name.split("/")
    if (
        not name
        or posixpath.normpath(name) != name
        or name.startswith("/")
        or any(not part or part.startswith(".") for part in parts)
    ):
        raise StoreError(f"transcript archive entry {name!r} is not a name its packer writes")
    if name in seen:
        raise StoreError(f"transcript archive holds {name!r} twice")
    seen.add(name)


def _file_only(seen: set[str]) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """The extraction filter of a transcript: regular files inside ``dest`` only, each under a name
    the packer writes, once (``seen``: the names so far)."""

    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        if not member.isfile():
            raise StoreError(f"transcript archive holds a non-file entry {member.name!r}")
        _check_name(member.name, seen)
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise StoreError(f"transcript archive entry {member.name!r} is refused: {exc}") from None

    return check


def _packed_files(src: Path) -> list[tuple[str, Path]]:
    """What a published directory holds, in the archive's order: every file but the hidden ones
    (temp files of an interrupted writer are not part of the transcript)."""
    files = []
    for p in sorted(q for q in Path(src).rglob("*") if q.is_file()):
        rel = p.relative_to(src).as_posix()
        if not (rel.startswith(".") or "/." in rel):
            files.append((rel, p))
    return files


def publish_directory(
    store: BlobStore,
    key: bytes,
    src: Path,
    purpose: bytes = b"transcript",
    *,
    progress: ByteProgress | None = None,
) -> bytes:
    """Seal a directory into the store; returns its blob id (what goes on-chain). The archive is
    sealed and hashed as it is written, into a temporary file that takes the blob's name once
    whole: one pass over the directory, and memory and disk do not grow beyond the blob.
    ``progress`` hears of every segment sealed, against the files' bytes in all."""
    expected = sum(p.stat().st_size for _, p in _packed_files(src))

    def write(out: BinaryIO) -> None:
        sealing = _SealingWriter(key, out, purpose, progress, expected)
        _pack_to(src, sealing)  # type: ignore[arg-type]
        sealing.finish()

    return store.put_streamed(write)


class SealedArchive:
    """Some files of a published directory, without decrypting or unpacking the rest.

    The blob's tar headers are read through a :class:`SealedFile`; a member's data is decrypted
    only when that member is extracted. v1 blobs (one AES-GCM call) are opened whole, in memory.
    """

    def __init__(self, store: BlobStore, key: bytes, bid: bytes, purpose: bytes = b"transcript") -> None:
        self._fh = store.open(bid, check=False)
        try:
            if _read_full(self._fh, len(MAGIC_V1)) == MAGIC_V1:
                self._fh.seek(0)
                self.sealed: SealedFile | None = None
                plain: BinaryIO = io.BytesIO(_unseal_v1(key, self._fh.read(), purpose))
            else:
                self.sealed = SealedFile(key, self._fh, purpose)
                plain = self.sealed  # type: ignore[assignment]  # no read-ahead: a read fills its ask
            self._tar = tarfile.open(fileobj=plain, mode="r:")  # noqa: SIM115 - closed by close()
            members = self._tar.getmembers()
            seen: set[str] = set()
            for m in members:
                _check_name(m.name, seen)
            self._members = {m.name: m for m in members}
        except tarfile.TarError as exc:
            self._fh.close()
            raise StoreError(f"blob {bid.hex()} is not a published directory: {exc}") from None
        except BaseException:
            self._fh.close()
            raise

    def __enter__(self) -> SealedArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._tar.close()
        self._fh.close()

    def names(self) -> list[str]:
        """The files the directory holds (paths relative to it, ``/``-separated)."""
        return sorted(self._members)

    def _member(self, name: str) -> tarfile.TarInfo:
        member = self._members.get(name)
        if member is None:
            raise StoreError(f"the published directory holds no file {name!r}")
        if not member.isfile():
            raise StoreError(f"transcript archive holds a non-file entry {name!r}")
        return member

    def read(self, name: str) -> bytes:
        """File ``name``'s bytes, in memory, decrypting only the segments it lies in."""
        src = self._tar.extractfile(self._member(name))
        assert src is not None  # a regular file always has a reader
        return src.read()

    def extract(self, name: str, dest: Path) -> Path:
        """Write file ``name`` under ``dest`` (whole and synced before it takes its name, so a
        crash leaves it absent, never cut short); its path."""
        member = self._member(name)
        target = (Path(dest) / name).resolve()
        if not target.is_relative_to(Path(dest).resolve()):
            raise StoreError(f"transcript archive entry {name!r} points outside the directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        src = self._tar.extractfile(member)
        assert src is not None  # a regular file always has a reader
        fd, tmp = tempfile.mkstemp(prefix=".extracting-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, _READ)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
        return target


def fetch_directory(
    store: BlobStore,
    key: bytes,
    bid: bytes,
    dest: Path,
    purpose: bytes = b"transcript",
    *,
    progress: ByteProgress | None = None,
) -> Path:
    """Fetch, verify, decrypt and unpack a published directory into ``dest``, in one pass over the
    blob: each segment is authenticated before the archive's reader sees a byte of it, and the
    sealed bytes are hashed as they are read and checked against ``bid`` at the end.

    Why one pass: a transcript at paper size is gigabytes (a checkpoint is the model's whole state),
    and checking the id first, then decrypting into a temporary archive, then unpacking it read the
    blob twice and wrote it twice. On any error, what was written into ``dest`` is not to be used:
    fetch into a directory of its own and give it its name only once this returns (the auditor
    does). A blob that does not hash to ``bid`` is reported as corrupt even where its first
    changed byte failed a segment's tag. ``progress`` hears of every read, against the blob's size."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with store.open(bid, check=False) as blob:
        sealed = _HashingReader(blob, progress, os.fstat(blob.fileno()).st_size)
        try:
            plain = _PartsReader(_plain_segments(key, sealed, purpose))  # type: ignore[arg-type]
            with tarfile.open(fileobj=plain, mode="r|", bufsize=SEGMENT) as tar:
                # a file's bytes in segment-sized reads: the stream's buffer is cut at each read
                tar.copybufsize = SEGMENT  # type: ignore[attr-defined]
                tar.extractall(dest, filter=_file_only(set()))
            while plain.read(SEGMENT):  # the archive's padding, and the last segment's tag
                pass
        except (StoreError, tarfile.TarError) as exc:
            if sealed.drain() != bid:
                raise _corrupt(store, bid) from None
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"blob {bid.hex()} is not a published directory: {exc}") from None
        if sealed.drain() != bid:
            raise _corrupt(store, bid)
    return dest
