"""The sealed blob format: AES-256-GCM a segment at a time, and opening it again.

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

import io
import secrets
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from game.errors import VGameError

MAGIC = b"vgame-blob-v2\0"
MAGIC_V1 = b"vgame-blob-v1\0"
NONCE_SIZE = 12
PREFIX_SIZE = 7  # the nonce's random part; 4 bytes of segment index and 1 of "last" follow
TAG_SIZE = 16
SEGMENT = 1 << 20  # plaintext bytes a segment (the last may hold fewer)
KEY_SIZE = 32

#: ``(bytes done, bytes in all)`` as a transcript is published or fetched (a node's progress bar)
ByteProgress = Callable[[int, int], None]


class StoreError(VGameError, ValueError):
    """A blob is missing, modified, or cannot be opened with the given key."""


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
