"""The rounding log: trit packing, one chunk per step, chunk files, chunk hashes and the log root.

A chunk is the log of one training step (``docs/architecture.md``, section Rounding log)::

    magic        b"vgame-log-v2\\0"
    step         uint64 LE
    spec hash    32 bytes
    records      uint32 LE count
    codec        uint8: the record table's compression, 0 stored, 1 zlib, 2 lzma (the writer keeps
                 the smallest)
    table size   uint32 LE: bytes of the record table before compression
    table bytes  uint32 LE: bytes of the record table as stored
    table        names    uvarint count, then per name uvarint length + UTF-8
                 records  per record: uvarint op-index gap (index - previous - 1; the first from -1),
                          uvarint name id, uvarint count (number of trits)
    trits        every record's trits concatenated, in blocks of 116: four groups of 29 trits, a
                 group's value sum(t_i 3^i) < 3^29 < 2^46, the block the 184-bit little-endian
                 integer g0 + g1 2^46 + g2 2^92 + g3 2^138 in 23 bytes; then the last (count mod
                 116) trits 5 per byte (radix 3, first trit least significant), unused digits zero

That is 1.586 bits per trit (log2 3 = 1.585) against the paper's 1.6 at five per byte, and a record
costs some 3 bytes instead of 14 plus its name. Chunks of the first layout (``vgame-log-v1``: fixed
width records with the name in each, every trit 5 per byte) still decode; ``encode(version=1)``
writes one.

``chunk_hash = sha256(chunk bytes)``; the log root is the Merkle root over the chunk hashes of steps
``0..S``. Unlike the paper's code (ANCHORS.md) a length mismatch is an error, padding never decodes as
data, and a chunk names its step and task, so a reordered or foreign chunk is caught when decoded.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

import numpy as np
import torch

from game.errors import RoundingLogError
from game.fsio import atomic_write, fsync_dir, is_temp_name
from game.merkle import merkle_root
from game.training import native
from game.training.chunkcodec import (
    CODECS,
    DEFAULT_CODEC,
    Compressible,
    Malformed,
    check_codec,
    codec_name,
    compress,
    decode_names,
    decompress,
    encode_names,
    uvarint_decode,
    uvarint_encode,
)
from game.training.task.config import LOG_FORMATS

if TYPE_CHECKING:
    from game.training.sparselog import SparseStepLog

log = logging.getLogger(__name__)

_Item = TypeVar("_Item")

MAGIC = b"vgame-log-v2\0"
MAGIC_V1 = b"vgame-log-v1\0"
HASH_SIZE = 32
TRITS_PER_BYTE = 5  # the tail of a chunk, and every trit of a v1 chunk
MAX_BYTE = 3**TRITS_PER_BYTE - 1  # 242
GROUP_TRITS, GROUP_BITS = 29, 46  # 3**29 = 68,630,377,364,883 < 2**46
BLOCK_GROUPS = 4
BLOCK_TRITS = GROUP_TRITS * BLOCK_GROUPS  # 116
BLOCK_BYTES = GROUP_BITS * BLOCK_GROUPS // 8  # 23: four groups fill whole bytes
MAX_GROUP = 3**GROUP_TRITS - 1
_HEADER = struct.Struct("<Q32sIBII")  # step, spec hash, record count, codec, table size, stored size
_HEADER_V1 = struct.Struct("<Q32sI")  # step, spec hash, record count (after the magic)
_OP_INDEX = struct.Struct("<I")
_NAME_LEN = struct.Struct("<H")
_COUNT = struct.Struct("<Q")
_MIN_RECORD = _OP_INDEX.size + _NAME_LEN.size + _COUNT.size
_CHUNK_NAME = re.compile(r"^step-(\d{9})\.bin$")


class TritPackingError(RoundingLogError, ValueError):
    """Trits outside 0..2, or packed bytes of the wrong length, above 242 or with nonzero padding."""


class ChunkFormatError(RoundingLogError, ValueError):
    """A chunk is truncated, has trailing bytes, a bad magic or a malformed record."""


class ChunkMismatchError(RoundingLogError):
    """A well-formed chunk that belongs elsewhere: another step (reordered) or another task (foreign)."""


class LogSequenceError(RoundingLogError):
    """The replaying computation's ops do not match the log's records (name, count, too few, too many)."""


class MissingChunkError(RoundingLogError, FileNotFoundError):
    """No chunk file for a step."""


# ----------------------------------------------------------------------------------------------
# Trit packing
# ----------------------------------------------------------------------------------------------

# Row b holds the 5 radix-3 digits of byte b, least significant first.
_DIGITS = np.array([[(b // 3**i) % 3 for i in range(TRITS_PER_BYTE)] for b in range(256)], dtype=np.uint8)
_U64 = np.dtype("<u8")


def packed_size(count: int) -> int:
    """Bytes ``count`` trits take: 23 per whole block of 116, then ``ceil(rest / 5)``."""
    blocks, rest = divmod(count, BLOCK_TRITS)
    return blocks * BLOCK_BYTES + packed_size_v1(rest)


def packed_size_v1(count: int) -> int:
    """Bytes ``count`` trits take 5 per byte (the tail, and v1 chunks): ``ceil(count / 5)``."""
    return -(-count // TRITS_PER_BYTE)


def _flat_trits(trits: torch.Tensor) -> np.ndarray:
    flat = trits.detach().reshape(-1).to(device="cpu", dtype=torch.uint8).numpy()
    if flat.size and int(flat.max()) > 2:
        bad = int(np.argmax(flat > 2))
        raise TritPackingError(f"trit {bad} is {int(flat[bad])}; trits are 0 (down), 1 (ignore), 2 (up)")
    return flat


def pack_trits(trits: torch.Tensor) -> bytes:
    """Pack uint8 trits (any shape, row-major order): whole blocks of 116 in 23 bytes, the rest 5 per
    byte (see the module docstring). The C kernel packs the blocks when it is there, else numpy."""
    flat = _flat_trits(trits)
    blocks = flat.size // BLOCK_TRITS
    body = native.pack_trit_blocks(flat, blocks)
    if body is None:
        body = _pack_blocks(flat, blocks)
    return body + _pack5(flat[blocks * BLOCK_TRITS :])


def _pack_blocks(flat: np.ndarray, blocks: int) -> bytes:
    head = flat[: blocks * BLOCK_TRITS].reshape(blocks * BLOCK_GROUPS, GROUP_TRITS)
    # Horner from the most significant digit; a group stays below 3**29 < 2**46.
    acc = head[:, GROUP_TRITS - 1].astype(np.uint64)
    for i in range(GROUP_TRITS - 2, -1, -1):
        acc *= np.uint64(3)
        acc += head[:, i]
    g = acc.reshape(blocks, BLOCK_GROUPS)
    # The 184-bit block g0 + g1 2^46 + g2 2^92 + g3 2^138 as three 64-bit words (the last has 56 bits).
    words = np.empty((blocks, 3), dtype=_U64)
    words[:, 0] = g[:, 0] | (g[:, 1] << np.uint64(46))
    words[:, 1] = (g[:, 1] >> np.uint64(18)) | (g[:, 2] << np.uint64(28))
    words[:, 2] = (g[:, 2] >> np.uint64(36)) | (g[:, 3] << np.uint64(10))
    return words.view(np.uint8).reshape(blocks, 24)[:, :BLOCK_BYTES].tobytes()


def _pack5(flat: np.ndarray) -> bytes:
    """Trits 5 per byte: ``t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4``, the last byte zero-padded."""
    n = packed_size_v1(flat.size)
    padded = np.zeros(n * TRITS_PER_BYTE, dtype=np.uint8)
    padded[: flat.size] = flat
    digits = padded.reshape(n, TRITS_PER_BYTE)
    # Horner from the most significant digit; every partial sum stays <= 242, so uint8 is enough.
    acc = digits[:, 4].copy()
    for i in (3, 2, 1, 0):
        acc *= 3
        acc += digits[:, i]
    return acc.tobytes()


def pack_trits_v1(trits: torch.Tensor) -> bytes:
    """Pack trits 5 per byte, every one (the v1 chunk layout and the paper's)."""
    return _pack5(_flat_trits(trits))


def unpack_trits(data: bytes | memoryview, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_trits`: ``count`` uint8 trits from exactly ``packed_size(count)`` bytes."""
    if count < 0:
        raise TritPackingError(f"trit count must be >= 0, got {count}")
    if len(data) != packed_size(count):
        raise TritPackingError(f"{count} trits pack into {packed_size(count)} bytes, got {len(data)}")
    blocks = count // BLOCK_TRITS
    buf = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(count, dtype=np.uint8)
    if not native.unpack_trit_blocks(buf, blocks, out):
        out[: blocks * BLOCK_TRITS] = _unpack_blocks(buf, blocks)
    done, done_bytes = blocks * BLOCK_TRITS, blocks * BLOCK_BYTES
    out[done:] = _unpack5(data[done_bytes:], count - done, done_bytes, done)
    return torch.from_numpy(out)


def _unpack_blocks(buf: np.ndarray, blocks: int) -> np.ndarray:
    raw = np.zeros((blocks, 24), dtype=np.uint8)
    raw[:, :BLOCK_BYTES] = buf[: blocks * BLOCK_BYTES].reshape(blocks, BLOCK_BYTES)
    w = raw.view(_U64)
    g = np.empty((blocks, BLOCK_GROUPS), dtype=np.uint64)
    g[:, 0] = w[:, 0] & np.uint64((1 << 46) - 1)
    g[:, 1] = (w[:, 0] >> np.uint64(46)) | ((w[:, 1] & np.uint64((1 << 28) - 1)) << np.uint64(18))
    g[:, 2] = (w[:, 1] >> np.uint64(28)) | ((w[:, 2] & np.uint64((1 << 10) - 1)) << np.uint64(36))
    g[:, 3] = w[:, 2] >> np.uint64(10)
    groups = g.reshape(-1)
    if groups.size and int(groups.max()) > MAX_GROUP:
        bad = int(np.argmax(groups > MAX_GROUP))
        raise TritPackingError(f"group {bad} (block {bad // BLOCK_GROUPS}) is above 3^29 - 1: not 29 trits")
    # Five digits at a time: the remainder by 243 is a byte whose digits _DIGITS holds.
    digits = np.empty((groups.size, 30), dtype=np.uint8)
    for k in range(6):
        digits[:, 5 * k : 5 * k + 5] = _DIGITS[(groups % np.uint64(243)).astype(np.uint8)]
        groups //= np.uint64(243)
    return digits[:, :GROUP_TRITS].reshape(-1)


def _unpack5(data: bytes | memoryview, count: int, byte0: int = 0, trit0: int = 0) -> np.ndarray:
    """``count`` trits 5 per byte; errors count bytes from ``byte0`` and trits from ``trit0``."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size and int(raw.max()) > MAX_BYTE:
        bad = int(np.argmax(raw > MAX_BYTE))
        raise TritPackingError(
            f"byte {byte0 + bad} is {int(raw[bad])}, above {MAX_BYTE} (not 5 radix-3 digits)"
        )
    digits = _DIGITS[raw].reshape(-1)
    if digits[count:].any():
        raise TritPackingError(f"padding digits after trit {trit0 + count} are not zero")
    return digits[:count]


def unpack_trits_v1(data: bytes | memoryview, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_trits_v1`: ``count`` trits from exactly ``ceil(count / 5)`` bytes."""
    if count < 0:
        raise TritPackingError(f"trit count must be >= 0, got {count}")
    if len(data) != packed_size_v1(count):
        raise TritPackingError(f"{count} trits pack into {packed_size_v1(count)} bytes, got {len(data)}")
    return torch.from_numpy(_unpack5(data, count).copy())


# ----------------------------------------------------------------------------------------------
# One step's log
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One rounded inexact tensor: the op's index within the step, its ATen name, its value count."""

    op_index: int
    op_name: str
    count: int


def _where(step: int | None) -> str:
    return f"step {step}" if step is not None else "step ?"


def check_chunk_identity(own_step: int, own_spec: bytes, step: int | None, spec_hash: bytes) -> str:
    """Raise ChunkMismatchError when a chunk names another step (reordered) or task (foreign);
    returns the ``step N`` that error messages about the chunk start with."""
    if step is not None and own_step != step:
        raise ChunkMismatchError(f"step {step}: chunk is the log of step {own_step} (reordered chunk)")
    if own_spec != bytes(spec_hash):
        raise ChunkMismatchError(
            f"step {own_step}: chunk belongs to task {own_spec.hex()[:16]}..., not "
            f"{bytes(spec_hash).hex()[:16]}... (foreign chunk)"
        )
    return f"step {own_step}"


class StepLog:
    """The packed rounding log of one step (a trit for every rounded value), in op order.

    The trainer appends the trit tensors as the kernels return them (no copy, no packing, possibly on
    CUDA), so the hot path is a list append; :meth:`encode` moves them to the CPU and packs them once.
    """

    format = "packed"

    def __init__(self, step: int | None = None, *, codec: str = DEFAULT_CODEC) -> None:
        self.step = step
        self.codec = check_codec(codec)  # of the record table
        self._records: list[LogRecord] = []
        self._trits: list[torch.Tensor] = []

    @classmethod
    def empty(cls, step: int | None = None) -> StepLog:
        """A log with no records (step 0, or a step without inexact ops)."""
        return cls(step)

    def append(self, op_index: int, op_name: str, trits: torch.Tensor) -> None:
        """Record ``trits`` (uint8, any shape: stored in row-major order) for op ``op_index``."""
        if not 0 <= op_index < 2**32:
            raise RoundingLogError(f"{_where(self.step)}: op index {op_index} does not fit uint32")
        if len(op_name.encode("utf-8")) >= 2**16:
            raise RoundingLogError(f"{_where(self.step)}: op name of op #{op_index} is too long")
        if trits.dtype != torch.uint8:
            raise RoundingLogError(
                f"{_where(self.step)}: trits of op #{op_index} {op_name} are {trits.dtype}"
            )
        flat = trits.detach().reshape(-1)
        self._records.append(LogRecord(op_index, op_name, flat.numel()))
        self._trits.append(flat)

    def pop(self) -> tuple[LogRecord, torch.Tensor]:
        """Remove and return the last record and its trits (for a tool that rewrites the op just logged)."""
        return self._records.pop(), self._trits.pop()

    @property
    def records(self) -> tuple[LogRecord, ...]:
        return tuple(self._records)

    @property
    def total_values(self) -> int:
        return sum(r.count for r in self._records)

    def __len__(self) -> int:
        return len(self._records)

    def trits(self, index: int) -> torch.Tensor:
        """The (flat uint8) trits of record ``index``."""
        return self._trits[index]

    def entries(self) -> list[tuple[LogRecord, torch.Tensor]]:
        """(record, trits) pairs in order: what a tool that rewrites a log (tests, tampering) needs."""
        return list(zip(self._records, self._trits, strict=True))

    def all_trits(self) -> torch.Tensor:
        """Every record's trits concatenated, on the CPU (one transfer per device)."""
        if not self._trits:
            return torch.empty(0, dtype=torch.uint8)
        devices = {t.device for t in self._trits}
        if len(devices) == 1:
            return torch.cat(self._trits).cpu()
        return torch.cat([t.cpu() for t in self._trits])

    def prepare(self, step: int, spec_hash: bytes) -> PreparedChunk:
        """The chunk to be finished on the writer's thread: here all of the encoding waits for it (the
        trits, packed by the C kernels, are most of a packed chunk and take no GIL)."""
        return PreparedChunk(step, spec_hash, functools.partial(self.encode, step, bytes(spec_hash)))

    def encode(self, step: int, spec_hash: bytes, *, version: int = 2) -> bytes:
        """The chunk bytes (see the module docstring); ``version=1`` writes the first layout."""
        if not 0 <= step < 2**64:
            raise RoundingLogError(f"step {step} does not fit uint64")
        if len(spec_hash) != HASH_SIZE:
            raise RoundingLogError(f"step {step}: spec hash must be {HASH_SIZE} bytes, got {len(spec_hash)}")
        if version == 1:
            return self._encode_v1(step, spec_hash)
        if version != 2:
            raise RoundingLogError(f"packed chunk layout {version} is not 1 or 2")
        names: dict[str, int] = {}
        head: list[int] = []
        prev = -1
        for r in self._records:
            if r.op_index <= prev:
                raise RoundingLogError(
                    f"step {step}: op #{r.op_index} {r.op_name} follows op #{prev}; op indices must increase"
                )
            head += [r.op_index - prev - 1, names.setdefault(r.op_name, len(names)), r.count]
            prev = r.op_index
        table = encode_names(list(names)) + uvarint_encode(np.array(head, dtype=np.int64))
        body, codec = compress(table, self.codec)
        header = _HEADER.pack(
            step, bytes(spec_hash), len(self._records), CODECS[codec], len(table), len(body)
        )
        return b"".join([MAGIC, header, body, pack_trits(self.all_trits())])

    def _encode_v1(self, step: int, spec_hash: bytes) -> bytes:
        parts = [MAGIC_V1, _HEADER_V1.pack(step, bytes(spec_hash), len(self._records))]
        for r in self._records:
            name = r.op_name.encode("utf-8")
            parts += [_OP_INDEX.pack(r.op_index), _NAME_LEN.pack(len(name)), name, _COUNT.pack(r.count)]
        parts.append(pack_trits_v1(self.all_trits()))
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes, *, step: int | None, spec_hash: bytes) -> StepLog:
        """Parse and check a chunk of either layout; ``step=None`` accepts the step the chunk names
        (it is then ``.step``).

        Raises :class:`ChunkFormatError` (truncated, trailing bytes, bad magic or record, trit bytes
        that do not match the counts) or :class:`ChunkMismatchError` (another step: "reordered";
        another spec hash: "foreign chunk"), each naming the step.
        """
        magic = bytes(data[: len(MAGIC)])
        if magic == MAGIC_V1:
            return cls._decode_v1(data, step=step, spec_hash=spec_hash)
        where = _where(step)
        if magic != MAGIC:
            raise ChunkFormatError(f"{where}: not a rounding-log chunk (bad magic or version)")
        pos = len(MAGIC)
        if len(data) < pos + _HEADER.size:
            raise ChunkFormatError(f"{where}: chunk truncated in its header ({len(data)} bytes)")
        own_step, own_spec, n_records, codec_id, size, stored = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        where = check_chunk_identity(own_step, own_spec, step, spec_hash)
        if stored > len(data) - pos:
            raise ChunkFormatError(
                f"{where}: chunk truncated in its record table ({stored} bytes, {len(data) - pos} left)"
            )
        if n_records * 3 > size:  # a record takes at least 3 bytes of the table
            raise ChunkFormatError(f"{where}: {n_records} records cannot fit a {size}-byte record table")
        try:
            codec = codec_name(codec_id)
            table = decompress(bytes(data[pos : pos + stored]), codec, size)
            records = _parse_table(table, n_records)
        except Malformed as exc:
            raise ChunkFormatError(f"{where}: corrupt record table: {exc}") from None
        pos += stored
        out = cls(own_step, codec=codec)
        out._records = records
        out._trits = _split_trits(data, pos, [r.count for r in records], packed_size, unpack_trits, where)
        return out

    @classmethod
    def _decode_v1(cls, data: bytes, *, step: int | None, spec_hash: bytes) -> StepLog:
        where = _where(step)
        view = memoryview(data)
        pos = len(MAGIC_V1)
        if len(view) < pos + _HEADER_V1.size:
            raise ChunkFormatError(f"{where}: chunk truncated in its header ({len(view)} bytes)")
        own_step, own_spec, n_records = _HEADER_V1.unpack_from(view, pos)
        pos += _HEADER_V1.size
        where = check_chunk_identity(own_step, own_spec, step, spec_hash)
        if n_records * _MIN_RECORD > len(view) - pos:
            raise ChunkFormatError(
                f"{where}: chunk truncated: {n_records} records cannot fit {len(view)} bytes"
            )
        out = cls(own_step)
        counts: list[int] = []
        for i in range(n_records):
            if len(view) < pos + _OP_INDEX.size + _NAME_LEN.size:
                raise ChunkFormatError(f"{where}: chunk truncated in record {i} of {n_records}")
            (op_index,) = _OP_INDEX.unpack_from(view, pos)
            (name_len,) = _NAME_LEN.unpack_from(view, pos + _OP_INDEX.size)
            pos += _OP_INDEX.size + _NAME_LEN.size
            if len(view) < pos + name_len + _COUNT.size:
                raise ChunkFormatError(
                    f"{where}: chunk truncated in record {i} (op #{op_index}) of {n_records}"
                )
            try:
                name = bytes(view[pos : pos + name_len]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ChunkFormatError(f"{where}: record {i} (op #{op_index}) has a malformed name") from exc
            pos += name_len
            (count,) = _COUNT.unpack_from(view, pos)
            pos += _COUNT.size
            out._records.append(LogRecord(op_index, name, count))
            counts.append(count)
        out._trits = _split_trits(data, pos, counts, packed_size_v1, unpack_trits_v1, where)
        return out

    def cursor(self) -> StepLogCursor:
        """A reader that hands the records out in order to the replaying computation."""
        return RecordCursor(self.step, self._records, self._trits)


def _parse_table(table: bytes, n_records: int) -> list[LogRecord]:
    """The records of a v2 record table (names, then op-index gap, name id and count per record)."""
    buf = np.frombuffer(table, dtype=np.uint8)
    names, pos = decode_names(buf, 0, n_records)
    head, pos = uvarint_decode(buf, pos, 3 * n_records)
    if pos != buf.size:
        raise Malformed(f"{buf.size - pos} bytes left after the last record")
    records: list[LogRecord] = []
    op_index = -1
    for gap, name_id, count in head.reshape(n_records, 3).tolist():
        op_index += gap + 1
        if op_index >= 2**32 or name_id >= len(names):
            raise Malformed(f"record {len(records)}: op index or name id out of range")
        records.append(LogRecord(op_index, names[name_id], count))
    return records


def _split_trits(
    data: bytes,
    pos: int,
    counts: list[int],
    size_of: Callable[[int], int],
    unpack: Callable[[memoryview, int], torch.Tensor],
    where: str,
) -> list[torch.Tensor]:
    """The trits after ``pos``, checked against the records' counts and split record by record."""
    total = sum(counts)
    expected = size_of(total)
    have = len(data) - pos
    if have < expected:
        raise ChunkFormatError(f"{where}: chunk truncated: {total} trits need {expected} bytes, {have} left")
    if have > expected:
        raise ChunkFormatError(f"{where}: {have - expected} trailing bytes after {total} trits")
    try:
        trits = unpack(memoryview(data)[pos:], total)  # a view: the trits are most of the chunk
    except TritPackingError as exc:
        raise ChunkFormatError(f"{where}: corrupt trit bytes: {exc}") from exc
    return list(torch.split(trits, counts)) if counts else []


#: A decoded chunk of either format.
ChunkLog: TypeAlias = "StepLog | SparseStepLog"


class PreparedChunk:
    """A step's chunk as far as :meth:`StepLog.prepare` or :meth:`SparseStepLog.prepare` built it on
    the caller's thread; :meth:`encode` finishes it (the transcript writer's thread compresses it and
    packs its header). Why: that thread shares the GIL with the trainer's, and a few hundred
    microseconds of its Python made the trainer's thread wait for the GIL several times a step,
    where the same work costs the trainer's thread 40 to 70 us done there at once
    (docs/benchmarks.md). ``finish`` is what is left to do, or a :class:`Compressible` chunk (a
    sparse one), which the writer's C call can finish without Python (:attr:`compressible`)."""

    __slots__ = ("_finish", "spec_hash", "step")

    def __init__(self, step: int, spec_hash: bytes, finish: Callable[[], bytes] | Compressible) -> None:
        self.step = step
        self.spec_hash = bytes(spec_hash)
        self._finish = finish

    @property
    def compressible(self) -> Compressible | None:
        """The chunk as a head and a payload to compress, when it is one."""
        return self._finish if isinstance(self._finish, Compressible) else None

    def encode(self, step: int, spec_hash: bytes) -> bytes:
        """The chunk bytes; ``step`` and ``spec_hash`` must be the ones it was prepared for."""
        self.check_for(step, spec_hash)
        return self._finish.finish() if isinstance(self._finish, Compressible) else self._finish()

    def check_for(self, step: int, spec_hash: bytes) -> None:
        """Refuse a step or a task other than the ones the chunk was prepared for."""
        if step != self.step or bytes(spec_hash) != self.spec_hash:
            raise RoundingLogError(
                f"a chunk prepared for step {self.step} of task {self.spec_hash.hex()[:16]}... was asked "
                f"for as step {step} of task {bytes(spec_hash).hex()[:16]}..."
            )


def decode_chunk(data: bytes, spec_hash: bytes, step: int | None = None) -> ChunkLog:
    """Decode a chunk of either format (told apart by its magic); pass ``step`` wherever it is known,
    so a reordered chunk is caught."""
    from game.training.sparselog import MAGIC as SPARSE_MAGIC
    from game.training.sparselog import SparseStepLog

    if bytes(data[: len(SPARSE_MAGIC)]) == SPARSE_MAGIC:
        return SparseStepLog.decode(data, step=step, spec_hash=spec_hash)
    return StepLog.decode(data, step=step, spec_hash=spec_hash)


def new_step_log(log_format: str, step: int | None) -> ChunkLog:
    """An empty log of the task's format for the trainer to record into."""
    from game.training.sparselog import SparseStepLog

    if log_format == "sparse":
        return SparseStepLog(step)
    if log_format == "packed":
        return StepLog(step)
    raise RoundingLogError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")


class RecordCursor(Generic[_Item]):
    """The auditor's view of a log: records taken in order, each checked against the op asking.

    Shared by both formats: ``items[i]`` is what record ``i`` carries (trits, or sparse entries).
    """

    def __init__(self, step: int | None, records: Sequence[LogRecord], items: Sequence[_Item]) -> None:
        self._step = step
        self._lists: tuple[list[LogRecord], list[_Item]] | None = (list(records), list(items))
        self._load: Callable[[], tuple[Sequence[LogRecord], Sequence[_Item]]] | None = None
        self._count = len(records)
        self._pos = 0

    @classmethod
    def later(
        cls, step: int | None, count: int, load: Callable[[], tuple[Sequence[LogRecord], Sequence[_Item]]]
    ) -> RecordCursor[_Item]:
        """A cursor over ``count`` records that ``load`` gives only when one is read: a replay the C++
        front runs reads none of them here, only moves the cursor."""
        cursor = cls(step, (), ())
        cursor._lists, cursor._load, cursor._count = None, load, count
        return cursor

    @property
    def _records(self) -> list[LogRecord]:
        return self._loaded()[0]

    @property
    def _items(self) -> list[_Item]:
        return self._loaded()[1]

    def _loaded(self) -> tuple[list[LogRecord], list[_Item]]:
        if self._lists is None:
            assert self._load is not None
            records, items = self._load()
            self._lists, self._load = (list(records), list(items)), None
            if len(records) != self._count:
                raise LogSequenceError(f"{_where(self._step)}: the log changed under its cursor")
        return self._lists

    @property
    def position(self) -> int:
        """Number of records taken so far."""
        return self._pos

    def move_to(self, position: int) -> None:
        """Count records taken elsewhere, in order (the C++ front's kernels check each against its
        op as :meth:`take` does)."""
        if not self._pos <= position <= self._count:
            raise LogSequenceError(
                f"{_where(self._step)}: cursor moved from record {self._pos} to {position} of {self._count}"
            )
        self._pos = position

    def take(self, op_index: int, op_name: str, numel: int) -> _Item:
        """The next record's payload, after checking it was recorded for this op."""
        where = _where(self._step)
        if self._pos >= self._count:
            raise LogSequenceError(
                f"{where}: op #{op_index} {op_name} ({numel} values) is past the end of the log "
                f"({self._count} records)"
            )
        rec = self._records[self._pos]
        if rec.op_index != op_index or rec.op_name != op_name:
            raise LogSequenceError(
                f"{where}: op #{op_index} {op_name} does not match log record {self._pos} "
                f"(op #{rec.op_index} {rec.op_name})"
            )
        if rec.count != numel:
            raise LogSequenceError(
                f"{where}: op #{op_index} {op_name} has {numel} values but log record {self._pos} has {rec.count}"
            )
        item = self._items[self._pos]
        self._pos += 1
        return item

    def finish(self) -> None:
        """Raise when records remain unread: the replay ran fewer ops than the trainer logged."""
        if self._pos < self._count:
            rec = self._records[self._pos]
            raise LogSequenceError(
                f"{_where(self._step)}: {self._count - self._pos} log records left unread, "
                f"first: record {self._pos} (op #{rec.op_index} {rec.op_name})"
            )


#: The packed log's cursor hands out flat uint8 trits.
StepLogCursor = RecordCursor[torch.Tensor]


# ----------------------------------------------------------------------------------------------
# Chunk files
# ----------------------------------------------------------------------------------------------


def chunk_file_name(step: int) -> str:
    return f"step-{step:09d}.bin"


def chunk_hash(data: bytes) -> bytes:
    """``sha256(chunk bytes)``: the leaf data of the log tree."""
    return hashlib.sha256(data).digest()


class LogWriter:
    """Writes one chunk file per step into ``directory``, atomically; keeps nothing between steps."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def write_chunk(self, step: int, step_log: ChunkLog | PreparedChunk, spec_hash: bytes) -> bytes:
        """Encode, write (tmp file, fsync, rename) and return the chunk hash."""
        data = step_log.encode(step, spec_hash)
        atomic_write(self.directory / chunk_file_name(step), data)
        log.debug("step %d: wrote %d-byte log chunk", step, len(data))
        return chunk_hash(data)

    def truncate_after(self, step: int) -> list[int]:
        """Delete the chunks of steps after ``step`` (and stray tmp files) for crash-resume."""
        removed = []
        for path in self.directory.iterdir():
            m = _CHUNK_NAME.match(path.name)
            if m and int(m.group(1)) > step:
                path.unlink()
                removed.append(int(m.group(1)))
            elif is_temp_name(path.name):
                path.unlink()
        if removed:
            fsync_dir(self.directory)
        return sorted(removed)


class LogReader:
    """Reads and checks the chunk files a :class:`LogWriter` wrote for the task ``spec_hash``."""

    def __init__(self, directory: Path, spec_hash: bytes) -> None:
        self.directory = Path(directory)
        self.spec_hash = bytes(spec_hash)

    def chunk_path(self, step: int) -> Path:
        return self.directory / chunk_file_name(step)

    def read_bytes(self, step: int) -> bytes:
        path = self.chunk_path(step)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise MissingChunkError(
                f"step {step}: log chunk {path.name} is missing from {self.directory}"
            ) from exc

    def read(self, step: int) -> ChunkLog:
        return decode_chunk(self.read_bytes(step), self.spec_hash, step)

    def chunk_hash(self, step: int) -> bytes:
        return chunk_hash(self.read_bytes(step))

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _CHUNK_NAME.match(p.name)))


def log_root(chunk_hashes: Sequence[bytes]) -> bytes:
    """Merkle root over the chunk hashes of steps ``0..S`` (the same tree as the state root)."""
    if not chunk_hashes:
        raise RoundingLogError("a log root needs at least the chunk of step 0")
    return merkle_root(chunk_hashes)


def bits_per_value(chunk_bytes: int, values: int) -> float:
    """Log size per logged value (the paper reports 1.6 for the packed baseline)."""
    return 8.0 * chunk_bytes / values if values else math.nan
