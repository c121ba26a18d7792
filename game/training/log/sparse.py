"""The sparse rounding log: per step only the values within their op's band, as (position, direction).

A packed chunk (:mod:`~game.training.log.packed`) spends 1.59 bits on every rounded value, yet only values within the
calibrated divergence band of a rounding midpoint can round differently on another machine
(:mod:`~game.training.numerics.bandcheck`). A sparse chunk lists just those. Layout::

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
needed (:mod:`~game.training.numerics.bandcheck` has the rule and why it replays on other hardware).

uvarints are LEB128 (7 bits per byte, high bit = more), shortest form only. Positions are the flat
row-major indices in the op's output, so they are strictly increasing and below the value count;
a chunk that breaks any of this, or has bytes left over, is a :class:`ChunkFormatError`. The chunk
hash and the log root are the same as for packed chunks.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from game.errors import RoundingLogError
from game.training.log.chunks import (
    HASH_SIZE,
    BuildLater,
    ChunkFormatError,
    Heads,
    LogRecord,
    PreparedChunk,
    RecordCursor,
    check_chunk_identity,
    step_label,
)
from game.training.log.codec import (
    DEFAULT_CODEC,
    MAX_PAYLOAD,
    Compressible,
    Malformed,
    check_codec,
    check_payload_size,
    codec_name,
    decode_names,
    decompress,
    encode_names,
    uvarint_decode,
    uvarint_encode,
)
from game.training.native import bindings

MAGIC = b"vgame-slog-v1\0"
_HEADER = struct.Struct("<Q32sIBI")  # step, spec hash, record count, codec, payload size
_CODEC_AT = len(MAGIC) + struct.calcsize("<Q32sI")  # the codec byte's offset in a chunk
#: A log listing this many entries or more has its payload built by the writer's thread
#: (:meth:`SparseStepLog.prepare`): the encoder takes a millisecond or two a million entries, and a
#: GPT-2-small step lists 6.5-16 million. Below it, a step's log is built where it was made, as the
#: writer's Python would cost the trainer's thread more in waits for the GIL.
BUILD_LATER_MIN = 1 << 20


class SparseRecord(NamedTuple):
    """One rounded inexact tensor: its record, and the positions of its in-band values rounded odd.
    A named tuple: a step makes hundreds (a frozen dataclass took 1 us more each to build)."""

    record: LogRecord
    positions: torch.Tensor  # int64, strictly increasing, < record.count


class RecordRows(NamedTuple):
    """Records as columns, the way the C++ front hands them over (:meth:`SparseStepLog.add_rows`):
    no Python object per record until something asks for the records one by one."""

    table: np.ndarray  # (k, 4) int64: op index, row, value count, entry count, per record
    positions: np.ndarray  # flat int64: every record's positions, one record after another
    names: Sequence[str]  # row -> op name (a table that only grows: the rows above stay valid)


class SparseStepLog:
    """The sparse rounding log of one step, in op order (the trainer appends; the auditor reads).

    Records come one at a time (:meth:`append`) or as columns from the C++ front
    (:meth:`add_rows`); :meth:`encode` reads the columns as they are, and anything that asks for the
    records one by one turns them into :class:`SparseRecord` first."""

    format = "sparse"

    def __init__(self, step: int | None = None, *, codec: str = DEFAULT_CODEC) -> None:
        self.step = step
        self.codec = check_codec(codec)
        self._parts: list[SparseRecord | RecordRows] = []  # in op order
        self._count = 0  # records in all the parts
        self._has_rows = False  # whether a part is a RecordRows
        self._decoded: RecordRows | None = None  # the chunk's records as decoded, until changed
        self._pinned: torch.Tensor | None = None  # the decoded positions in page-locked memory (pin)

    @classmethod
    def empty(cls, step: int | None = None) -> SparseStepLog:
        return cls(step)

    def append(self, op_index: int, op_name: str, count: int, positions: torch.Tensor) -> None:
        """Record an op's listed values (positions ascending, flat row-major)."""
        if not 0 <= op_index < 2**32:
            raise RoundingLogError(f"{step_label(self.step)}: op index {op_index} does not fit uint32")
        if positions.dim() != 1:
            raise RoundingLogError(
                f"{step_label(self.step)}: op #{op_index}: positions must be a flat tensor"
            )
        if positions.requires_grad:  # else no detach: it makes a new tensor, some 200 times a step
            positions = positions.detach()
        self._decoded = self._pinned = None
        self._parts.append(SparseRecord(LogRecord(op_index, op_name, int(count)), positions))
        self._count += 1

    def add_rows(self, table: np.ndarray, positions: np.ndarray, names: Sequence[str]) -> None:
        """Record several ops' listed values at once, as columns (:class:`RecordRows`): the C++
        front's records, its rows named by ``names``. The table's entry counts must add up to the
        positions given."""
        if table.ndim != 2 or table.shape[1] != 4 or positions.ndim != 1:
            raise RoundingLogError(
                f"{step_label(self.step)}: records must be a (k, 4) table and flat positions"
            )
        if not len(table):
            return
        if int(table[:, 3].sum()) != positions.size:
            raise RoundingLogError(
                f"{step_label(self.step)}: the records' entry counts do not add up to their positions"
            )
        (op_lo, row_lo, *_), (op_hi, row_hi, *_) = table.min(axis=0).tolist(), table.max(axis=0).tolist()
        if op_lo < 0 or op_hi >= 2**32:
            ops = table[:, 0]
            bad = int(ops[(ops < 0) | (ops >= 2**32)][0])
            raise RoundingLogError(f"{step_label(self.step)}: op index {bad} does not fit uint32")
        if row_lo < 0 or row_hi >= len(names):
            raise RoundingLogError(f"{step_label(self.step)}: a record's row has no op name")
        self._decoded = self._pinned = None
        self._parts.append(RecordRows(table, positions, names))
        self._count += len(table)
        self._has_rows = True

    def pop(self) -> SparseRecord:
        """Remove and return the last record (for a tool that rewrites the op just logged)."""
        record = self._records().pop()
        self._count -= 1
        self._decoded = self._pinned = None
        return record

    def _records(self) -> list[SparseRecord]:
        """The records one by one: a part given as columns is turned into records here, once."""
        if self._has_rows:
            out: list[SparseRecord | RecordRows] = []
            for part in self._parts:
                if isinstance(part, SparseRecord):
                    out.append(part)
                    continue
                table = part.table.tolist()
                pieces = torch.split(torch.from_numpy(part.positions), [row[3] for row in table])
                out += [
                    SparseRecord(LogRecord(index, part.names[row], count), pos)
                    for (index, row, count, _), pos in zip(table, pieces, strict=True)
                ]
            self._parts, self._has_rows = out, False
        return self._parts  # type: ignore[return-value]  # every part is a SparseRecord now

    # ---- inspection ----------------------------------------------------------------------------

    def decoded_rows(self) -> RecordRows | None:
        """The records as their chunk decoded them, while nothing has changed them: one table, and
        every record's positions in one array, each record's strictly ascending and below its value
        count (:meth:`decode` refuses a chunk otherwise), so that a reader may take them as they
        are. None for a log built here or changed since."""
        return self._decoded

    def pin(self) -> None:
        """Move a decoded chunk's positions into page-locked host memory (a CUDA machine's), so that
        a deferring replay copies them to the GPU without the host waiting
        (:meth:`pinned_positions`). Why: at the GPT-2-small shape they are 52-127 MB a step, and a
        copy from pageable memory holds the step's thread while the driver stages it. Run on the
        read-ahead's thread (:class:`~game.training.transcript.readahead.ReadAhead`), beside the step
        before. The records, entries and bytes stay as they were; a log built here, or changed
        since it was decoded, is left as it is."""
        rows = self._decoded
        if rows is None or self._pinned is not None or not rows.positions.size:
            return
        if len(self._parts) != 1 or self._parts[0] is not rows:  # turned into records one by one
            return
        pinned = torch.from_numpy(rows.positions).pin_memory()
        rows = rows._replace(positions=pinned.numpy())  # the records read the pinned copy itself
        self._parts, self._decoded, self._pinned = [rows], rows, pinned

    def pinned_positions(self) -> torch.Tensor | None:
        """The decoded positions as :meth:`pin` left them (the same values as
        ``decoded_rows().positions``, in page-locked memory), or None where the log was not pinned
        or has changed since."""
        return self._pinned if self._decoded is not None else None

    @property
    def records(self) -> tuple[LogRecord, ...]:
        return tuple(e.record for e in self._records())

    def entries(self) -> list[SparseRecord]:
        """Every record with its entries (for tools that rewrite a log: tests, tampering)."""
        return list(self._records())

    @property
    def total_entries(self) -> int:
        """Values that have an entry (in band and rounded to the odd neighbour)."""
        return sum(
            int(p.positions.size) if isinstance(p, RecordRows) else int(p.positions.numel())
            for p in self._parts
        )

    def __len__(self) -> int:
        return self._count

    def columns(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        """The records as columns: a (k, 4) int64 table of (op index, name id, value count, entry
        count) per record, the names by id (in order of first use, as a chunk lists them), and every
        record's positions one after another (int64, on the CPU; for a log of one part of columns,
        that part's own array: read it, do not change it)."""
        names: dict[str, int] = {}  # name -> id
        if len(self._parts) == 1 and isinstance(part := self._parts[0], RecordRows):
            # one part as columns (a step of the C++ front's, a decoded chunk): only the name ids
            # change, in a few calls (the general way below takes some twenty)
            table = part.table.astype(np.int64)  # a copy
            table[:, 1] = [names.setdefault(part.names[row], len(names)) for row in table[:, 1].tolist()]
            # the part's own positions, not a copy: some ten million a step at the GPT-2-small shape
            return table, list(names), np.ascontiguousarray(part.positions, dtype=np.int64)
        columns = _columns(self._parts)
        table = np.empty((self._count, 4), dtype=np.int64)
        table[:, 0] = columns.ops
        table[:, 1] = [names.setdefault(name, len(names)) for name in columns.names]
        table[:, 2] = columns.counts
        table[:, 3] = columns.sizes
        return table, list(names), columns.positions

    # ---- bytes ---------------------------------------------------------------------------------

    def encode(self, step: int, spec_hash: bytes) -> bytes:
        """The chunk bytes (see the module docstring)."""
        return self.prepare(step, spec_hash).encode(step, spec_hash)

    def prepare(self, step: int, spec_hash: bytes) -> PreparedChunk:
        """The chunk's payload, built now; compression and the header wait for the writer's thread
        (:class:`~game.training.log.chunks.PreparedChunk` says why). Raises what :meth:`encode` does.

        A log of :data:`BUILD_LATER_MIN` entries or more, whose payload cannot pass the size limit,
        leaves its payload to build too (:class:`~game.training.log.chunks.BuildLater`), from its
        columns as they are now: at the GPT-2-small shape that is 9-22 ms of a step's own thread
        on the 2-core machine, and the encoder holds no GIL on the writer's. Records appended
        after are not in it (as in one built now), but the positions' array may be the log's own
        (:meth:`columns`): it must not be changed in place (the log is the writer's from then, as
        :meth:`TranscriptWriter.append_step
        <game.training.transcript.writer.TranscriptWriter.append_step>` says). A value the encoder
        refuses (positions out of order) then fails the writer's step, not this call."""
        if not 0 <= step < 2**64:
            raise RoundingLogError(f"step {step} does not fit uint64")
        if len(spec_hash) != HASH_SIZE:
            raise RoundingLogError(f"step {step}: spec hash must be {HASH_SIZE} bytes, got {len(spec_hash)}")
        table, names, positions = self.columns()
        build = functools.partial(self._compressible, step, bytes(spec_hash), table, names, positions)
        # the bound (an uvarint below 2^63 takes 9 bytes at most) asked only of a large log
        large = positions.size >= BUILD_LATER_MIN
        if large and len(encode_names(names)) + 9 * (table.size + positions.size) <= MAX_PAYLOAD:
            return PreparedChunk(step, spec_hash, BuildLater(build))
        return PreparedChunk(step, spec_hash, build())

    def _compressible(
        self, step: int, spec_hash: bytes, table: np.ndarray, names: list[str], positions: np.ndarray
    ) -> Compressible:
        """The chunk as a head and its payload (:meth:`prepare`)."""
        body = bindings.sparse_body(table, positions)
        if body is None:
            head = table.copy()
            head[:, 0] = np.diff(table[:, 0], prepend=-1) - 1  # op index gaps, the first from -1
            body = uvarint_encode(head.ravel()) + uvarint_encode(_gaps(positions, table[:, 3]))
        payload = encode_names(names) + body
        check_payload_size(len(payload))
        chunk_head = MAGIC + _HEADER.pack(step, spec_hash, len(table), 0, len(payload))
        return Compressible(chunk_head, _CODEC_AT, payload, self.codec)

    @classmethod
    def decode(cls, data: bytes, *, step: int | None, spec_hash: bytes) -> SparseStepLog:
        """Parse and check a sparse chunk; errors name the step (see :meth:`StepLog.decode`)."""
        where = step_label(step)
        if bytes(data[: len(MAGIC)]) != MAGIC:
            raise ChunkFormatError(f"{where}: not a sparse rounding-log chunk (bad magic or version)")
        if len(data) < len(MAGIC) + _HEADER.size:
            raise ChunkFormatError(f"{where}: chunk truncated in its header ({len(data)} bytes)")
        own_step, own_spec, n_records, codec_id, size = _HEADER.unpack_from(data, len(MAGIC))
        where = check_chunk_identity(own_step, own_spec, step, spec_hash)
        try:
            codec = codec_name(codec_id)
            payload = decompress(bytes(data[len(MAGIC) + _HEADER.size :]), codec, size)
            rows = _parse_payload(payload, n_records)
        except Malformed as exc:
            raise ChunkFormatError(f"{where}: corrupt sparse log: {exc}") from None
        out = cls(own_step, codec=codec)
        out._parts, out._count, out._has_rows = [rows], len(rows.table), True
        out._decoded = rows
        return out

    def cursor(self) -> SparseCursor:
        """A reader that hands the records out in order to the replaying computation (it turns
        records given as columns into records one by one only when it hands one out; checking a
        record against its op reads the columns)."""

        def load() -> tuple[list[LogRecord], list[SparseRecord]]:
            records = self._records()
            return [e.record for e in records], records

        if not self._has_rows:
            return RecordCursor(self.step, *load())
        rows = self._parts[0] if len(self._parts) == 1 else None
        if not isinstance(rows, RecordRows):  # columns and records mixed: the records are checked
            return RecordCursor.later(self.step, self._count, load)
        table, names = rows.table, rows.names  # a log's columns are never changed, only replaced

        def heads() -> Heads:
            ids = table[:, 1].tolist()
            return Heads(table[:, 0].tolist(), [names[i] for i in ids], table[:, 2].tolist())

        return RecordCursor.later(self.step, self._count, load, heads)


def _parse_payload(payload: bytes, n_records: int) -> RecordRows:
    """The payload's records as columns (no object per record: the auditor's C++ front reads them so)."""
    buf = np.frombuffer(payload, dtype=np.uint8)
    names, pos = decode_names(buf, 0, n_records)
    if 4 * n_records > buf.size - pos:  # before any array of that size: a header's count is anyone's
        raise Malformed(f"{n_records} records in the {buf.size - pos} bytes after the name table")
    fast = bindings.sparse_rows(buf, pos, n_records, len(names))  # one C call for what follows
    if fast is not None:
        return RecordRows(fast[0], fast[1], names)
    head, pos = uvarint_decode(buf, pos, 4 * n_records)
    head = head.reshape(n_records, 4)
    total = int(head[:, 3].sum()) if n_records else 0
    gaps, pos = uvarint_decode(buf, pos, total)
    if pos != buf.size:
        raise Malformed(f"{buf.size - pos} bytes left after the last entry")
    # Every record's positions from one running sum over the whole chunk: position = (running sum of
    # gap + 1, from the record's start) - 1. One cumsum instead of one per record.
    sizes = head[:, 3]
    # The sum of (gap + 1) over the chunk, exactly (gaps are below 2^63: summed in two halves so that
    # neither wraps int64), must stay below 2^62: the running sums below cannot wrap then.
    if gaps.size and (int((gaps >> 31).sum()) << 31) + int((gaps & 0x7FFFFFFF).sum()) + gaps.size >= 2**62:
        raise Malformed("position gaps add up past any tensor's size")
    ends = np.cumsum(sizes)
    running = np.cumsum(gaps + 1)
    before = np.concatenate(([0], running))[ends - sizes]  # the running sum before each record
    positions = running - np.repeat(before, sizes) - 1
    last = positions[ends[sizes > 0] - 1]
    too_far = np.flatnonzero(last >= head[sizes > 0, 2])
    # Op indices from one running sum too (gap = index - previous - 1, from -1). A gap is cut to
    # 2^32 first: the sum cannot wrap, and a cut gap still puts its record out of range.
    op_indices = np.cumsum(np.minimum(head[:, 0], 2**32) + 1) - 1
    name_ids = head[:, 1]
    bad = np.flatnonzero((op_indices >= 2**32) | (name_ids >= len(names)))
    if bad.size:
        raise Malformed(f"record {int(bad[0])}: op index or name id out of range")
    if too_far.size:
        r = int(np.flatnonzero(sizes > 0)[too_far[0]])
        raise Malformed(
            f"record {r} (op #{int(op_indices[r])}): position {int(last[too_far[0]])} >= {int(head[r, 2])} values"
        )
    head[:, 0] = op_indices  # the table of RecordRows, its rows the chunk's name ids
    return RecordRows(head, positions, names)


#: The sparse log's cursor hands out each record's entries.
SparseCursor = RecordCursor[SparseRecord]


# --------------------------------------------------------------------------------------------------
# Gaps
# --------------------------------------------------------------------------------------------------


class _Columns(NamedTuple):
    """A log's records as columns, for :meth:`SparseStepLog.encode`."""

    ops: np.ndarray  # op index per record
    names: list[str]  # op name per record
    counts: np.ndarray  # value count per record
    sizes: np.ndarray  # entry count per record
    positions: np.ndarray  # every record's positions, one after another


def _columns(parts: Sequence[SparseRecord | RecordRows]) -> _Columns:
    """The parts' records as columns: a run of single records becomes columns here (their positions
    moved to the CPU in one concatenation), a :class:`RecordRows` is already columns."""
    ops: list[np.ndarray] = []
    names: list[str] = []
    counts: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        if isinstance(part, RecordRows):
            ops.append(part.table[:, 0])
            names += [part.names[row] for row in part.table[:, 1].tolist()]
            counts.append(part.table[:, 2])
            sizes.append(part.table[:, 3])
            positions.append(part.positions)
            i += 1
            continue
        run: list[SparseRecord] = []
        while i < len(parts) and isinstance(parts[i], SparseRecord):
            run.append(parts[i])  # type: ignore[arg-type]  # checked on the line above
            i += 1
        ops.append(np.array([e.record.op_index for e in run], dtype=np.int64))
        names += [e.record.op_name for e in run]
        counts.append(np.array([e.record.count for e in run], dtype=np.int64))
        sizes.append(np.array([e.positions.numel() for e in run], dtype=np.int64))
        listed = [
            p if p.is_cpu and p.dtype == torch.int64 else p.to("cpu", torch.int64)
            for e in run
            if (p := e.positions).numel()
        ]
        if listed:
            positions.append(torch.cat(listed).numpy())

    def joined(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)

    return _Columns(joined(ops), names, joined(counts), joined(sizes), joined(positions))


def _gaps(flat: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Every record's positions as gaps (``p[i] - p[i-1] - 1``, the first from -1), in one array:
    one subtraction for the whole chunk instead of one per record."""
    if not flat.size:
        return np.zeros(0, np.int64)
    prev = np.empty_like(flat)
    prev[0] = -1
    prev[1:] = flat[:-1]
    starts = np.cumsum(sizes) - sizes
    prev[starts[sizes > 0]] = -1  # each record's first position counts from -1
    return flat - prev - 1


__all__ = ["BUILD_LATER_MIN", "MAGIC", "RecordRows", "SparseCursor", "SparseRecord", "SparseStepLog"]
