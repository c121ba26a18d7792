"""The packed rounding log: trit packing, chunk encode/decode, damaged chunks, the cursor, the log root."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import RoundingLogError
from game.training.log.chunks import ChunkFormatError, ChunkMismatchError, LogRecord, LogSequenceError
from game.training.log.codec import Malformed, decode_names, encode_names
from game.training.log.formats import decode_chunk, log_root
from game.training.log.packed import MAGIC, MAGIC_V1, StepLog
from game.training.log.trits import (
    TritPackingError,
    pack_trits,
    pack_trits_v1,
    packed_size,
    packed_size_v1,
    unpack_trits,
    unpack_trits_v1,
)
from game.training.native import library
from tests.training.helpers import random_trits, sample_packed_log, total_values

SPEC = hashlib.sha256(b"task A").digest()
OTHER_SPEC = hashlib.sha256(b"task B").digest()


def ref_pack_v1(trits: list[int]) -> bytes:
    """Obvious reference: groups of five, little-endian radix 3, zero-padded."""
    out = bytearray()
    for i in range(0, len(trits), 5):
        group = trits[i : i + 5] + [0] * (5 - len(trits[i : i + 5]))
        out.append(sum(t * 3**j for j, t in enumerate(group)))
    return bytes(out)


def ref_pack(trits: list[int]) -> bytes:
    """Obvious reference for the v2 layout: per block of 116 the integer sum(g_k 2^(46 k)) with
    g_k = sum(t_i 3^i) over group k's 29 trits, as 23 little-endian bytes; the rest as in v1."""
    out = bytearray()
    whole = len(trits) // 116 * 116
    for b in range(0, whole, 116):
        block = trits[b : b + 116]
        groups = [sum(t * 3**i for i, t in enumerate(block[k * 29 : (k + 1) * 29])) for k in range(4)]
        out += sum(g << (46 * k) for k, g in enumerate(groups)).to_bytes(23, "little")
    return bytes(out) + ref_pack_v1(trits[whole:])


@pytest.fixture(params=["native", "numpy"])
def kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test with the C trit kernels and again with the numpy code."""
    if request.param == "numpy":
        with library.disabled():
            yield request.param
    else:
        yield request.param


def _trits(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


# ---------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------


def test_pack_unpack_roundTrip_everyLengthUpTo400(kernels: str) -> None:
    for n in range(401):
        t = random_trits(n, n)
        data = pack_trits(t)
        assert data == ref_pack(t.tolist())
        assert len(data) == packed_size(n) == n // 116 * 23 + -(-(n % 116) // 5)
        assert torch.equal(unpack_trits(data, n), t)


def test_v1Packing_isFivePerByte() -> None:
    for n in range(0, 260, 7):
        t = random_trits(n, n)
        data = pack_trits_v1(t)
        assert data == ref_pack_v1(t.tolist())
        assert len(data) == packed_size_v1(n) == -(-n // 5)
        assert torch.equal(unpack_trits_v1(data, n), t)


@settings(max_examples=60, deadline=None)
@given(trits=st.lists(st.integers(0, 2), min_size=0, max_size=5000))
def test_pack_matchesReference_andRoundTrips(trits: list[int]) -> None:
    data = pack_trits(_trits(trits))
    assert data == ref_pack(trits)
    assert unpack_trits(data, len(trits)).tolist() == trits
    with library.disabled():
        assert pack_trits(_trits(trits)) == data
        assert unpack_trits(data, len(trits)).tolist() == trits


def test_pack_costsUnder1point587BitsPerTrit_pastTheTail() -> None:
    # 23 bytes per 116 trits: 1.5862 bits each (log2 3 = 1.5850; the paper's 5 per byte is 1.6)
    n = 116 * 1000
    assert len(pack_trits(random_trits(n, 3))) * 8 / n == pytest.approx(184 / 116)
    assert 184 / 116 < 1.587


def test_pack_ofAllOnes_andShapes(kernels: str) -> None:
    assert pack_trits(torch.ones(5, dtype=torch.uint8)) == bytes([121])
    assert pack_trits(torch.full((5,), 2, dtype=torch.uint8)) == bytes([242])
    top = 3**29 - 1  # a group of 29 twos
    assert pack_trits(torch.full((116,), 2, dtype=torch.uint8)) == sum(
        top << (46 * k) for k in range(4)
    ).to_bytes(23, "little")
    t = random_trits(240, 5).reshape(2, 3, 40)
    assert pack_trits(t) == pack_trits(t.reshape(-1))
    assert pack_trits(t.transpose(0, 2)) == pack_trits(t.transpose(0, 2).contiguous())


def test_pack_rejectsNonTrits() -> None:
    with pytest.raises(TritPackingError, match="trit 2 is 3"):
        pack_trits(_trits([0, 1, 3]))
    with pytest.raises(TritPackingError, match="trit 200 is 7"):
        pack_trits(_trits([1] * 200 + [7]))


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
        (bytes(23) + bytes([0, 255]), 126, "byte 24 is 255"),  # the tail after a block
        (bytes(23) + bytes([3**3]), 119, "padding digits after trit 119"),
        (bytes([0xFF] * 6) + bytes(17), 116, r"group 0 \(block 0\) is above 3\^29 - 1"),
        (bytes(23) + bytes(22) + b"\xff", 232, r"group 7 \(block 1\)"),  # the top bits of group 3
    ],
)
def test_unpack_rejectsBadBytes(data: bytes, count: int, match: str, kernels: str) -> None:
    with pytest.raises(TritPackingError, match=match):
        unpack_trits(data, count)


def test_unpack_v1_rejectsBadBytes() -> None:
    with pytest.raises(TritPackingError, match="above 242"):
        unpack_trits_v1(bytes([0, 243]), 10)
    with pytest.raises(TritPackingError, match="pack into 24 bytes, got 23"):
        unpack_trits_v1(bytes(23), 116)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=60), extra=st.integers(-30, 30))
def test_unpack_neverAcceptsWrongLengths(data: bytes, extra: int) -> None:
    count = len(data) * 5 + extra * 5
    if count < 0 or packed_size(count) == len(data):
        return
    with pytest.raises(TritPackingError):
        unpack_trits(data, count)


# ---------------------------------------------------------------------------------------------------
# Chunks
# ---------------------------------------------------------------------------------------------------


def test_encodeDecode_roundTrip() -> None:
    step_log = sample_packed_log()
    data = step_log.encode(4, SPEC)
    assert data.startswith(MAGIC)
    back = StepLog.decode(data, step=4, spec_hash=SPEC)
    assert back.step == 4
    assert back.records == step_log.records
    assert back.records[0] == LogRecord(0, "aten.mm.default", 12)
    assert total_values(back) == total_values(step_log) == 296
    for i in range(len(step_log)):
        assert torch.equal(back.trits(i), step_log.trits(i))
    assert back.encode(4, SPEC) == data
    assert decode_chunk(data, SPEC).step == 4


@pytest.mark.parametrize("codec", ["stored", "zlib", "lzma", "auto"])
def test_v2Chunk_isSmallerThanV1_andAnyTableCodecDecodes(codec: str) -> None:
    step_log = sample_packed_log()
    step_log.codec = codec
    data = step_log.encode(4, SPEC)
    v1 = step_log.encode(4, SPEC, version=1)
    assert data.startswith(MAGIC) and v1.startswith(MAGIC_V1)
    assert len(data) < len(v1)
    back = decode_chunk(data, SPEC, 4)
    assert isinstance(back, StepLog) and back.codec == codec if codec != "auto" else True
    assert back.records == step_log.records


def test_v1Chunks_stillDecode_toTheSameLog() -> None:
    step_log = sample_packed_log()
    data = step_log.encode(4, SPEC, version=1)
    back = decode_chunk(data, SPEC, 4)
    assert isinstance(back, StepLog)
    assert back.records == step_log.records
    assert all(torch.equal(back.trits(i), step_log.trits(i)) for i in range(len(step_log)))
    assert back.encode(4, SPEC, version=1) == data
    with pytest.raises(RoundingLogError, match="layout 3"):
        step_log.encode(4, SPEC, version=3)


def test_encode_refusesOpIndicesThatDoNotIncrease() -> None:
    # the record table stores index gaps, so the order the interceptor gives them in is required
    step_log = StepLog()
    step_log.append(3, "aten.mm.default", random_trits(2, 0))
    step_log.append(3, "aten.add.Tensor", random_trits(2, 1))
    with pytest.raises(RoundingLogError, match=r"step 1: op #3 aten\.add\.Tensor follows op #3"):
        step_log.encode(1, SPEC)


def test_emptyLog_isAValidChunk() -> None:
    data = StepLog.empty().encode(0, SPEC)
    back = StepLog.decode(data, step=0, spec_hash=SPEC)
    assert back.records == () and total_values(back) == 0
    back.cursor().finish()


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.text(max_size=20), st.lists(st.integers(0, 2), max_size=300)),
        max_size=8,
        unique_by=lambda r: r[0],
    ).map(sorted),
    step=st.integers(0, 2**64 - 1),
    version=st.sampled_from([1, 2]),
)
def test_encodeDecode_roundTrip_random(
    records: list[tuple[int, str, list[int]]], step: int, version: int
) -> None:
    step_log = StepLog()
    for op_index, name, trits in records:
        step_log.append(op_index, name, _trits(trits))
    back = StepLog.decode(step_log.encode(step, SPEC, version=version), step=step, spec_hash=SPEC)
    assert back.records == tuple(LogRecord(i, n, len(t)) for i, n, t in records)
    assert [back.trits(i).tolist() for i in range(len(back))] == [t for _, _, t in records]


def test_reorderedChunk_isAnErrorNamingBothSteps() -> None:
    data = sample_packed_log().encode(3, SPEC)
    with pytest.raises(ChunkMismatchError, match=r"step 4: .*step 3 \(reordered"):
        StepLog.decode(data, step=4, spec_hash=SPEC)


def test_foreignChunk_isAnError() -> None:
    data = sample_packed_log().encode(3, OTHER_SPEC)
    with pytest.raises(ChunkMismatchError, match=r"step 3: .*foreign chunk"):
        StepLog.decode(data, step=3, spec_hash=SPEC)


@pytest.mark.parametrize("version", [1, 2])
def test_truncatedChunk_atEveryLength_isAnErrorNamingTheStep(version: int) -> None:
    data = sample_packed_log().encode(5, SPEC, version=version)
    for cut in range(len(data)):
        with pytest.raises(RoundingLogError, match=r"step [5?]"):
            StepLog.decode(data[:cut], step=5, spec_hash=SPEC)


@pytest.mark.parametrize("version", [1, 2])
def test_trailingBytes_isAnError(version: int) -> None:
    data = sample_packed_log().encode(5, SPEC, version=version)
    with pytest.raises(ChunkFormatError, match=r"step 5: 1 trailing bytes"):
        StepLog.decode(data + b"\x00", step=5, spec_hash=SPEC)


@pytest.mark.parametrize(("version", "codec"), [(1, "auto"), (2, "stored"), (2, "zlib")])
def test_everySingleByteFlip_changesTheHash_andNeverDecodesToTheSameLog(version: int, codec: str) -> None:
    step_log = sample_packed_log()
    step_log.codec = codec
    data = step_log.encode(5, SPEC, version=version)
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
    step_log = sample_packed_log()
    step_log.codec = "stored"  # the record table's bytes at known places
    data = bytearray(step_log.encode(5, SPEC))
    bad_magic = b"vgame-log-v9\0" + bytes(data[len(MAGIC) :])
    with pytest.raises(ChunkFormatError, match="bad magic or version"):
        StepLog.decode(bad_magic, step=5, spec_hash=SPEC)
    count_pos = len(MAGIC) + 8 + 32
    table_pos = count_pos + 4 + 1 + 4 + 4
    huge = bytearray(data)
    huge[count_pos : count_pos + 4] = struct.pack("<I", 2**32 - 1)
    with pytest.raises(ChunkFormatError, match="records cannot fit"):
        StepLog.decode(bytes(huge), step=5, spec_hash=SPEC)
    codec = bytearray(data)
    codec[count_pos + 4] = 7
    with pytest.raises(ChunkFormatError, match="corrupt record table: unknown codec 7"):
        StepLog.decode(bytes(codec), step=5, spec_hash=SPEC)
    stored = bytearray(data)
    stored[count_pos + 9 : count_pos + 13] = struct.pack("<I", 10**6)
    with pytest.raises(ChunkFormatError, match="truncated in its record table"):
        StepLog.decode(bytes(stored), step=5, spec_hash=SPEC)
    # The last record's count (250 = varint fa 01) made a varint that never ends: the table is short.
    table_size = struct.unpack_from("<I", data, count_pos + 5)[0]
    big = bytearray(data)
    end = table_pos + table_size
    assert big[end - 2 : end] == bytes([0xFA, 0x01])
    big[end - 2 : end] = bytes([0x80, 0x80])
    with pytest.raises(ChunkFormatError, match="corrupt record table: truncated"):
        StepLog.decode(bytes(big), step=5, spec_hash=SPEC)
    bad_trit = bytearray(data)
    bad_trit[-1] = 250
    with pytest.raises(ChunkFormatError, match="corrupt trit bytes"):
        StepLog.decode(bytes(bad_trit), step=5, spec_hash=SPEC)
    bad_group = bytearray(data)
    bad_group[table_pos + table_size : table_pos + table_size + 6] = b"\xff" * 6
    with pytest.raises(ChunkFormatError, match=r"corrupt trit bytes: group 0 \(block 0\)"):
        StepLog.decode(bytes(bad_group), step=5, spec_hash=SPEC)
    bad_name = bytearray(data)
    bad_name[table_pos + 2] = 0xFF  # names: count, length, then the first name's bytes
    with pytest.raises(ChunkFormatError, match="not UTF-8"):
        StepLog.decode(bytes(bad_name), step=5, spec_hash=SPEC)


def test_structuralCorruption_ofV1Chunks_givesClearErrors() -> None:
    data = bytearray(sample_packed_log().encode(5, SPEC, version=1))
    count_pos = len(MAGIC_V1) + 8 + 32
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
    step_log = StepLog.decode(sample_packed_log().encode(6, SPEC), step=6, spec_hash=SPEC)
    cur = step_log.cursor()
    for i, rec in enumerate(step_log.records):
        got = cur.take(rec.op_index, rec.op_name, rec.count)
        assert torch.equal(got, step_log.trits(i))
    assert cur.position == len(step_log)
    cur.finish()


def test_cursor_nameMismatch_namesStepAndOps() -> None:
    cur = StepLog.decode(sample_packed_log().encode(6, SPEC), step=6, spec_hash=SPEC).cursor()
    with pytest.raises(LogSequenceError, match=r"step 6: op #0 aten.addmm.default .*op #0 aten.mm.default"):
        cur.take(0, "aten.addmm.default", 12)


def test_cursor_indexMismatch_isAnError() -> None:
    cur = sample_packed_log().cursor()
    with pytest.raises(LogSequenceError, match=r"op #3 aten.mm.default does not match"):
        cur.take(3, "aten.mm.default", 12)


def test_cursor_countMismatch_isAnError() -> None:
    cur = sample_packed_log().cursor()
    with pytest.raises(
        LogSequenceError, match=r"op #0 aten.mm.default has 13 values but log record 0 has 12"
    ):
        cur.take(0, "aten.mm.default", 13)


def test_cursor_pastTheEnd_andUnreadRecords() -> None:
    step_log = StepLog(step=9)
    step_log.append(0, "aten.mm.default", random_trits(4, 1))
    cur = step_log.cursor()
    with pytest.raises(LogSequenceError, match=r"step 9: 1 log records left unread.*aten.mm.default"):
        cur.finish()
    cur.take(0, "aten.mm.default", 4)
    with pytest.raises(LogSequenceError, match=r"step 9: op #1 aten.sum.default .*past the end"):
        cur.take(1, "aten.sum.default", 1)


# ---------------------------------------------------------------------------------------------------
# The log root
# ---------------------------------------------------------------------------------------------------


def test_logRoot_needsAChunk() -> None:
    with pytest.raises(RoundingLogError):
        log_root([])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cudaTrits_encodeLikeCpu() -> None:
    cpu, gpu = StepLog(), StepLog()
    for i in range(3):
        t = random_trits(1000 + i, i)
        cpu.append(i, "aten.mm.default", t)
        gpu.append(i, "aten.mm.default", t.cuda())
    assert gpu.encode(1, SPEC) == cpu.encode(1, SPEC)


@pytest.mark.parametrize("names", [[], ["aten.mm.default"], ["a" * 127, "b" * 128, "c" * 20000, "é" * 90]])
def test_nameTable_roundTrips_withLengthsOfOneToThreeVarintBytes(names: list[str]) -> None:
    table = encode_names(names) + b"rest"
    got, pos = decode_names(np.frombuffer(table, dtype=np.uint8), 0, len(names))
    assert got == names and table[pos:] == b"rest"


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (b"\x02\x01a", "truncated"),  # two names, one there
        (b"\x01\x05ab", "truncated"),  # a name shorter than its length
        (b"\x01\x81", "truncated"),  # the length's varint cut off
        (b"\x01\x81\x00a", "shortest form"),
        (b"\x01" + b"\xff" * 9 + b"\x01", "longer than 9"),
        (b"\x03\x01a\x01b\x01c", "3 names for 2 records"),
    ],
)
def test_nameTable_refusesMalformedBytes(table: bytes, error: str) -> None:
    with pytest.raises(Malformed, match=error):
        decode_names(np.frombuffer(table, dtype=np.uint8), 0, 2)
