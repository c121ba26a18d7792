"""The two chunk formats side by side: which one a chunk is, a new log of a task's format, and the
log root over the chunks of a run.

Why here: the packed (:mod:`~game.training.log.packed`) and sparse (:mod:`~game.training.log.sparse`)
formats know nothing of each other; a caller that takes either (the transcript, the step engine, the
judge) asks this module, so no format imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeAlias

from game.errors import RoundingLogError
from game.merkle import merkle_root
from game.training.log import LOG_FORMATS
from game.training.log.chunks import EncodedChunk
from game.training.log.packed import StepLog
from game.training.log.schedule import ScheduledLog, ScheduleEntry, is_envelope, open_envelope
from game.training.log.sparse import MAGIC as SPARSE_MAGIC
from game.training.log.sparse import SparseStepLog

#: A decoded chunk of either format.
ChunkLog: TypeAlias = StepLog | SparseStepLog
#: What the transcript writer takes for a step: a log, a log with its schedule entry, or a chunk
#: another process encoded.
WritableChunk: TypeAlias = StepLog | SparseStepLog | ScheduledLog | EncodedChunk


def decode_chunk(data: bytes, spec_hash: bytes, step: int | None = None) -> ChunkLog:
    """Decode a chunk of either format (told apart by its magic); pass ``step`` wherever it is known,
    so a reordered chunk is caught. A schedule envelope gives the chunk inside it
    (:func:`decode_scheduled` gives its entry too)."""
    return decode_scheduled(data, spec_hash, step)[1]


def decode_scheduled(
    data: bytes, spec_hash: bytes, step: int | None = None
) -> tuple[ScheduleEntry | None, ChunkLog]:
    """A chunk's schedule entry (None for a plain chunk, :mod:`~game.training.log.schedule`) and
    its rounding log; the inner chunk of an envelope must name the envelope's step."""
    if is_envelope(data):
        entry, inner = open_envelope(bytes(data), step=step, spec_hash=spec_hash)
        return entry, _decode_plain(inner, spec_hash, entry.update)
    return None, _decode_plain(data, spec_hash, step)


def schedule_entry(data: bytes, spec_hash: bytes, step: int | None = None) -> ScheduleEntry | None:
    """A chunk's schedule entry (None for a plain chunk), its envelope checked as
    :func:`decode_scheduled` checks it, and the log inside left undecoded: who needs only the
    schedule (a replay without the log, a pass over every update's entry) neither pays for the
    log's decoding nor fails on a log that does not decode, which is the trainer's fault at that
    update alone."""
    if is_envelope(data):
        return open_envelope(bytes(data), step=step, spec_hash=spec_hash)[0]
    return None


def _decode_plain(data: bytes, spec_hash: bytes, step: int | None) -> ChunkLog:
    if bytes(data[: len(SPARSE_MAGIC)]) == SPARSE_MAGIC:
        return SparseStepLog.decode(data, step=step, spec_hash=spec_hash)
    return StepLog.decode(data, step=step, spec_hash=spec_hash)


def new_step_log(log_format: str, step: int | None) -> ChunkLog:
    """An empty log of the task's format for the trainer to record into."""
    if log_format == "sparse":
        return SparseStepLog(step)
    if log_format == "packed":
        return StepLog(step)
    raise RoundingLogError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")


def log_root(chunk_hashes: Sequence[bytes]) -> bytes:
    """Merkle root over the chunk hashes of steps ``0..S`` (the same tree as the state root)."""
    if not chunk_hashes:
        raise RoundingLogError("a log root needs at least the chunk of step 0")
    return merkle_root(chunk_hashes)


def bits_per_value(chunk_bytes: int, values: int) -> float:
    """Log size per logged value (the paper reports 1.6 for the packed baseline)."""
    return 8.0 * chunk_bytes / values if values else math.nan
