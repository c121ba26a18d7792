"""The transcript's chunk files: written atomically, read back checked, cut after a step on resume."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from game.chunkleaf import chunk_leaf
from game.errors import RoundingLogError
from game.merkle import MerkleTree
from game.training.log.chunks import ChunkMismatchError
from game.training.log.formats import log_root
from game.training.log.packed import StepLog
from game.training.transcript.files import LogReader, LogWriter, MissingChunkError
from tests.training.helpers import sample_packed_log, total_values, write_chunk

SPEC = hashlib.sha256(b"task A").digest()
OTHER_SPEC = hashlib.sha256(b"task B").digest()


# ---------------------------------------------------------------------------------------------------
# Chunk files
# ---------------------------------------------------------------------------------------------------


def test_writerReader_roundTrip(tmp_path: Path) -> None:
    hashes = []
    logs = [StepLog.empty(), sample_packed_log(1), sample_packed_log(2)]
    for step, step_log in enumerate(logs):
        hashes.append(write_chunk(tmp_path / "log", step, step_log, SPEC))
    reader = LogReader(tmp_path / "log", SPEC)
    assert reader.steps() == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [
        "step-000000000.bin",
        "step-000000001.bin",
        "step-000000002.bin",
    ]
    for step, step_log in enumerate(logs):
        assert reader.chunk_hash(step) == hashes[step]
        assert hashes[step] == chunk_leaf(reader.chunk_path(step).read_bytes())
        back = reader.read(step)
        assert back.records == step_log.records
    assert log_root(hashes) == MerkleTree(hashes).root
    assert log_root(hashes) != log_root(hashes[::-1])


def test_reader_missingChunk_namesTheStep(tmp_path: Path) -> None:
    write_chunk(tmp_path, 0, StepLog.empty(), SPEC)
    reader = LogReader(tmp_path, SPEC)
    with pytest.raises(MissingChunkError, match=r"step 1: log chunk step-000000001\.bin is missing"):
        reader.read(1)
    with pytest.raises(RoundingLogError):
        reader.chunk_hash(1)


def test_reader_chunkFileSwapped_isReordered(tmp_path: Path) -> None:
    write_chunk(tmp_path, 3, sample_packed_log(), SPEC)
    (tmp_path / "step-000000003.bin").rename(tmp_path / "step-000000004.bin")
    with pytest.raises(ChunkMismatchError, match="reordered"):
        LogReader(tmp_path, SPEC).read(4)
    (tmp_path / "step-000000004.bin").rename(tmp_path / "step-000000003.bin")
    with pytest.raises(ChunkMismatchError, match=r"step 3: .*foreign"):
        LogReader(tmp_path, OTHER_SPEC).read(3)


def test_writer_truncateAfter_removesLaterChunks(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    for step in range(5):
        write_chunk(tmp_path, step, StepLog.empty(), SPEC)
    (tmp_path / ".step-000000005.bin.tmp").write_bytes(b"partial")
    assert writer.truncate_after(2) == [3, 4]
    assert LogReader(tmp_path, SPEC).steps() == [0, 1, 2]
    assert not list(tmp_path.glob(".*.tmp"))
    write_chunk(tmp_path, 2, sample_packed_log(), SPEC)  # overwrite is atomic and allowed (resume)
    assert total_values(LogReader(tmp_path, SPEC).read(2)) == 296
