"""The transcript's files of one kind each: the log directory's chunk files (one per step) and the
two hash files (32 bytes a step, appended).

Why apart from the writer and the reader: both use them, and a chunk file is read alone where no
whole transcript is at hand (a crash-resume cuts the chunks past the last leaf; a test writes a few).
"""

from __future__ import annotations

import logging
from pathlib import Path

from game.errors import RoundingLogError, TranscriptError
from game.fsio import fsync_dir, is_temp_name
from game.merkle import HASH_SIZE
from game.training.log.chunks import chunk_hash
from game.training.log.formats import ChunkLog, decode_chunk
from game.training.transcript.layout import chunk_file_name, chunk_file_step

log = logging.getLogger(__name__)


class MissingChunkError(RoundingLogError, FileNotFoundError):
    """No chunk file for a step."""


def read_hashes(path: Path, what: str) -> list[bytes]:
    """The 32-byte hashes of a hash file (leaves, chunk hashes); a cut-off last one is an error."""
    if not path.is_file():
        raise TranscriptError(f"{what} file {path} is missing; the transcript is incomplete or damaged")
    data = path.read_bytes()
    if len(data) % HASH_SIZE:
        raise TranscriptError(
            f"{path} holds {len(data)} bytes, not a multiple of {HASH_SIZE}: a step was cut off "
            "(resume training with the same --out to repair it)"
        )
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


class LogWriter:
    """The log directory's chunk files as a resumed run finds them (the transcript writer's thread
    writes one per step, atomically: :mod:`game.training.transcript.pipeline`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> list[int]:
        """Delete the chunks of steps after ``step`` (and stray tmp files) for crash-resume."""
        removed = []
        for path in self.directory.iterdir():
            own = chunk_file_step(path.name)
            if own is not None and own > step:
                path.unlink()
                removed.append(own)
            elif is_temp_name(path.name):
                path.unlink()
        if removed:
            fsync_dir(self.directory)
        return sorted(removed)


class LogReader:
    """Reads and checks the chunk files the transcript writer wrote for the task ``spec_hash``."""

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
        return sorted(s for p in self.directory.iterdir() if (s := chunk_file_step(p.name)) is not None)
