"""What both chunk formats share: compression codecs, LEB128 varints and the op-name table.

A sparse chunk compresses its whole payload; a packed chunk compresses only its record table (its
trits are already at 1.59 bits each). Both name the codec in a byte of the chunk, so the writer's
policy below can change without a format change. Errors here are :class:`Malformed`; the chunk
decoders reword them as ``ChunkFormatError`` naming the step.
"""

from __future__ import annotations

import lzma
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from game.errors import RoundingLogError
from game.training.log.inflate import Refused, inflate
from game.training.native import bindings

CODECS = {"stored": 0, "zlib": 1, "lzma": 2}
#: "auto" keeps the smallest of zlib, lzma and no compression (zlib wins on small payloads, where
#: the xz container's fixed cost shows; lzma on large ones), trying lzma only up to
#: ``LZMA_AUTO_MAX`` bytes of payload. lzma compresses at some 4 MB/s here: on gpt-shakespeare's
#: 18 KB sparse payload it took 4.4 ms a step (7% of a plain float64 step) for a chunk 11% smaller
#: than zlib's, and on a GPT-2-sized step's 16 MB about 10 s for 8%.
LZMA_AUTO_MAX = 1 << 12
#: zlib runs at level 9 up to ``ZLIB_BEST_MAX`` bytes of payload and at level 1 above. On a
#: GPT-2-sized step's 16.5 MB payload (2 CPU cores): level 1 10.44 MB in 0.94 s, level 6 10.02 MB in
#: 3.18 s, level 9 0.5% smaller than 6 and slower still. On a GPU the writer's thread must keep up
#: with a step of a few hundred milliseconds, so the larger chunks are the better trade (issue 46).
#: Any level decodes the same way, so this is the writer's choice alone.
ZLIB_LEVEL_LARGE = 1
ZLIB_BEST_MAX = 1 << 20
#: Above ``ZLIB_BEST_MAX`` the payload is deflated in blocks of ``ZLIB_BLOCK`` bytes, each on its
#: own (no window shared across a boundary) and flushed to a byte boundary, so the blocks can be
#: compressed on as many threads as there are cores. The blocks joined, with zlib's header and the
#: whole payload's Adler-32, are one ordinary zlib stream: any inflate decodes it, so this too is the
#: writer's choice alone. Why: at the GPT-2-small shape a step's 7-16 MB payload took one core
#: 100-285 ms at level 1, about a GPU step's time, so one thread could set a GPU trainer's pace
#: (issue 46); the blocks' restarted Huffman tables made those chunks 0.002-0.17% smaller, not larger.
ZLIB_BLOCK = 1 << 19
DEFAULT_CODEC = "auto"
#: A payload larger than this is refused before decompressing (a chunk is one step's log).
MAX_PAYLOAD = 1 << 30


class Malformed(Exception):
    """Bad bytes inside a chunk's payload (the decoder adds the step and raises ChunkFormatError)."""


def check_codec(codec: str) -> str:
    """``codec`` if it is one a writer can use ("auto" or a name in :data:`CODECS`)."""
    if codec not in CODECS and codec != "auto":
        raise RoundingLogError(f"unknown chunk codec {codec!r} (valid: auto, {', '.join(CODECS)})")
    return codec


def codec_name(codec_id: int) -> str:
    """The codec a chunk's codec byte names."""
    for name, value in CODECS.items():
        if value == codec_id:
            return name
    raise Malformed(f"unknown codec {codec_id}")


def lzma_dict_size(size: int) -> int:
    """LZMA2's dictionary for a payload of ``size`` bytes: no larger than the payload needs (at least
    64 KiB), where preset 6's 8 MiB costs milliseconds to set up per chunk and gains nothing on small
    ones."""
    return min(max(1 << 16, 1 << max(size - 1, 1).bit_length()), 1 << 23)


def zlib_level(size: int) -> int:
    """zlib's level for a payload of ``size`` bytes (see :data:`ZLIB_BEST_MAX`)."""
    return 9 if size <= ZLIB_BEST_MAX else ZLIB_LEVEL_LARGE


def zlib_block(size: int) -> int:
    """The block a payload of ``size`` bytes is deflated in (:data:`ZLIB_BLOCK`), or 0: in one piece."""
    return 0 if size <= ZLIB_BEST_MAX else ZLIB_BLOCK


def compress_threads() -> int:
    """How many threads deflate a large payload's blocks: the cores this process may run on, less one
    for the trainer's own thread (at least one). It changes the time, never the bytes."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def zlib_blocks(payload: bytes, level: int, block: int, threads: int = 1) -> bytes:
    """``payload`` as one zlib stream of blocks of ``block`` bytes deflated apart (see
    :data:`ZLIB_BLOCK`); the same bytes on any number of ``threads``. ``writer.c`` makes the same."""
    starts = range(0, max(len(payload), 1), block)
    last = starts[-1]

    def deflated(start: int) -> bytes:
        z = zlib.compressobj(level, zlib.DEFLATED, -15)
        body = z.compress(payload[start : start + block])
        return body + z.flush(zlib.Z_FINISH if start == last else zlib.Z_SYNC_FLUSH)

    if threads > 1 and len(starts) > 1:  # zlib lets the GIL go while it deflates
        with ThreadPoolExecutor(min(threads, len(starts)), thread_name_prefix="vgame-deflate") as pool:
            parts = list(pool.map(deflated, starts))
    else:
        parts = [deflated(s) for s in starts]
    return zlib_header(level) + b"".join(parts) + zlib.adler32(payload).to_bytes(4, "big")


def zlib_header(level: int) -> bytes:
    """The two bytes zlib's own deflate starts a stream with at ``level`` (RFC 1950: a 32 KiB window,
    the level's class in FLEVEL, a check that makes the pair a multiple of 31)."""
    cmf = 0x78
    flevel = 0 if level < 2 else 1 if level < 6 else 2 if level == 6 else 3
    flg = flevel << 6
    flg += 31 - (cmf * 256 + flg) % 31
    return bytes((cmf, flg))


def tried_codecs(codec: str, size: int) -> tuple[str, ...]:
    """The codecs ``codec`` tries on a payload of ``size`` bytes, in order; the smallest result wins,
    a tie the first."""
    if codec == "auto":
        return ("zlib", "lzma", "stored") if size <= LZMA_AUTO_MAX else ("zlib", "stored")
    return (check_codec(codec),)


def check_payload_size(size: int) -> None:
    """Refuse a payload larger than :data:`MAX_PAYLOAD` (a chunk is one step's log)."""
    if size > MAX_PAYLOAD:
        raise RoundingLogError(f"a chunk payload of {size} bytes is above the limit {MAX_PAYLOAD}")


def compress(payload: bytes, codec: str) -> tuple[bytes, str]:
    """``payload`` compressed with ``codec``; "auto" keeps whichever gives the fewest bytes (lzma
    tried only up to :data:`LZMA_AUTO_MAX`). Returns the bytes and the codec used."""
    check_payload_size(len(payload))
    tried = tried_codecs(codec, len(payload))
    return min(((compress_with(payload, c), c) for c in tried), key=lambda b: len(b[0]))


def compress_with(payload: bytes, codec: str, *, threads: int | None = None) -> bytes:
    """``payload`` compressed with one codec (a name in :data:`CODECS`), at the writer's settings;
    a large payload's zlib blocks on ``threads`` threads (:func:`compress_threads` by default)."""
    if codec == "zlib":
        level, block = zlib_level(len(payload)), zlib_block(len(payload))
        if block:
            return zlib_blocks(payload, level, block, compress_threads() if threads is None else threads)
        return zlib.compress(payload, level)
    if codec == "lzma":
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": lzma_dict_size(len(payload))}]
        return lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE, filters=filters)
    return payload


class Compressible(NamedTuple):
    """A chunk that is a head, with a codec byte in it, then a payload compressed: what the
    transcript writer's C call can finish on its own (:mod:`game.training.transcript.stepwriter`), or
    :meth:`finish` in Python, to the same bytes."""

    head: bytes  # the chunk's bytes before the compressed payload; its codec byte is rewritten
    codec_at: int  # where the codec byte is in ``head``
    payload: bytes
    codec: str  # "auto" or a name in CODECS

    def finish(self) -> bytes:
        """The chunk's bytes."""
        body, used = compress(self.payload, self.codec)
        head = bytearray(self.head)
        head[self.codec_at] = CODECS[used]
        return bytes(head) + body


def decompress(body: bytes, codec: str, size: int) -> bytes:
    """Decompress at most ``size + 1`` bytes (no decompression bomb) and insist on exactly ``size``."""
    if size > MAX_PAYLOAD:
        raise Malformed(f"payload size {size} is above the limit {MAX_PAYLOAD}")
    try:
        if codec == "stored":
            out, rest = body, b""
        elif codec == "zlib":  # in one C call without the GIL where it can (log/inflate.py)
            got = inflate(body, size + 1)
            if isinstance(got, Refused):
                raise Malformed(_refusal(got))
            out, rest = got, b""
        else:
            dz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            out = dz.decompress(body, size + 1)
            if not dz.eof:
                raise Malformed(_refusal(Refused("unfinished")))
            rest = dz.unused_data
    except lzma.LZMAError as exc:  # zlib's refusals come back as Refused (log/inflate.py)
        raise Malformed(f"corrupt compressed payload: {exc}") from None
    if rest:
        raise Malformed(_refusal(Refused("trailing", len(rest))))
    if len(out) != size:
        raise Malformed(f"payload is {len(out)} bytes, the header says {size}")
    return out


def _refusal(refused: Refused) -> str:
    """Why a compressed payload is refused, in words (either codec, either way it was inflated)."""
    if refused.why == "unfinished":
        return "payload truncated or larger than its stated size"
    if refused.why == "trailing":
        return f"{refused.count} trailing bytes after the compressed payload"
    return f"corrupt compressed payload: {refused.message}"


# --------------------------------------------------------------------------------------------------
# Varints and the name table
# --------------------------------------------------------------------------------------------------


def uvarint_encode(values: np.ndarray) -> bytes:
    """LEB128 of non-negative integers (< 2**63): the C kernel when it is there, else vectorised numpy."""
    v = np.asarray(values, dtype=np.int64)
    if v.size == 0:
        return b""
    fast = bindings.uvarint_encode(v)
    if fast is not None:
        return fast
    if int(v.min()) < 0:
        raise RoundingLogError("uvarints encode non-negative integers only")
    u = v.astype(np.uint64)
    lengths = np.ones(u.size, dtype=np.int64)
    rest = u >> np.uint64(7)
    while rest.any():
        lengths += rest > 0
        rest >>= np.uint64(7)
    offsets = np.cumsum(lengths) - lengths
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    for k in range(int(lengths.max())):
        live = lengths > k
        byte = (u[live] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (lengths[live] > k + 1).astype(np.uint64) << np.uint64(7)
        out[offsets[live] + k] = (byte | more).astype(np.uint8)
    return out.tobytes()


def uvarint_decode(buf: np.ndarray, start: int, count: int) -> tuple[np.ndarray, int]:
    """``count`` LEB128 integers from ``buf[start:]``; returns them (int64) and the position after."""
    if count == 0:
        return np.zeros(0, dtype=np.int64), start
    fast = bindings.uvarint_decode(buf, start, count)
    if fast is not None:
        return fast
    view = buf[start:]
    ends = np.flatnonzero((view & 0x80) == 0)
    if ends.size < count:
        raise Malformed(f"truncated: {count} varints expected, {ends.size} found")
    ends = ends[:count]
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if int(lengths.max()) > 9:
        raise Malformed("a varint is longer than 9 bytes")
    if np.any((lengths > 1) & (view[ends] == 0)):
        raise Malformed("a varint is not in its shortest form")
    out = np.zeros(count, dtype=np.int64)
    for k in range(int(lengths.max())):
        live = lengths > k
        out[live] |= (view[starts[live] + k].astype(np.int64) & 0x7F) << (7 * k)
    return out, start + int(ends[-1]) + 1


def _uvarint_of(value: int) -> bytes:
    """One small LEB128 integer (the name table's counts and lengths): a numpy array and a kernel
    call for each cost more than the whole table's bytes."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uvarint_at(data: memoryview, pos: int) -> tuple[int, int]:
    """One LEB128 integer at ``data[pos:]`` and the position after it, under the rules of
    :func:`uvarint_decode` (at most 9 bytes, shortest form)."""
    value = shift = 0
    for k in range(9):
        if pos + k >= len(data):
            raise Malformed("truncated in the name table")
        byte = data[pos + k]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and k > 0:
                raise Malformed("a varint is not in its shortest form")
            return value, pos + k + 1
        shift += 7
    raise Malformed("a varint is longer than 9 bytes")


def encode_names(names: list[str]) -> bytes:
    """The op-name table: uvarint count, then per name uvarint length + UTF-8."""
    parts = [_uvarint_of(len(names))]
    for name in names:
        raw = name.encode("utf-8")
        parts += [_uvarint_of(len(raw)), raw]
    return b"".join(parts)


def decode_names(buf: np.ndarray, pos: int, most: int) -> tuple[list[str], int]:
    """The name table at ``buf[pos:]`` (at most ``most`` names) and the position after it."""
    data = buf.data[pos:]  # a memoryview: no copy; indexing gives ints
    start, pos = pos, 0
    count, pos = _uvarint_at(data, pos)
    if count > most:
        raise Malformed(f"{count} names for {most} records")
    names: list[str] = []
    for _ in range(count):
        length, pos = _uvarint_at(data, pos)
        if pos + length > len(data):
            raise Malformed("truncated in the name table")
        try:
            names.append(bytes(data[pos : pos + length]).decode("utf-8"))
        except UnicodeDecodeError:
            raise Malformed("an op name is not UTF-8") from None
        pos += length
    return names, start + pos


__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "LZMA_AUTO_MAX",
    "MAX_PAYLOAD",
    "ZLIB_BLOCK",
    "Malformed",
    "check_codec",
    "codec_name",
    "compress",
    "decode_names",
    "decompress",
    "encode_names",
    "uvarint_decode",
    "uvarint_encode",
]
