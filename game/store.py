"""Content-addressed, encrypted blob store for transcripts and client data.

Why: the trainer's transcript (checkpoints, rounding log) and the client's data must reach the
auditor and the judge through a store that may be shared or public, while only hashes go on-chain.
So every blob is sealed with AES-256-GCM under a key the client hands to trainer, auditor and judge,
and addressed by the SHA-256 of the *sealed* bytes: anyone can check integrity, only key holders
can read. A local directory is the default store; anything that maps hash -> bytes can replace it.

Sealed layout (v2): ``b"vgame-blob-v2\\0" || prefix (7 random bytes) || segment 0 || segment 1 ...``;
each segment is up to 1 MiB of plaintext sealed with AES-GCM under the nonce ``prefix || index (4
bytes, big-endian) || last (1 byte)`` (the STREAM construction of Hoang, Reyhanitabar, Rogaway and
Vizar): a segment dropped, moved or cut off at the end fails its tag like any modified byte. Why in
segments: one AES-GCM call takes at most 2 GiB, and a paper-size transcript (checkpoints of 1.5 GB
at GPT-2 small) is larger; and a blob is sealed, hashed and opened a segment at a time, so memory
stays at a few MiB whatever its size. The associated data binds the blob to its purpose (e.g.
``b"transcript"``), so a blob cannot be replayed as another kind. v1 blobs (one AES-GCM call over
the whole plaintext, ``b"vgame-blob-v1\\0" || nonce || ciphertext+tag``) are still read.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from game.errors import VGameError
from game.fsio import atomic_write, fsync_dir

MAGIC = b"vgame-blob-v2\0"
MAGIC_V1 = b"vgame-blob-v1\0"
NONCE_SIZE = 12
PREFIX_SIZE = 7  # the nonce's random part; 4 bytes of segment index and 1 of "last" follow
TAG_SIZE = 16
SEGMENT = 1 << 20  # plaintext bytes a segment (the last may hold fewer)
KEY_SIZE = 32
_READ = 1 << 20  # bytes a read when hashing or copying a file

#: ``(bytes done, bytes in all)`` as a transcript is published or fetched (a node's progress bar)
ByteProgress = Callable[[int, int], None]


class StoreError(VGameError, ValueError):
    """A blob is missing, modified, or cannot be opened with the given key."""


class BlobNotFound(StoreError):
    """No blob of that id in the store (yet: a store synced between machines may lag the chain)."""


def new_key() -> bytes:
    """A fresh random 256-bit data key (the client makes one per task)."""
    return secrets.token_bytes(KEY_SIZE)


def key_fingerprint(key: bytes) -> str:
    """The SHA-256 of a data key, in hex: what a command prints in the key's stead (no command
    prints the key itself, which terminals' scrollback and logs keep), so that a person can tell
    whether two files hold the same task's key; it cannot be turned back into the key."""
    return hashlib.sha256(key).hexdigest()


def parse_key(text: str) -> bytes:
    """Parse a key given as 64 hex characters (optionally 0x-prefixed)."""
    t = text.strip().removeprefix("0x")
    try:
        key = bytes.fromhex(t)
    except ValueError:
        raise StoreError("a data key must be 64 hex characters (256 bits)") from None
    if len(key) != KEY_SIZE:
        raise StoreError(f"a data key must be {KEY_SIZE} bytes (64 hex characters), got {len(key)} bytes")
    return key


# ----------------------------------------------------------------------------------------------
# Sealing, a segment at a time
# ----------------------------------------------------------------------------------------------


def _read_full(src: BinaryIO, n: int) -> bytes:
    """``n`` bytes, or fewer only at the end of ``src`` (a read may return short)."""
    parts = []
    while n > 0:
        part = src.read(n)
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    if index >= 1 << 32:
        raise StoreError(f"a blob holds at most 2^32 segments of {SEGMENT} bytes")
    return prefix + index.to_bytes(4, "big") + (b"\x01" if last else b"\x00")


def _wrong(purpose: bytes) -> StoreError:
    return StoreError(
        f"cannot open {purpose.decode(errors='replace')} blob: wrong key or the blob was modified"
    )


def _open_segment(
    aead: AESGCM, prefix: bytes, index: int, last: bool, sealed: bytes, purpose: bytes
) -> bytes:
    """Segment ``index`` of a v2 blob, authenticated (its tag binds its place and whether it ends
    the blob); a :class:`StoreError` otherwise."""
    try:
        return aead.decrypt(_nonce(prefix, index, last), sealed, MAGIC + purpose)
    except InvalidTag:
        raise _wrong(purpose) from None


class _SealingWriter(io.RawIOBase):
    """Seals what is written to it into ``out`` (v2), a segment at a time; :meth:`finish` seals the
    last. A full segment is held back until a byte follows it: only then is it known not to be the
    last. Why a writer: an archive is sealed as it is written, never stored in the clear first."""

    def __init__(
        self,
        key: bytes,
        out: BinaryIO,
        purpose: bytes,
        progress: ByteProgress | None = None,
        expected: int = 0,
    ) -> None:
        self._aead, self._aad, self._out = AESGCM(key), MAGIC + purpose, out
        self._prefix = secrets.token_bytes(PREFIX_SIZE)
        out.write(MAGIC + self._prefix)
        self._held = bytearray()
        self._index = 0
        self._written = 0
        self._progress, self._expected = progress, expected

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written  # plaintext bytes so far (tarfile asks where it is)

    def write(self, data: Any) -> int:
        self._held += data
        n = len(memoryview(data).cast("B"))
        self._written += n
        while len(self._held) > SEGMENT:
            self._seal(bytes(self._held[:SEGMENT]), last=False)
            del self._held[:SEGMENT]
        return n

    def finish(self) -> None:
        self._seal(bytes(self._held), last=True)
        self._held.clear()
        if self._progress is not None:
            self._progress(self._written, self._written)

    def _seal(self, segment: bytes, *, last: bool) -> None:
        self._out.write(self._aead.encrypt(_nonce(self._prefix, self._index, last), segment, self._aad))
        self._index += 1
        if self._progress is not None and not last:
            sealed = self._index * SEGMENT
            self._progress(sealed, max(self._expected, sealed + 1))  # done only at finish


def seal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Encrypt and authenticate all of ``src`` for ``purpose`` under ``key`` into ``dst`` (v2)."""
    sealing = _SealingWriter(key, dst, purpose)
    shutil.copyfileobj(src, sealing, SEGMENT)
    sealing.finish()


def _plain_segments(key: bytes, src: BinaryIO, purpose: bytes) -> Iterator[bytes]:
    """The plaintext of the sealed blob read from ``src``, a segment at a time, each authenticated
    before it is given out (a v1 blob, whole); a wrong key, another purpose, any modified, missing or
    added byte is a :class:`StoreError`. The blob is read to its end once the last part is out."""
    head = _read_full(src, len(MAGIC))
    if head == MAGIC_V1:
        yield _unseal_v1(key, head + src.read(), purpose)
        return
    if head != MAGIC:
        raise StoreError("not a vgame blob (bad header or too short)")
    prefix = _read_full(src, PREFIX_SIZE)
    aead = AESGCM(key)
    sealed, index = _read_full(src, SEGMENT + TAG_SIZE), 0
    while True:
        if len(prefix) < PREFIX_SIZE or len(sealed) < TAG_SIZE:
            raise StoreError("not a vgame blob (bad header or too short)")
        following = _read_full(src, SEGMENT + TAG_SIZE) if len(sealed) == SEGMENT + TAG_SIZE else b""
        last = not following
        yield _open_segment(aead, prefix, index, last, sealed, purpose)
        if last:
            return
        sealed, index = following, index + 1


def unseal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Decrypt a sealed blob from ``src`` into ``dst``; a wrong key, another purpose, any modified,
    missing or added byte is a :class:`StoreError`. What reached ``dst`` before such an error is not
    to be used: it is authentic only once this returns."""
    for part in _plain_segments(key, src, purpose):
        dst.write(part)


class SealedFile(io.RawIOBase):
    """The plaintext of a v2 blob, readable and seekable, decrypting only the segments a read
    touches (the last one read is kept).

    Why: a judge re-runs one step and needs a few of a transcript's files, not its every checkpoint
    (each the model's whole state). Every byte read is authenticated by its segment's tag, bound to
    its position by the nonce; a segment cut off the end fails as the last segment's tag. What is
    never read is never checked, so the blob's id is not checked either: a reader must check what
    it reads against something it trusts (the judge: the chain's roots and leaves).
    """

    def __init__(self, key: bytes, src: BinaryIO, purpose: bytes) -> None:
        self._src, self._aead, self._purpose = src, AESGCM(key), purpose
        src.seek(0)
        head = _read_full(src, len(MAGIC) + PREFIX_SIZE)
        if head[: len(MAGIC)] != MAGIC or len(head) < len(MAGIC) + PREFIX_SIZE:
            raise StoreError("not a vgame blob (bad header or too short)")
        self._prefix = head[len(MAGIC) :]
        body = src.seek(0, io.SEEK_END) - len(head)
        self._segments = max(1, -(-body // (SEGMENT + TAG_SIZE)))
        last = body - (self._segments - 1) * (SEGMENT + TAG_SIZE) - TAG_SIZE
        if last < 0:
            raise StoreError("not a vgame blob (bad header or too short)")
        self._size = (self._segments - 1) * SEGMENT + last
        self._pos = 0
        self._cached: tuple[int, bytes] | None = None
        self.segments_read = 0  # segments decrypted so far (what a partial read saved is visible)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def _segment(self, index: int) -> bytes:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        self._src.seek(len(MAGIC) + PREFIX_SIZE + index * (SEGMENT + TAG_SIZE))
        sealed = _read_full(self._src, SEGMENT + TAG_SIZE)
        plain = _open_segment(
            self._aead, self._prefix, index, index == self._segments - 1, sealed, self._purpose
        )
        self.segments_read += 1
        self._cached = (index, plain)
        return plain

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._size:
            index, within = divmod(self._pos, SEGMENT)
            part = self._segment(index)[within : within + len(view) - done]
            view[done : done + len(part)] = part
            done += len(part)
            self._pos += len(part)
        return done


def _unseal_v1(key: bytes, blob: bytes, purpose: bytes) -> bytes:
    if len(blob) < len(MAGIC_V1) + NONCE_SIZE + TAG_SIZE:
        raise StoreError("not a vgame blob (bad header or too short)")
    nonce = blob[len(MAGIC_V1) : len(MAGIC_V1) + NONCE_SIZE]
    try:
        return AESGCM(key).decrypt(nonce, blob[len(MAGIC_V1) + NONCE_SIZE :], MAGIC_V1 + purpose)
    except InvalidTag:
        raise _wrong(purpose) from None


def seal(key: bytes, plaintext: bytes, purpose: bytes) -> bytes:
    """:func:`seal_stream` in memory."""
    out = io.BytesIO()
    seal_stream(key, io.BytesIO(plaintext), out, purpose)
    return out.getvalue()


def unseal(key: bytes, blob: bytes, purpose: bytes) -> bytes:
    """:func:`unseal_stream` in memory."""
    out = io.BytesIO()
    unseal_stream(key, io.BytesIO(blob), out, purpose)
    return out.getvalue()


def blob_id(blob: bytes) -> bytes:
    """Content address of a blob: SHA-256 of its (sealed) bytes."""
    return hashlib.sha256(blob).digest()


# ----------------------------------------------------------------------------------------------
# The store
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Directories (transcripts) as blobs
# ----------------------------------------------------------------------------------------------


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


def pack_directory(src: Path) -> bytes:
    """:func:`_pack_to` in memory."""
    buf = io.BytesIO()
    _pack_to(src, buf)
    return buf.getvalue()


def _file_only(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The extraction filter of a transcript: regular files inside ``dest`` only."""
    if not member.isfile():
        raise StoreError(f"transcript archive holds a non-file entry {member.name!r}")
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError as exc:
        raise StoreError(f"transcript archive entry {member.name!r} is refused: {exc}") from None


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
            self._members = {m.name: m for m in self._tar.getmembers()}
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
                tar.extractall(dest, filter=_file_only)
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
