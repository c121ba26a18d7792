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
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

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


class StoreError(VGameError, ValueError):
    """A blob is missing, modified, or cannot be opened with the given key."""


class BlobNotFound(StoreError):
    """No blob of that id in the store (yet: a store synced between machines may lag the chain)."""


def new_key() -> bytes:
    """A fresh random 256-bit data key (the client makes one per task)."""
    return secrets.token_bytes(KEY_SIZE)


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


def seal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Encrypt and authenticate all of ``src`` for ``purpose`` under ``key`` into ``dst`` (v2)."""
    aead, aad = AESGCM(key), MAGIC + purpose
    prefix = secrets.token_bytes(PREFIX_SIZE)
    dst.write(MAGIC + prefix)
    segment, index = _read_full(src, SEGMENT), 0
    while True:
        following = _read_full(src, SEGMENT) if len(segment) == SEGMENT else b""
        last = not following
        dst.write(aead.encrypt(_nonce(prefix, index, last), segment, aad))
        if last:
            return
        segment, index = following, index + 1


def unseal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Decrypt a sealed blob from ``src`` into ``dst``; a wrong key, another purpose, any modified,
    missing or added byte is a :class:`StoreError`. What reached ``dst`` before such an error is not
    to be used: it is authentic only once this returns."""
    head = _read_full(src, len(MAGIC))
    if head == MAGIC_V1:
        dst.write(_unseal_v1(key, head + src.read(), purpose))
        return
    if head != MAGIC:
        raise StoreError("not a vgame blob (bad header or too short)")
    prefix = _read_full(src, PREFIX_SIZE)
    aead, aad = AESGCM(key), MAGIC + purpose
    sealed, index = _read_full(src, SEGMENT + TAG_SIZE), 0
    while True:
        if len(prefix) < PREFIX_SIZE or len(sealed) < TAG_SIZE:
            raise StoreError("not a vgame blob (bad header or too short)")
        following = _read_full(src, SEGMENT + TAG_SIZE) if len(sealed) == SEGMENT + TAG_SIZE else b""
        last = not following
        try:
            dst.write(aead.decrypt(_nonce(prefix, index, last), sealed, aad))
        except InvalidTag:
            raise _wrong(purpose) from None
        if last:
            return
        sealed, index = following, index + 1


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

    def open(self, bid: bytes) -> BinaryIO:
        """The blob, open for reading, once its bytes are checked against its id."""
        p = self.path(bid)
        try:
            fh = open(p, "rb")  # noqa: SIM115 - handed to the caller
        except FileNotFoundError:
            raise BlobNotFound(f"blob {bid.hex()} not found in store {self.root}") from None
        h = hashlib.sha256()
        for block in iter(lambda: fh.read(_READ), b""):
            h.update(block)
        if h.digest() != bid:
            fh.close()
            raise StoreError(f"blob {bid.hex()} in store {self.root} is corrupt (hash mismatch)")
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
        for p in sorted(q for q in Path(src).rglob("*") if q.is_file()):
            rel = p.relative_to(src).as_posix()
            if rel.startswith(".") or "/." in rel:
                continue  # temp files of an interrupted writer are not part of the transcript
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


def _unpack_from(archive: BinaryIO, dest: Path) -> None:
    """Extract a tar made by :func:`pack_directory`, refusing links and paths outside ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive, mode="r") as tar:
        for m in tar.getmembers():
            if not m.isfile():
                raise StoreError(f"transcript archive holds a non-file entry {m.name!r}")
        tar.extractall(dest, filter="data")


def unpack_directory(data: bytes, dest: Path) -> None:
    """:func:`_unpack_from` from bytes in memory."""
    _unpack_from(io.BytesIO(data), dest)


def publish_directory(store: BlobStore, key: bytes, src: Path, purpose: bytes = b"transcript") -> bytes:
    """Seal a directory into the store; returns its blob id (what goes on-chain). The archive
    passes through a temporary file beside the store, so memory does not grow with its size."""
    store.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=store.root) as archive:
        _pack_to(src, archive)
        archive.seek(0)
        return store.put_streamed(lambda out: seal_stream(key, archive, out, purpose))


def fetch_directory(
    store: BlobStore, key: bytes, bid: bytes, dest: Path, purpose: bytes = b"transcript"
) -> Path:
    """Fetch, verify, decrypt and unpack a published directory into ``dest`` (unpacked only once
    the whole blob has proved authentic)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with store.open(bid) as blob, tempfile.TemporaryFile(dir=dest.parent) as archive:
        unseal_stream(key, blob, archive, purpose)
        archive.seek(0)
        _unpack_from(archive, dest)
    return dest
