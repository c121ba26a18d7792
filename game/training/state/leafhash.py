"""The state hash (leaf format ``vgame-leaf-v2``): a hash a GPU can compute in parallel.

A leaf used to be ``sha256(canonical bytes)``: one sequential hash, which on a GPU meant copying
the whole state to the host every step and hashing it on one thread (1.1 s a step at the GPT-2
shape on an H100, most of the trainer's overhead there). Version 2 hashes the canonical bytes in
fixed chunks, each independently, so thousands of GPU threads (or several CPU threads) share the
work, and every party, CPU or GPU, gets the same 32 bytes:

* ``level_0`` = the canonical bytes (``B`` bytes);
* while a level is longer than :data:`CHUNK` bytes, the next level is the concatenation of
  ``sha256(chunk)`` over its consecutive :data:`CHUNK`-byte chunks (the last one may be shorter);
* leaf = ``sha256(LEAF_FORMAT || B as uint64 LE || last level)``.

The number of levels is fixed by ``B`` alone, so two states with equal leaves have equal bytes
unless SHA-256 collides at some level. A state of at most one chunk (4 KiB) hashes as
``sha256(LEAF_FORMAT || B || bytes)``. The on-chain tree is unchanged: it sees 32-byte leaves.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

#: Domain tag of the final hash; a new leaf definition gets a new tag (and spec format).
LEAF_FORMAT = b"vgame-leaf-v2\0"
#: Bytes per chunk at every level: a multiple of SHA-256's 64-byte block, small enough that a GPU
#: gets thousands of independent chunks from a few megabytes of state.
CHUNK = 4096
#: Bytes of one chunk's digest.
DIGEST = 32

Bytes = bytes | bytearray | memoryview | np.ndarray


def _view(data: Bytes) -> memoryview:
    """``data``'s bytes, uncopied (an array of any dtype as its raw bytes)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    return memoryview(data).cast("B")


def next_level(level: Bytes) -> bytes:
    """The digests of ``level``'s consecutive :data:`CHUNK`-byte chunks, concatenated."""
    mv = _view(level)
    sha = hashlib.sha256
    return b"".join([sha(mv[i : i + CHUNK]).digest() for i in range(0, len(mv), CHUNK)])


def finish(level: Bytes, total: int) -> bytes:
    """The leaf from a level of at most :data:`CHUNK` bytes reached from ``total`` canonical bytes
    (a GPU reduces the state to such a level; the host hashes the rest)."""
    mv = _view(level)
    if len(mv) > CHUNK:
        raise ValueError(f"a final level is at most {CHUNK} bytes, got {len(mv)}")
    if len(mv) != final_level_size(total):
        raise ValueError(
            f"{total} canonical bytes end in a level of {final_level_size(total)} bytes, got {len(mv)}"
        )
    return hashlib.sha256(LEAF_FORMAT + struct.pack("<Q", total) + mv).digest()


def reduce_to_final(level: Bytes) -> bytes:
    """Hash ``level`` chunk by chunk until at most :data:`CHUNK` bytes remain."""
    mv = _view(level)
    out: bytes = mv.tobytes() if len(mv) <= CHUNK else next_level(mv)
    while len(out) > CHUNK:
        out = next_level(out)
    return out


def final_level_size(total: int) -> int:
    """Bytes in the last level of ``total`` canonical bytes (the levels' sizes depend on it alone)."""
    size = total
    while size > CHUNK:
        size = DIGEST * -(-size // CHUNK)
    return size


def level_sizes(total: int) -> list[int]:
    """Bytes of every level from the canonical bytes to the last one (``[total, ..., final]``)."""
    sizes = [total]
    while sizes[-1] > CHUNK:
        sizes.append(DIGEST * -(-sizes[-1] // CHUNK))
    return sizes


def leaf_of(data: Bytes) -> bytes:
    """The leaf of these canonical bytes."""
    mv = _view(data)
    return finish(reduce_to_final(mv), len(mv))


class LeafStream:
    """The leaf of canonical bytes that arrive in pieces of any size (a state too large to hold
    twice): the first level's chunks are hashed as they fill; only their digests are kept (and the
    first chunk's bytes, which are the last level when the whole input is one chunk or less)."""

    def __init__(self) -> None:
        self._chunk = hashlib.sha256()
        self._filled = 0  # bytes in the open chunk
        self._digests = bytearray()
        self._head = bytearray()  # the first CHUNK bytes at most
        self._total = 0

    def update(self, piece: Bytes) -> LeafStream:
        mv = _view(piece)
        if len(self._head) < CHUNK:
            self._head += mv[: CHUNK - len(self._head)]
        self._total += len(mv)
        at = 0
        while at < len(mv):
            take = min(CHUNK - self._filled, len(mv) - at)
            self._chunk.update(mv[at : at + take])
            self._filled += take
            at += take
            if self._filled == CHUNK:
                self._digests += self._chunk.digest()
                self._chunk = hashlib.sha256()
                self._filled = 0
        return self

    def digest(self) -> bytes:
        """The leaf of everything given so far."""
        if self._total <= CHUNK:
            return finish(bytes(self._head), self._total)
        digests = bytes(self._digests)
        if self._filled:
            digests += self._chunk.copy().digest()
        return finish(reduce_to_final(digests), self._total)


__all__ = [
    "CHUNK",
    "DIGEST",
    "LEAF_FORMAT",
    "LeafStream",
    "final_level_size",
    "finish",
    "leaf_of",
    "level_sizes",
    "next_level",
    "reduce_to_final",
]
