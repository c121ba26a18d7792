"""The packed rounding log: a trit for every rounded value, one chunk per training step.

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
    trits        every record's trits concatenated, packed as :mod:`~game.training.log.trits` says
                 (blocks of 116 trits in 23 bytes, the rest 5 per byte)

A record costs some 3 bytes instead of 14 plus its name. Chunks of the first layout
(``vgame-log-v1``: fixed width records with the name in each, every trit 5 per byte) still decode;
``encode(version=1)`` writes one.

``chunk_hash`` (:mod:`game.chunkleaf`); the log root is the Merkle root over the chunk hashes of steps
``0..S`` (:mod:`~game.training.log.formats`). Unlike the paper's code (ANCHORS.md) a length mismatch
is an error, padding never decodes as data, and a chunk names its step and task, so a reordered or
foreign chunk is caught when decoded.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

import numpy as np
import torch

from game.errors import RoundingLogError
from game.training.log.chunks import (
    HASH_SIZE,
    ChunkFormatError,
    LogRecord,
    PreparedChunk,
    RecordCursor,
    check_chunk_identity,
    step_label,
)
from game.training.log.codec import (
    CODECS,
    DEFAULT_CODEC,
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
from game.training.log.trits import (
    TritPackingError,
    pack_trits,
    pack_trits_v1,
    packed_size,
    packed_size_v1,
    unpack_trits,
    unpack_trits_v1,
)

MAGIC = b"vgame-log-v2\0"
MAGIC_V1 = b"vgame-log-v1\0"
_HEADER = struct.Struct("<Q32sIBII")  # step, spec hash, record count, codec, table size, stored size
_HEADER_V1 = struct.Struct("<Q32sI")  # step, spec hash, record count (after the magic)
_OP_INDEX = struct.Struct("<I")
_NAME_LEN = struct.Struct("<H")
_COUNT = struct.Struct("<Q")
_MIN_RECORD = _OP_INDEX.size + _NAME_LEN.size + _COUNT.size


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
            raise RoundingLogError(f"{step_label(self.step)}: op index {op_index} does not fit uint32")
        if len(op_name.encode("utf-8")) >= 2**16:
            raise RoundingLogError(f"{step_label(self.step)}: op name of op #{op_index} is too long")
        if trits.dtype != torch.uint8:
            raise RoundingLogError(
                f"{step_label(self.step)}: trits of op #{op_index} {op_name} are {trits.dtype}"
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
        where = step_label(step)
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
        where = step_label(step)
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


#: The packed log's cursor hands out flat uint8 trits.
StepLogCursor = RecordCursor[torch.Tensor]
