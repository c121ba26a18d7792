"""The sparse rounding log: per step only the values within their op's band, as (position, direction).

A packed chunk (:mod:`roundlog`) spends 1.6 bits on every rounded value, yet only values within the
calibrated divergence band of a rounding midpoint can round differently on another machine
(:mod:`banding`). A sparse chunk lists just those. Layout::

    magic        b"vgame-slog-v1\\0"
    step         uint64 LE
    spec hash    32 bytes
    records      uint32 LE count
    codec        uint8: 0 stored, 1 zlib, 2 lzma (xz container); the writer picks the smallest by default
    payload size uint32 LE: bytes of the payload before compression
    payload      compressed with the codec:
                   names    uvarint count, then per name uvarint length + UTF-8
                   records  per record: uvarint op-index gap (index - previous - 1; the first from -1),
                            uvarint name id, uvarint value count, uvarint entry count
                   gaps     per entry, record by record: uvarint position gap (position - previous - 1,
                            restarting at -1 in each record)

An entry is a value the trainer rounded to the *odd* neighbour although it lies within its band of
a rounding midpoint; every other in-band value went to the even neighbour, so no direction bits are
needed (:mod:`banding` has the rule and why it replays on other hardware).

uvarints are LEB128 (7 bits per byte, high bit = more), shortest form only. Positions are the flat
row-major indices in the op's output, so they are strictly increasing and below the value count;
a chunk that breaks any of this, or has bytes left over, is a :class:`ChunkFormatError`. The chunk
hash and the log root are the same as for packed chunks.
"""

from __future__ import annotations

import lzma
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from game.errors import RoundingLogError
from game.training import native
from game.training.roundlog import (
    HASH_SIZE,
    ChunkFormatError,
    LogRecord,
    RecordCursor,
    check_chunk_identity,
)

MAGIC = b"vgame-slog-v1\0"
_HEADER = struct.Struct("<Q32sIBI")  # step, spec hash, record count, codec, payload size
CODECS = {"stored": 0, "zlib": 1, "lzma": 2}
#: "auto" keeps the smallest of zlib, lzma and no compression (zlib wins on small chunks, where the
#: xz container's fixed cost shows; lzma on large ones), trying lzma only up to ``LZMA_AUTO_MAX``
#: bytes of payload. lzma compresses at some 4 MB/s here: on gpt-shakespeare's 18 KB payload it took
#: 4.4 ms a step (7% of a plain float64 step) for a chunk 11% smaller than zlib's, and on a
#: GPT-2-sized step's 16 MB about 10 s for 8%. The codec byte says which one a chunk used.
LZMA_AUTO_MAX = 1 << 12
#: zlib runs at level 9 up to ``ZLIB_BEST_MAX`` bytes of payload and at level 6 above: on a GPT-2-sized
#: step's 16.5 MB the two differ by 0.5% in size and by 2.7 s in time (4.3 s against 1.6 s). Any
#: level decodes the same way, so this is the writer's choice alone.
ZLIB_LEVEL_LARGE = 6
ZLIB_BEST_MAX = 1 << 20
DEFAULT_CODEC = "auto"
#: A payload larger than this is refused before decompressing (a chunk is one step's log).
MAX_PAYLOAD = 1 << 30


@dataclass(frozen=True)
class SparseRecord:
    """One rounded inexact tensor: its record, and the positions of its in-band values rounded odd."""

    record: LogRecord
    positions: torch.Tensor  # int64, strictly increasing, < record.count


def _where(step: int | None) -> str:
    return f"step {step}" if step is not None else "step ?"


class SparseStepLog:
    """The sparse rounding log of one step, in op order (the trainer appends; the auditor reads)."""

    format = "sparse"

    def __init__(self, step: int | None = None, *, codec: str = DEFAULT_CODEC) -> None:
        if codec not in CODECS and codec != "auto":
            raise RoundingLogError(f"unknown sparse-log codec {codec!r} (valid: auto, {', '.join(CODECS)})")
        self.step = step
        self.codec = codec
        self._entries: list[SparseRecord] = []

    @classmethod
    def empty(cls, step: int | None = None) -> SparseStepLog:
        return cls(step)

    def append(self, op_index: int, op_name: str, count: int, positions: torch.Tensor) -> None:
        """Record an op's listed values (positions ascending, flat row-major)."""
        if not 0 <= op_index < 2**32:
            raise RoundingLogError(f"{_where(self.step)}: op index {op_index} does not fit uint32")
        if positions.dim() != 1:
            raise RoundingLogError(f"{_where(self.step)}: op #{op_index}: positions must be a flat tensor")
        self._entries.append(SparseRecord(LogRecord(op_index, op_name, int(count)), positions.detach()))

    def pop(self) -> SparseRecord:
        """Remove and return the last record (for a tool that rewrites the op just logged)."""
        return self._entries.pop()

    # ---- inspection ----------------------------------------------------------------------------

    @property
    def records(self) -> tuple[LogRecord, ...]:
        return tuple(e.record for e in self._entries)

    def entries(self) -> list[SparseRecord]:
        """Every record with its entries (for tools that rewrite a log: tests, tampering)."""
        return list(self._entries)

    @property
    def total_values(self) -> int:
        """Rounded values the step logged for (all of them, in or out of band)."""
        return sum(e.record.count for e in self._entries)

    @property
    def total_entries(self) -> int:
        """Values that have an entry (in band and rounded to the odd neighbour)."""
        return sum(int(e.positions.numel()) for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # ---- bytes ---------------------------------------------------------------------------------

    def encode(self, step: int, spec_hash: bytes) -> bytes:
        """The chunk bytes (see the module docstring)."""
        if not 0 <= step < 2**64:
            raise RoundingLogError(f"step {step} does not fit uint64")
        if len(spec_hash) != HASH_SIZE:
            raise RoundingLogError(f"step {step}: spec hash must be {HASH_SIZE} bytes, got {len(spec_hash)}")
        names: dict[str, int] = {}
        head: list[int] = []
        sizes: list[int] = []
        prev_op = -1
        for e in self._entries:
            r = e.record
            name_id = names.setdefault(r.op_name, len(names))
            size = int(e.positions.numel())
            head += [r.op_index - prev_op - 1, name_id, r.count, size]
            sizes.append(size)
            prev_op = r.op_index
        name_bytes = [n.encode("utf-8") for n in names]
        parts = [uvarint_encode(np.array([len(name_bytes)]))]
        for nb in name_bytes:
            parts += [uvarint_encode(np.array([len(nb)])), nb]
        parts.append(uvarint_encode(np.array(head, dtype=np.int64)))
        parts.append(uvarint_encode(_gaps([e.positions for e in self._entries], sizes)))
        payload = b"".join(parts)
        if len(payload) > MAX_PAYLOAD:
            raise RoundingLogError(f"step {step}: sparse log payload of {len(payload)} bytes is too large")
        codec = self.codec
        if codec == "auto":
            tried = ("zlib", "lzma", "stored") if len(payload) <= LZMA_AUTO_MAX else ("zlib", "stored")
            body = min(((_compress(payload, c), c) for c in tried), key=lambda b: len(b[0]))
        else:
            body = (_compress(payload, codec), codec)
        header = _HEADER.pack(step, bytes(spec_hash), len(self._entries), CODECS[body[1]], len(payload))
        return MAGIC + header + body[0]

    @classmethod
    def decode(cls, data: bytes, *, step: int | None, spec_hash: bytes) -> SparseStepLog:
        """Parse and check a sparse chunk; errors name the step (see :meth:`StepLog.decode`)."""
        where = _where(step)
        if bytes(data[: len(MAGIC)]) != MAGIC:
            raise ChunkFormatError(f"{where}: not a sparse rounding-log chunk (bad magic or version)")
        if len(data) < len(MAGIC) + _HEADER.size:
            raise ChunkFormatError(f"{where}: chunk truncated in its header ({len(data)} bytes)")
        own_step, own_spec, n_records, codec_id, size = _HEADER.unpack_from(data, len(MAGIC))
        where = check_chunk_identity(own_step, own_spec, step, spec_hash)
        codec = {v: k for k, v in CODECS.items()}.get(codec_id)
        if codec is None:
            raise ChunkFormatError(f"{where}: unknown codec {codec_id}")
        if size > MAX_PAYLOAD:
            raise ChunkFormatError(f"{where}: payload size {size} is above the limit {MAX_PAYLOAD}")
        payload = _decompress(bytes(data[len(MAGIC) + _HEADER.size :]), codec, size, where)
        out = cls(own_step, codec=codec)
        try:
            out._entries = _parse_payload(payload, n_records, where)
        except _Malformed as exc:
            raise ChunkFormatError(f"{where}: corrupt sparse log: {exc}") from None
        return out

    def cursor(self) -> SparseCursor:
        """A reader that hands the records out in order to the replaying computation."""
        return RecordCursor(self.step, [e.record for e in self._entries], self._entries)


class _Malformed(Exception):
    pass


def _parse_payload(payload: bytes, n_records: int, where: str) -> list[SparseRecord]:
    buf = np.frombuffer(payload, dtype=np.uint8)
    (n_names,), pos = uvarint_decode(buf, 0, 1)
    if n_names > n_records:
        raise _Malformed(f"{n_names} names for {n_records} records")
    names: list[str] = []
    for _ in range(n_names):
        (length,), pos = uvarint_decode(buf, pos, 1)
        if pos + length > buf.size:
            raise _Malformed("truncated in the name table")
        try:
            names.append(bytes(buf[pos : pos + length]).decode("utf-8"))
        except UnicodeDecodeError:
            raise _Malformed("an op name is not UTF-8") from None
        pos += length
    head, pos = uvarint_decode(buf, pos, 4 * n_records)
    head = head.reshape(n_records, 4)
    total = int(head[:, 3].sum()) if n_records else 0
    gaps, pos = uvarint_decode(buf, pos, total)
    if pos != buf.size:
        raise _Malformed(f"{buf.size - pos} bytes left after the last entry")
    # Every record's positions from one running sum over the whole chunk: position = (running sum of
    # gap + 1, from the record's start) - 1. One cumsum instead of one per record; each record's
    # positions are a view of the one array.
    sizes = head[:, 3]
    if gaps.size and float(gaps.sum(dtype=np.float64)) + gaps.size >= 2.0**62:  # the sum could wrap
        raise _Malformed("position gaps add up past any tensor's size")
    ends = np.cumsum(sizes)
    running = np.cumsum(gaps + 1)
    before = np.concatenate(([0], running))[ends - sizes]  # the running sum before each record
    flat = torch.from_numpy(running - np.repeat(before, sizes) - 1)
    last = flat.numpy()[ends[sizes > 0] - 1]
    too_far = np.flatnonzero(last >= head[sizes > 0, 2])
    records: list[SparseRecord] = []
    op_index, start = -1, 0
    for gap_op, name_id, count, n in head.tolist():
        op_index += gap_op + 1
        if op_index >= 2**32 or name_id >= len(names):
            raise _Malformed(f"record {len(records)}: op index or name id out of range")
        records.append(SparseRecord(LogRecord(op_index, names[name_id], count), flat[start : start + n]))
        start += n
    if too_far.size:
        r = int(np.flatnonzero(sizes > 0)[too_far[0]])
        gap_ops = head[: r + 1, 0]
        op = int(gap_ops.sum()) + r  # op index of record r (gaps are index - previous - 1, from -1)
        raise _Malformed(
            f"record {r} (op #{op}): position {int(last[too_far[0]])} >= {int(head[r, 2])} values"
        )
    return records


#: The sparse log's cursor hands out each record's entries.
SparseCursor = RecordCursor[SparseRecord]


# --------------------------------------------------------------------------------------------------
# Codecs and varints
# --------------------------------------------------------------------------------------------------


def _gaps(positions: list[torch.Tensor], sizes: list[int]) -> np.ndarray:
    """Every record's positions as gaps (``p[i] - p[i-1] - 1``, the first from -1), in one array:
    one concatenation and one subtraction for the whole chunk instead of one per record."""
    if not any(sizes):
        return np.zeros(0, np.int64)
    on_cpu = [p if p.is_cpu and p.dtype == torch.int64 else p.to("cpu", torch.int64) for p in positions]
    flat = torch.cat(on_cpu).numpy()
    prev = np.empty_like(flat)
    prev[0] = -1
    prev[1:] = flat[:-1]
    starts = np.cumsum([0, *sizes[:-1]])
    prev[starts[np.asarray(sizes) > 0]] = -1  # each record's first position counts from -1
    return flat - prev - 1


def _lzma_filters(size: int) -> list[dict[str, int]]:
    """LZMA2 at preset 6 with a dictionary no larger than the payload needs (at least 64 KiB): the
    preset's 8 MiB dictionary costs milliseconds to set up per chunk and gains nothing on small ones."""
    dict_size = min(max(1 << 16, 1 << max(size - 1, 1).bit_length()), 1 << 23)
    return [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": dict_size}]


def _compress(payload: bytes, codec: str) -> bytes:
    if codec == "zlib":
        return zlib.compress(payload, 9 if len(payload) <= ZLIB_BEST_MAX else ZLIB_LEVEL_LARGE)
    if codec == "lzma":
        filters = _lzma_filters(len(payload))
        return lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE, filters=filters)
    return payload


def _decompress(body: bytes, codec: str, size: int, where: str) -> bytes:
    """Decompress at most ``size + 1`` bytes (no decompression bomb) and insist on exactly ``size``."""
    try:
        if codec == "stored":
            out, rest = body, b""
        elif codec == "zlib":
            z = zlib.decompressobj()
            out = z.decompress(body, size + 1)
            if not z.eof:
                raise ChunkFormatError(f"{where}: sparse payload truncated or larger than its stated size")
            rest = z.unused_data
        else:
            dz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            out = dz.decompress(body, size + 1)
            if not dz.eof:
                raise ChunkFormatError(f"{where}: sparse payload truncated or larger than its stated size")
            rest = dz.unused_data
    except (zlib.error, lzma.LZMAError) as exc:
        raise ChunkFormatError(f"{where}: corrupt compressed payload: {exc}") from None
    if rest:
        raise ChunkFormatError(f"{where}: {len(rest)} trailing bytes after the compressed payload")
    if len(out) != size:
        raise ChunkFormatError(f"{where}: payload is {len(out)} bytes, the header says {size}")
    return out


def uvarint_encode(values: np.ndarray) -> bytes:
    """LEB128 of non-negative integers (< 2**63): the C kernel when it is there, else vectorised numpy."""
    v = np.asarray(values, dtype=np.int64)
    if v.size == 0:
        return b""
    fast = native.uvarint_encode(v)
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
    fast = native.uvarint_decode(buf, start, count)
    if fast is not None:
        return fast
    view = buf[start:]
    ends = np.flatnonzero((view & 0x80) == 0)
    if ends.size < count:
        raise _Malformed(f"truncated: {count} varints expected, {ends.size} found")
    ends = ends[:count]
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if int(lengths.max()) > 9:
        raise _Malformed("a varint is longer than 9 bytes")
    if np.any((lengths > 1) & (view[ends] == 0)):
        raise _Malformed("a varint is not in its shortest form")
    out = np.zeros(count, dtype=np.int64)
    for k in range(int(lengths.max())):
        live = lengths > k
        out[live] |= (view[starts[live] + k].astype(np.int64) & 0x7F) << (7 * k)
    return out, start + int(ends[-1]) + 1


__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "LZMA_AUTO_MAX",
    "MAGIC",
    "SparseCursor",
    "SparseRecord",
    "SparseStepLog",
    "uvarint_decode",
    "uvarint_encode",
]
