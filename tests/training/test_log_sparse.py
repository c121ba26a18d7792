"""The sparse chunk format: round trips, every codec, and clear errors on damaged chunks."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import RoundingLogError
from game.training.log import codec as codec_mod
from game.training.log import sparse as sparse_mod
from game.training.log.chunks import BuildLater, ChunkFormatError, ChunkMismatchError, LogSequenceError
from game.training.log.codec import CODECS, Malformed, uvarint_decode, uvarint_encode
from game.training.log.formats import decode_chunk
from game.training.log.sparse import SparseStepLog
from game.training.native import bindings, library
from tests.training.helpers import random_sparse_log, total_values

SPEC = bytes(range(32))


def _log(step: int = 3, codec: str = "auto", seed: int = 0, records: int = 6) -> SparseStepLog:
    return random_sparse_log(step, codec=codec, seed=seed, records=records)


def _same(a: SparseStepLog, b: SparseStepLog) -> bool:
    return a.records == b.records and all(
        torch.equal(x.positions, y.positions) for x, y in zip(a.entries(), b.entries(), strict=True)
    )


@pytest.mark.parametrize("codec", ["auto", "stored", "zlib", "lzma"])
def test_roundTrip_everyCodec(codec: str) -> None:
    log = _log(codec=codec)
    data = log.encode(3, SPEC)
    back = decode_chunk(data, SPEC, 3)
    assert isinstance(back, SparseStepLog) and _same(log, back)
    assert back.total_entries == log.total_entries and total_values(back) == total_values(log)


def test_auto_keepsTheSmallestEncoding() -> None:
    log = _log(seed=4)
    sizes = {}
    for codec in ("zlib", "lzma", "stored", "auto"):
        log.codec = codec
        sizes[codec] = len(log.encode(3, SPEC))
    assert sizes["auto"] == min(sizes["zlib"], sizes["lzma"], sizes["stored"])


def test_emptyLog_roundTrips() -> None:
    data = SparseStepLog(0).encode(0, SPEC)
    back = decode_chunk(data, SPEC, 0)
    assert isinstance(back, SparseStepLog) and len(back) == 0


def test_nonSequentialOpIndices_roundTrip() -> None:
    log = SparseStepLog(1)
    for i in (0, 2, 7):
        log.append(i, "aten.mm.default", 10, torch.tensor([1, 4]))
    back = decode_chunk(log.encode(1, SPEC), SPEC, 1)
    assert [r.op_index for r in back.records] == [0, 2, 7]


@pytest.mark.parametrize("cut", [1, 10, 40, 60])
def test_truncatedChunk_isAFormatError(cut: int) -> None:
    data = _log(codec="zlib").encode(3, SPEC)
    with pytest.raises(ChunkFormatError, match="step 3"):
        decode_chunk(data[:-cut], SPEC, 3)


def test_trailingBytes_areAFormatError() -> None:
    data = _log(codec="lzma").encode(3, SPEC)
    with pytest.raises(ChunkFormatError, match="trailing"):
        decode_chunk(data + b"\0", SPEC, 3)


def test_reorderedOrForeignChunk_isAMismatch() -> None:
    data = _log().encode(3, SPEC)
    with pytest.raises(ChunkMismatchError, match="reordered"):
        decode_chunk(data, SPEC, 4)
    with pytest.raises(ChunkMismatchError, match="foreign"):
        decode_chunk(data, bytes(32), 3)


def _with_payload(payload: bytes, n_records: int) -> bytes:
    header = struct.pack("<Q32sIBI", 3, SPEC, n_records, 1, len(payload))
    return sparse_mod.MAGIC + header + zlib.compress(payload)


def test_positionPastTheValueCount_isAFormatError() -> None:
    # names: 1 name "op"; record: gap 0, name 0, count 5, 1 entry; gap 9 -> position 9 >= 5
    payload = uvarint_encode(np.array([1, 2])) + b"op" + uvarint_encode(np.array([0, 0, 5, 1, 9]))
    with pytest.raises(ChunkFormatError, match="position 9 >= 5"):
        decode_chunk(_with_payload(payload, 1), SPEC, 3)


def test_positionPastTheValueCount_namesTheRecordsOpIndex() -> None:
    # ops #2 (1 entry, fine) and #7 (position 6 of 4 values): the error names record 1, op #7
    payload = uvarint_encode(np.array([1, 2])) + b"op"
    payload += uvarint_encode(np.array([2, 0, 5, 1, 4, 0, 4, 1, 4, 6]))
    with pytest.raises(ChunkFormatError, match=r"record 1 \(op #7\): position 6 >= 4 values"):
        decode_chunk(_with_payload(payload, 2), SPEC, 3)


@pytest.mark.parametrize(
    ("head", "bad"),
    [
        ([0, 1, 5, 0], 0),  # name id 1 of a one-name table
        ([3, 0, 5, 0, 2**32 - 4, 0, 5, 0], 1),  # op index 3, then 2^32: past uint32
        ([4, 0, 5, 0, 2**63 - 3, 0, 5, 0], 1),  # a running sum in int64 would wrap to a negative index
        ([0, 0, 5, 0, 2**62, 0, 5, 0, 2**62, 0, 5, 0, 2**62, 0, 5, 0], 1),
    ],
)
def test_opIndexOrNameIdOutOfRange_isAFormatError_atItsRecord(head: list[int], bad: int) -> None:
    payload = uvarint_encode(np.array([1, 2])) + b"op" + uvarint_encode(np.array(head))
    with pytest.raises(ChunkFormatError, match=f"record {bad}: op index or name id out of range"):
        decode_chunk(_with_payload(payload, len(head) // 4), SPEC, 3)


@pytest.mark.parametrize("n_records", [2, 2**32 - 1])
def test_aRecordCountThePayloadCannotHold_isAFormatError_beforeAnyArrayOfThatSize(
    n_records: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header's record count is the trainer's to write: 2^32 - 1 of them had the decoder ask
    for a 128 GiB table (a MemoryError, not a log error: an audit and a judge's ruling raised).
    Every record takes four bytes at least."""
    asked: list[int] = []
    empty = np.empty

    def counted(shape: object, *args: object, **kwargs: object) -> np.ndarray:
        asked.append(int(np.prod(shape)))
        return empty(shape, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(np, "empty", counted)
    payload = uvarint_encode(np.array([1, 2])) + b"op" + uvarint_encode(np.array([0, 0, 5, 1, 3]))
    with pytest.raises(ChunkFormatError, match=f"{n_records} records in the 5 bytes after the name table"):
        decode_chunk(_with_payload(payload, n_records), SPEC, 3)
    assert all(n < 1000 for n in asked)


def test_statedPayloadSizeMismatch_isAFormatError() -> None:
    payload = uvarint_encode(np.array([0]))
    data = sparse_mod.MAGIC + struct.pack("<Q32sIBI", 3, SPEC, 0, 1, 1000) + zlib.compress(payload)
    with pytest.raises(ChunkFormatError, match="header says 1000"):
        decode_chunk(data, SPEC, 3)


def test_decompressionBomb_isRefusedWithoutInflating() -> None:
    bomb = zlib.compress(b"\0" * (50 << 20))
    data = sparse_mod.MAGIC + struct.pack("<Q32sIBI", 3, SPEC, 0, 1, 16) + bomb
    with pytest.raises(ChunkFormatError, match="larger than its stated size"):
        decode_chunk(data, SPEC, 3)


def test_unknownCodec_isAFormatError() -> None:
    data = bytearray(_log(codec="stored").encode(3, SPEC))
    data[len(sparse_mod.MAGIC) + 8 + 32 + 4] = 9
    with pytest.raises(ChunkFormatError, match="unknown codec 9"):
        decode_chunk(bytes(data), SPEC, 3)


def test_cursor_checksOpNameCountAndOrder() -> None:
    log = _log(records=2)
    rec0, rec1 = log.records
    cur = log.cursor()
    with pytest.raises(LogSequenceError, match="does not match"):
        cur.take(0, "aten.other.default", rec0.count)
    cur = log.cursor()
    with pytest.raises(LogSequenceError, match="values"):
        cur.take(0, rec0.op_name, rec0.count + 1)
    cur = log.cursor()
    cur.take(0, rec0.op_name, rec0.count)
    with pytest.raises(LogSequenceError, match="left unread"):
        cur.finish()
    cur.take(1, rec1.op_name, rec1.count)
    cur.finish()
    with pytest.raises(LogSequenceError, match="past the end"):
        cur.take(2, rec1.op_name, rec1.count)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), max_size=50))
def test_uvarint_roundTrip(values: list[int]) -> None:
    data = uvarint_encode(np.array(values, dtype=np.int64))
    out, end = uvarint_decode(np.frombuffer(data, dtype=np.uint8), 0, len(values))
    assert out.tolist() == values and end == len(data)


def test_uvarint_rejectsOverlongForm() -> None:
    with pytest.raises(Malformed, match="shortest"):
        uvarint_decode(np.array([0x81, 0x00], dtype=np.uint8), 0, 1)


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.lists(st.integers(0, 5000), max_size=30).map(lambda v: sorted(set(v))), min_size=1, max_size=12
    ),
    codec=st.sampled_from(["auto", "stored", "zlib", "lzma"]),
)
def test_roundTrip_anyMixOfEmptyAndFullRecords(records: list[list[int]], codec: str) -> None:
    # gaps are computed for the whole chunk at once: empty records between full ones must not shift them
    log = SparseStepLog(4, codec=codec)
    for i, pos in enumerate(records):
        log.append(2 * i, f"aten.op{i % 3}.default", 5001, torch.tensor(pos, dtype=torch.int64))
    back = SparseStepLog.decode(log.encode(4, SPEC), step=4, spec_hash=SPEC)
    assert [e.positions.tolist() for e in back.entries()] == records
    assert [(e.record.op_index, e.record.op_name, e.record.count) for e in back.entries()] == [
        (2 * i, f"aten.op{i % 3}.default", 5001) for i in range(len(records))
    ]


def test_auto_skipsLzma_pastItsSizeLimit(monkeypatch: pytest.MonkeyPatch) -> None:
    # lzma is tried on small payloads only (it is ~10x slower than zlib); the chunk still decodes
    log = _log(records=30)
    codec_at = len(sparse_mod.MAGIC) + sparse_mod._HEADER.size - 5  # the codec byte precedes the size
    monkeypatch.setattr(codec_mod, "LZMA_AUTO_MAX", 0)
    data = log.encode(3, SPEC)
    assert data[codec_at] in (CODECS["zlib"], CODECS["stored"])
    assert _same(log, decode_chunk(data, SPEC, 3))


def test_hugeGaps_areAFormatError_notAWrappedPosition() -> None:
    """Gaps whose running sum would wrap int64 (and could land on a small, valid-looking position)
    are refused as a corrupt chunk."""
    log = SparseStepLog(3)
    log.append(0, "aten.mm.default", 2**62, torch.tensor([2**62 - 2]))
    log.append(1, "aten.mm.default", 2**62, torch.tensor([2**62 - 2]))
    log.append(2, "aten.mm.default", 2**62, torch.tensor([2**62 - 2]))
    data = log.encode(3, SPEC)
    with pytest.raises(ChunkFormatError, match="add up past"):
        decode_chunk(data, SPEC, 3)


# ---- records given as columns (the C++ front's) ------------------------------------------------

NAMES = ["aten.mm.default", "aten.addmm.default", "aten._softmax.default", "aten.gelu.default"]


def _as_rows(records: list[tuple[int, int, int, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """(op index, row, count, positions) records as the front's table and flat positions."""
    table = np.array([(i, row, count, len(pos)) for i, row, count, pos in records], dtype=np.int64).reshape(
        -1, 4
    )
    flat = np.array([p for *_, pos in records for p in pos], dtype=np.int64)
    return table, flat


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.integers(0, 3), st.lists(st.integers(0, 999), max_size=12).map(lambda v: sorted(set(v)))
        ),
        max_size=14,
    ),
    cuts=st.lists(st.integers(0, 14), max_size=4),
    singles=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_addRows_encodesAsTheSameRecordsAppendedOneByOne(
    records: list[tuple[int, list[int]]], cuts: list[int], singles: list[bool]
) -> None:
    # the log split into parts at ``cuts``, each part given as columns or one record at a time
    full = [(3 * i + 1, row, 1000, pos) for i, (row, pos) in enumerate(records)]
    one_by_one, mixed = SparseStepLog(5), SparseStepLog(5)
    for index, row, count, pos in full:
        one_by_one.append(index, NAMES[row], count, torch.tensor(pos, dtype=torch.int64))
    bounds = [0, *sorted({min(c, len(full)) for c in cuts}), len(full)]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        if singles[k % len(singles)]:
            for index, row, count, pos in full[a:b]:
                mixed.append(index, NAMES[row], count, torch.tensor(pos, dtype=torch.int64))
        else:
            mixed.add_rows(*_as_rows(full[a:b]), NAMES)
    assert len(mixed) == len(full)
    assert total_values(mixed) == total_values(one_by_one) and mixed.total_entries == one_by_one.total_entries
    assert mixed.encode(5, SPEC) == one_by_one.encode(5, SPEC)
    assert _same(mixed, one_by_one)  # and record by record, once asked for them


def test_addRows_recordsPopAndCursor_seeTheRecordsInOrder() -> None:
    log = SparseStepLog(2)
    log.append(0, NAMES[0], 10, torch.tensor([3]))
    log.add_rows(*_as_rows([(1, 2, 20, [0, 19]), (4, 1, 30, [])]), NAMES)
    assert [(r.op_index, r.op_name, r.count) for r in log.records] == [
        (0, NAMES[0], 10),
        (1, NAMES[2], 20),
        (4, NAMES[1], 30),
    ]
    cursor = log.cursor()
    assert cursor.take(0, NAMES[0], 10).positions.tolist() == [3]
    assert cursor.take(1, NAMES[2], 20).positions.tolist() == [0, 19]
    last = log.pop()
    assert last.record.op_index == 4 and last.positions.numel() == 0 and len(log) == 2
    log.append(5, NAMES[3], 7, torch.tensor([6]))  # appending after the records were asked for
    back = decode_chunk(log.encode(2, SPEC), SPEC, 2)
    assert [r.op_index for r in back.records] == [0, 1, 5]


@pytest.mark.parametrize(
    ("table", "flat", "match"),
    [
        (np.zeros((2, 3), np.int64), np.zeros(0, np.int64), "table"),
        (np.array([[0, 0, 10, 2]], np.int64), np.array([1], np.int64), "add up"),
        (np.array([[2**32, 0, 10, 0]], np.int64), np.zeros(0, np.int64), "op index 4294967296"),
        (np.array([[-1, 0, 10, 0]], np.int64), np.zeros(0, np.int64), "op index -1"),
        (np.array([[0, 4, 10, 0]], np.int64), np.zeros(0, np.int64), "row has no op name"),
    ],
)
def test_addRows_badColumns_areALogError(table: np.ndarray, flat: np.ndarray, match: str) -> None:
    log = SparseStepLog(7)
    with pytest.raises(RoundingLogError, match=match):
        log.add_rows(table, flat, NAMES)
    assert len(log) == 0


def test_decodedChunk_cursor_readsRecordsOnlyWhenOneIsTaken(monkeypatch: pytest.MonkeyPatch) -> None:
    # the C++ front moves the cursor without reading records: a decoded chunk stays columns until then
    log = _log(records=6)
    back = decode_chunk(log.encode(3, SPEC), SPEC, 3)
    assert isinstance(back, SparseStepLog)
    want = log.entries()[2]
    reads: list[int] = []
    real = SparseStepLog._records
    monkeypatch.setattr(SparseStepLog, "_records", lambda self: reads.append(1) or real(self))
    cursor = back.cursor()
    cursor.move_to(2)
    assert reads == [] and cursor.position == 2
    rec = want.record
    taken = cursor.take(rec.op_index, rec.op_name, rec.count)
    assert reads == [1] and torch.equal(taken.positions, want.positions)
    with pytest.raises(LogSequenceError, match="cursor moved from record 3 to 7 of 6"):
        cursor.move_to(7)
    with pytest.raises(LogSequenceError, match=r"3 log records left unread, first: record 3 \(op #3 "):
        cursor.finish()


def test_decodedChunk_cursorCheck_readsTheColumnsOnly_withTakesWords(monkeypatch: pytest.MonkeyPatch) -> None:
    # a deferring replay has a chunk's entries on the device: it checks each record against its op
    # from the columns, builds no record, and a mismatch is worded as take words it
    log = _log(records=4)
    data = log.encode(3, SPEC)
    reads: list[int] = []
    real = SparseStepLog._records
    monkeypatch.setattr(SparseStepLog, "_records", lambda self: reads.append(1) or real(self))
    recs = log.records

    def cursor() -> object:
        back = decode_chunk(data, SPEC, 3)
        assert isinstance(back, SparseStepLog)
        return back.cursor()

    for bad, words in (
        ((0, "aten.other.default", recs[0].count), "does not match log record 0"),
        ((1, recs[0].op_name, recs[0].count), "does not match log record 0"),
        ((0, recs[0].op_name, recs[0].count + 1), "values but log record 0 has"),
    ):
        for how in ("check", "take"):
            with pytest.raises(LogSequenceError, match=words):
                getattr(cursor(), how)(*bad)
    want = log.entries()[2].positions
    reads.clear()
    cur = cursor()
    assert [cur.check(r.op_index, r.op_name, r.count) for r in recs] == [0, 1, 2, 3]
    with pytest.raises(LogSequenceError, match="past the end"):
        cur.check(4, recs[0].op_name, recs[0].count)
    cur.finish()
    assert reads == [] and cur.position == 4
    assert torch.equal(cur.item(2).positions, want) and reads == [1]


# ---- the C parser of a chunk's records against the numpy one ------------------------------------


def _with_and_without_kernels(run: Callable[[], object]) -> tuple[object, object]:
    """What ``run`` gives with the C kernels, then with the numpy code alone."""
    fast = run()
    with library.disabled():
        slow = run()
    return fast, slow


def _parse_both(payload: bytes, n_records: int) -> tuple[object, object]:
    """What each parser makes of a payload: its table, positions and names, or its error."""

    def parse() -> object:
        try:
            rows = sparse_mod._parse_payload(payload, n_records)
        except Malformed as exc:
            return str(exc)
        return rows.table.tolist(), rows.positions.tolist(), list(rows.names)

    return _with_and_without_kernels(parse)


@settings(max_examples=80, deadline=None)
@given(
    records=st.lists(
        st.lists(st.integers(0, 3000), max_size=20).map(lambda v: sorted(set(v))), min_size=0, max_size=10
    ),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 3),
    extra=st.binary(max_size=2),
)
def test_cParser_acceptsAndReadsExactlyWhatTheNumpyParserDoes(
    records: list[list[int]], flips: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    # a valid payload, then damaged: bytes overwritten, cut short, or left over
    log = SparseStepLog(2, codec="stored")
    for i, pos in enumerate(records):
        log.append(3 * i, NAMES[i % 4], 3001, torch.tensor(pos, dtype=torch.int64))
    data = log.encode(2, SPEC)
    payload = bytearray(data[len(sparse_mod.MAGIC) + sparse_mod._HEADER.size :])
    fast, slow = _parse_both(bytes(payload), len(records))
    assert fast == slow and not isinstance(fast, str)
    for at, value in flips:
        if payload:
            payload[at % len(payload)] = value
    damaged = bytes(payload[: len(payload) - cut] if cut <= len(payload) else b"") + extra
    fast, slow = _parse_both(damaged, len(records))
    assert fast == slow


@pytest.mark.parametrize("gap", [2**62 - 4, 2**62 - 3, 2**62 - 2, 2**62 - 1, 2**62])
def test_cParser_andNumpy_drawTheGapSumLineAtTheSamePlace(gap: int) -> None:
    # two records of one entry each: the chunk's sum of (gap + 1) is gap + 1 + 1, refused from 2^62 on
    payload = codec_mod.encode_names(["aten.mm.default"]) + uvarint_encode(
        np.array([0, 0, 2**62, 1, 0, 0, 2**62, 1, gap, 0], dtype=np.int64)
    )
    fast, slow = _parse_both(payload, 2)
    assert fast == slow
    assert isinstance(fast, str) == (gap + 2 >= 2**62)


@pytest.mark.parametrize(("position", "refused"), [(9, False), (10, True), (11, True)])
def test_cParser_andNumpy_refuseAPositionFromItsRecordsCountOn(position: int, refused: bool) -> None:
    log = SparseStepLog(2, codec="stored")
    log.append(0, NAMES[0], 10, torch.tensor([1, position], dtype=torch.int64))
    payload = log.encode(2, SPEC)[len(sparse_mod.MAGIC) + sparse_mod._HEADER.size :]
    fast, slow = _parse_both(payload, 1)
    assert fast == slow
    assert isinstance(fast, str) == refused


# ---- the C encoder of a chunk's records against the numpy one -----------------------------------


def _encode_both(log: SparseStepLog) -> tuple[object, object]:
    """The chunk bytes each encoder writes, or its error."""

    def encode() -> object:
        try:
            return log.encode(5, SPEC)
        except RoundingLogError as exc:
            return str(exc)

    return _with_and_without_kernels(encode)


@settings(max_examples=80, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.integers(0, 2**20),  # op index gap
            st.integers(1, 2**40),  # value count
            st.lists(st.integers(0, 2**40), max_size=20).map(lambda v: sorted(set(v))),
        ),
        max_size=12,
    ),
    shuffle=st.integers(0, 3),
)
def test_cEncoder_writesExactlyWhatTheNumpyEncoderDoes(
    records: list[tuple[int, int, list[int]]], shuffle: int
) -> None:
    # large gaps and counts take every uvarint length; empty records sit between full ones
    log = SparseStepLog(5, codec="stored")
    op = -1
    for i, (gap, count, pos) in enumerate(records):
        op += gap + 1
        log.append(op, NAMES[(i * shuffle) % 4], count, torch.tensor(pos, dtype=torch.int64))
    fast, slow = _encode_both(log)
    assert fast == slow and isinstance(fast, bytes)
    if library.available():  # the bytes above came from the C encoder, not its numpy fallback
        table, _, positions = log.columns()
        assert bindings.sparse_body(table, positions) is not None


@pytest.mark.parametrize("bad", ["op index back", "op index repeated", "positions back", "position repeated"])
def test_cEncoder_refusesWhatTheNumpyEncoderRefuses(bad: str) -> None:
    ops = {"op index back": [4, 3], "op index repeated": [4, 4]}.get(bad, [3, 4])
    second = {"positions back": [7, 5], "position repeated": [5, 5]}.get(bad, [5, 7])
    log = SparseStepLog(5, codec="stored")
    log.append(ops[0], NAMES[0], 10, torch.tensor([1, 2], dtype=torch.int64))
    log.append(ops[1], NAMES[1], 10, torch.tensor(second, dtype=torch.int64))
    fast, slow = _encode_both(log)
    assert fast == slow and isinstance(fast, str) and "non-negative" in fast
    table, _, positions = log.columns()
    assert bindings.sparse_body(table, positions) is None
    # entry counts that do not add up to the positions given
    table[1, 3] += 1
    assert bindings.sparse_body(table, positions) is None


@pytest.mark.parametrize("later", [False, True], ids=["built when prepared", "built when asked"])
def test_preparedChunk_holdsThePayloadBuiltWhenPrepared_andItsStep(
    later: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the trainer's thread builds the payload, or for a large log leaves its columns to the writer's
    # thread to build it from; that thread finishes it later: records the log gains in between are
    # not in it, and it is refused as another step or task's chunk
    log = _log(step=3)
    if later:
        monkeypatch.setattr(sparse_mod, "BUILD_LATER_MIN", 1)
    expected = log.encode(3, SPEC)
    chunk = log.prepare(3, SPEC)
    assert isinstance(chunk._finish, BuildLater) == later
    log.append(50, NAMES[0], 10, torch.tensor([1, 2], dtype=torch.int64))
    assert log.encode(3, SPEC) != expected
    assert chunk.encode(3, SPEC) == expected
    with pytest.raises(RoundingLogError, match="prepared for step 3"):
        chunk.encode(4, SPEC)
    with pytest.raises(RoundingLogError, match="prepared for step 3"):
        chunk.encode(3, bytes(32))


def test_aLargeLog_leavesItsPayloadToTheThreadThatAsks_toTheSameBytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log of ``BUILD_LATER_MIN`` entries or more is built by whoever first asks for its payload
    (the writer's thread), once, to the bytes built at once; one whose payload could pass the size
    limit is built at once, so that the limit's error is the caller's."""
    log = _log(step=4, records=20)
    entries = log.total_entries
    eager = log.prepare(4, SPEC)
    assert isinstance(eager.compressible, codec_mod.Compressible)
    monkeypatch.setattr(sparse_mod, "BUILD_LATER_MIN", entries + 1)
    assert not isinstance(log.prepare(4, SPEC)._finish, BuildLater)  # below the threshold
    monkeypatch.setattr(sparse_mod, "BUILD_LATER_MIN", entries)
    built: list[int] = []
    real = SparseStepLog._compressible

    def counted(self: SparseStepLog, *a: object) -> codec_mod.Compressible:
        built.append(1)
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(SparseStepLog, "_compressible", counted)
    later = log.prepare(4, SPEC)
    assert built == []  # nothing built on the caller's thread
    assert later.compressible == eager.compressible and built == [1]
    assert later.encode(4, SPEC) == eager.encode(4, SPEC) and built == [1]  # built once
    monkeypatch.setattr(sparse_mod, "MAX_PAYLOAD", len(eager.compressible.payload))  # type: ignore[union-attr]
    assert not isinstance(log.prepare(4, SPEC)._finish, BuildLater)  # 9 bytes an entry could pass it
