"""Rounding-log chunks: trit packing, chunk encode/decode, damaged chunks, the cursor, chunk files."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import RoundingLogError
from game.merkle import MerkleTree
from game.training.roundlog import (
    MAGIC,
    ChunkFormatError,
    ChunkMismatchError,
    LogReader,
    LogRecord,
    LogSequenceError,
    LogWriter,
    MissingChunkError,
    StepLog,
    TritPackingError,
    decode_chunk,
    log_root,
    pack_trits,
    packed_size,
    unpack_trits,
)

SPEC = hashlib.sha256(b"task A").digest()
OTHER_SPEC = hashlib.sha256(b"task B").digest()


def ref_pack(trits: list[int]) -> bytes:
    """Obvious reference: groups of five, little-endian radix 3, zero-padded."""
    out = bytearray()
    for i in range(0, len(trits), 5):
        group = trits[i : i + 5] + [0] * (5 - len(trits[i : i + 5]))
        out.append(sum(t * 3**j for j, t in enumerate(group)))
    return bytes(out)


def _trits(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def _random_trits(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (n,), generator=gen, dtype=torch.uint8)


def _sample_log(seed: int = 0) -> StepLog:
    step_log = StepLog()
    step_log.append(0, "aten.mm.default", _random_trits(12, seed).reshape(3, 4))
    step_log.append(1, "aten.sum.dim_IntList", _random_trits(1, seed + 1))
    step_log.append(1, "aten.native_layer_norm.default", _random_trits(0, seed + 2))
    step_log.append(7, "aten._softmax.default", _random_trits(33, seed + 3))
    return step_log


# ---------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------


def test_pack_unpack_roundTrip_everyLengthUpTo200() -> None:
    for n in range(201):
        t = _random_trits(n, n)
        data = pack_trits(t)
        assert data == ref_pack(t.tolist())
        assert len(data) == packed_size(n) == -(-n // 5)
        assert torch.equal(unpack_trits(data, n), t)


@settings(max_examples=60, deadline=None)
@given(trits=st.lists(st.integers(0, 2), min_size=0, max_size=5000))
def test_pack_matchesReference_andRoundTrips(trits: list[int]) -> None:
    data = pack_trits(_trits(trits))
    assert data == ref_pack(trits)
    assert unpack_trits(data, len(trits)).tolist() == trits


def test_pack_ofAllOnes_andShapes() -> None:
    assert pack_trits(torch.ones(5, dtype=torch.uint8)) == bytes([121])
    assert pack_trits(torch.full((5,), 2, dtype=torch.uint8)) == bytes([242])
    t = _random_trits(24, 5).reshape(2, 3, 4)
    assert pack_trits(t) == pack_trits(t.reshape(-1))
    assert pack_trits(t.transpose(0, 2)) == pack_trits(t.transpose(0, 2).contiguous())


def test_pack_rejectsNonTrits() -> None:
    with pytest.raises(TritPackingError, match="trit 2 is 3"):
        pack_trits(_trits([0, 1, 3]))


@pytest.mark.parametrize(
    ("data", "count", "match"),
    [
        (b"", 1, "pack into 1 bytes, got 0"),
        (b"\x00\x00", 5, "pack into 1 bytes, got 2"),
        (b"\x00", 0, "pack into 0 bytes, got 1"),
        (bytes([243]), 5, "above 242"),
        (bytes([0, 255]), 10, "byte 1 is 255"),
        (bytes([3**3]), 3, "padding"),  # digit 3 set, only 3 trits declared
        (bytes([2 * 3**4]), 4, "padding"),
    ],
)
def test_unpack_rejectsBadBytes(data: bytes, count: int, match: str) -> None:
    with pytest.raises(TritPackingError, match=match):
        unpack_trits(data, count)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=20), extra=st.integers(-3, 3))
def test_unpack_neverAcceptsWrongLengths(data: bytes, extra: int) -> None:
    count = len(data) * 5 + extra * 5
    if packed_size(max(count, 0)) == len(data) or count < 0:
        return
    with pytest.raises(TritPackingError):
        unpack_trits(data, count)


# ---------------------------------------------------------------------------------------------------
# Chunks
# ---------------------------------------------------------------------------------------------------


def test_encodeDecode_roundTrip() -> None:
    step_log = _sample_log()
    data = step_log.encode(4, SPEC)
    assert data.startswith(MAGIC)
    back = StepLog.decode(data, step=4, spec_hash=SPEC)
    assert back.step == 4
    assert back.records == step_log.records
    assert back.records[0] == LogRecord(0, "aten.mm.default", 12)
    assert back.total_values == step_log.total_values == 46
    for i in range(len(step_log)):
        assert torch.equal(back.trits(i), step_log.trits(i))
    assert back.encode(4, SPEC) == data
    assert decode_chunk(data, SPEC).step == 4


def test_emptyLog_isAValidChunk() -> None:
    data = StepLog.empty().encode(0, SPEC)
    back = StepLog.decode(data, step=0, spec_hash=SPEC)
    assert back.records == () and back.total_values == 0
    back.cursor().finish()


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.text(max_size=20), st.lists(st.integers(0, 2), max_size=30)),
        max_size=8,
    ),
    step=st.integers(0, 2**64 - 1),
)
def test_encodeDecode_roundTrip_random(records: list[tuple[int, str, list[int]]], step: int) -> None:
    step_log = StepLog()
    for op_index, name, trits in records:
        step_log.append(op_index, name, _trits(trits))
    back = StepLog.decode(step_log.encode(step, SPEC), step=step, spec_hash=SPEC)
    assert back.records == tuple(LogRecord(i, n, len(t)) for i, n, t in records)
    assert [back.trits(i).tolist() for i in range(len(back))] == [t for _, _, t in records]


def test_reorderedChunk_isAnErrorNamingBothSteps() -> None:
    data = _sample_log().encode(3, SPEC)
    with pytest.raises(ChunkMismatchError, match=r"step 4: .*step 3 \(reordered"):
        StepLog.decode(data, step=4, spec_hash=SPEC)


def test_foreignChunk_isAnError() -> None:
    data = _sample_log().encode(3, OTHER_SPEC)
    with pytest.raises(ChunkMismatchError, match=r"step 3: .*foreign chunk"):
        StepLog.decode(data, step=3, spec_hash=SPEC)


def test_truncatedChunk_atEveryLength_isAnErrorNamingTheStep() -> None:
    data = _sample_log().encode(5, SPEC)
    for cut in range(len(data)):
        with pytest.raises(RoundingLogError, match=r"step [5?]"):
            StepLog.decode(data[:cut], step=5, spec_hash=SPEC)


def test_trailingBytes_isAnError() -> None:
    data = _sample_log().encode(5, SPEC)
    with pytest.raises(ChunkFormatError, match=r"step 5: 1 trailing bytes"):
        StepLog.decode(data + b"\x00", step=5, spec_hash=SPEC)


def test_everySingleByteFlip_changesTheHash_andNeverDecodesToTheSameLog() -> None:
    step_log = _sample_log()
    data = step_log.encode(5, SPEC)
    original = hashlib.sha256(data).digest()
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        assert hashlib.sha256(bytes(flipped)).digest() != original
        try:
            back = StepLog.decode(bytes(flipped), step=5, spec_hash=SPEC)
        except RoundingLogError as exc:
            assert "step" in str(exc)
            continue
        # A flip that still parses must show up in the records or the trits.
        same = back.records == step_log.records and all(
            torch.equal(back.trits(j), step_log.trits(j)) for j in range(len(step_log))
        )
        assert not same, f"flipping byte {i} decoded to the same log"


def test_structuralCorruption_givesClearErrors() -> None:
    data = bytearray(_sample_log().encode(5, SPEC))
    bad_magic = b"vgame-log-v2\0" + bytes(data[len(MAGIC) :])
    with pytest.raises(ChunkFormatError, match="bad magic or version"):
        StepLog.decode(bad_magic, step=5, spec_hash=SPEC)
    count_pos = len(MAGIC) + 8 + 32
    huge = bytearray(data)
    huge[count_pos : count_pos + 4] = struct.pack("<I", 2**32 - 1)
    with pytest.raises(ChunkFormatError, match="records cannot fit"):
        StepLog.decode(bytes(huge), step=5, spec_hash=SPEC)
    # The first record's count field made enormous: the trits cannot be there.
    name_len = len(b"aten.mm.default")
    first_count = count_pos + 4 + 4 + 2 + name_len
    big = bytearray(data)
    big[first_count : first_count + 8] = struct.pack("<Q", 2**60)
    with pytest.raises(ChunkFormatError, match="truncated"):
        StepLog.decode(bytes(big), step=5, spec_hash=SPEC)
    bad_trit = bytearray(data)
    bad_trit[-1] = 250
    with pytest.raises(ChunkFormatError, match="corrupt trit bytes"):
        StepLog.decode(bytes(bad_trit), step=5, spec_hash=SPEC)
    bad_name = bytearray(data)
    bad_name[count_pos + 4 + 4 + 2] = 0xFF
    with pytest.raises(ChunkFormatError, match=r"record 0 .*malformed name"):
        StepLog.decode(bytes(bad_name), step=5, spec_hash=SPEC)


def test_append_rejectsBadInput() -> None:
    step_log = StepLog(step=2)
    with pytest.raises(RoundingLogError, match=r"step 2: trits of op #0 aten\.mm"):
        step_log.append(0, "aten.mm", torch.zeros(3, dtype=torch.int64))
    with pytest.raises(RoundingLogError, match="uint32"):
        step_log.append(2**32, "aten.mm", torch.zeros(3, dtype=torch.uint8))
    step_log.append(0, "aten.mm", torch.full((3,), 5, dtype=torch.uint8))
    with pytest.raises(TritPackingError):
        step_log.encode(2, SPEC)
    with pytest.raises(RoundingLogError, match="32 bytes"):
        StepLog().encode(2, b"short")


# ---------------------------------------------------------------------------------------------------
# Cursor
# ---------------------------------------------------------------------------------------------------


def test_cursor_handsOutRecordsInOrder() -> None:
    step_log = StepLog.decode(_sample_log().encode(6, SPEC), step=6, spec_hash=SPEC)
    cur = step_log.cursor()
    for i, rec in enumerate(step_log.records):
        got = cur.take(rec.op_index, rec.op_name, rec.count)
        assert torch.equal(got, step_log.trits(i))
    assert cur.position == len(step_log)
    cur.finish()


def test_cursor_nameMismatch_namesStepAndOps() -> None:
    cur = StepLog.decode(_sample_log().encode(6, SPEC), step=6, spec_hash=SPEC).cursor()
    with pytest.raises(LogSequenceError, match=r"step 6: op #0 aten.addmm.default .*op #0 aten.mm.default"):
        cur.take(0, "aten.addmm.default", 12)


def test_cursor_indexMismatch_isAnError() -> None:
    cur = _sample_log().cursor()
    with pytest.raises(LogSequenceError, match=r"op #3 aten.mm.default does not match"):
        cur.take(3, "aten.mm.default", 12)


def test_cursor_countMismatch_isAnError() -> None:
    cur = _sample_log().cursor()
    with pytest.raises(
        LogSequenceError, match=r"op #0 aten.mm.default has 13 values but log record 0 has 12"
    ):
        cur.take(0, "aten.mm.default", 13)


def test_cursor_pastTheEnd_andUnreadRecords() -> None:
    step_log = StepLog(step=9)
    step_log.append(0, "aten.mm.default", _random_trits(4, 1))
    cur = step_log.cursor()
    with pytest.raises(LogSequenceError, match=r"step 9: 1 log records left unread.*aten.mm.default"):
        cur.finish()
    cur.take(0, "aten.mm.default", 4)
    with pytest.raises(LogSequenceError, match=r"step 9: op #1 aten.sum.default .*past the end"):
        cur.take(1, "aten.sum.default", 1)


# ---------------------------------------------------------------------------------------------------
# Files and the log root
# ---------------------------------------------------------------------------------------------------


def test_writerReader_roundTrip(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path / "log")
    hashes = []
    logs = [StepLog.empty(), _sample_log(1), _sample_log(2)]
    for step, step_log in enumerate(logs):
        hashes.append(writer.write_chunk(step, step_log, SPEC))
    reader = LogReader(tmp_path / "log", SPEC)
    assert reader.steps() == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [
        "step-000000000.bin",
        "step-000000001.bin",
        "step-000000002.bin",
    ]
    for step, step_log in enumerate(logs):
        assert reader.chunk_hash(step) == hashes[step]
        assert hashes[step] == hashlib.sha256(reader.chunk_path(step).read_bytes()).digest()
        back = reader.read(step)
        assert back.records == step_log.records
    assert log_root(hashes) == MerkleTree(hashes).root
    assert log_root(hashes) != log_root(hashes[::-1])


def test_reader_missingChunk_namesTheStep(tmp_path: Path) -> None:
    LogWriter(tmp_path).write_chunk(0, StepLog.empty(), SPEC)
    reader = LogReader(tmp_path, SPEC)
    with pytest.raises(MissingChunkError, match=r"step 1: log chunk step-000000001\.bin is missing"):
        reader.read(1)
    with pytest.raises(RoundingLogError):
        reader.chunk_hash(1)


def test_reader_chunkFileSwapped_isReordered(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    writer.write_chunk(3, _sample_log(), SPEC)
    (tmp_path / "step-000000003.bin").rename(tmp_path / "step-000000004.bin")
    with pytest.raises(ChunkMismatchError, match="reordered"):
        LogReader(tmp_path, SPEC).read(4)
    (tmp_path / "step-000000004.bin").rename(tmp_path / "step-000000003.bin")
    with pytest.raises(ChunkMismatchError, match=r"step 3: .*foreign"):
        LogReader(tmp_path, OTHER_SPEC).read(3)


def test_writer_truncateAfter_removesLaterChunks(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    for step in range(5):
        writer.write_chunk(step, StepLog.empty(), SPEC)
    (tmp_path / ".step-000000005.bin.tmp").write_bytes(b"partial")
    assert writer.truncate_after(2) == [3, 4]
    assert LogReader(tmp_path, SPEC).steps() == [0, 1, 2]
    assert not list(tmp_path.glob(".*.tmp"))
    writer.write_chunk(2, _sample_log(), SPEC)  # overwrite is atomic and allowed (resume)
    assert LogReader(tmp_path, SPEC).read(2).total_values == 46


def test_logRoot_needsAChunk() -> None:
    with pytest.raises(RoundingLogError):
        log_root([])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cudaTrits_encodeLikeCpu() -> None:
    cpu, gpu = StepLog(), StepLog()
    for i in range(3):
        t = _random_trits(1000 + i, i)
        cpu.append(i, "aten.mm.default", t)
        gpu.append(i, "aten.mm.default", t.cuda())
    assert gpu.encode(1, SPEC) == cpu.encode(1, SPEC)
