"""Going on with a parameter-server run whose driver died: where the transcript on disk leaves the
run, and the lost updates not yet in it.

The driver is the one process of a run that Ray does not restart: it holds the lineage and writes
the transcript. When it dies (a SIGKILL, the machine), the transcript keeps every update up to the
last one whose files reached the disk, and the same command goes on from there: the lineage is the
transcript's leaves, the micro-batches already applied are its chunks' (an asynchronous task's
entries name them), the servers start from the last state, rebuilt from a checkpoint and the log.

One thing is not in the transcript until the next update is: the updates a failover just lost,
which that update's entry lists. The driver keeps them in its home (:func:`keep_pending`) from the
failover until that update is on disk, and a run that goes on cuts the transcript back to the
failover's state and lists them as it would have.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from game.errors import TranscriptError
from game.fsio import atomic_write
from game.training.engine.scheduled import states_for
from game.training.engine.step import StepEngine
from game.training.log.formats import decode_scheduled
from game.training.log.schedule import LostUpdate, ScheduleEntry
from game.training.task.config import TaskConfig
from game.training.transcript.manifest import read_manifest
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)

PENDING_NAME = "lost-pending.json"


def keep_pending(home: Path, version: int, lost: list[LostUpdate]) -> None:
    """After a failover to state ``version``: the lost updates the next update's entry will list."""
    doc = {"version": version, "lost": [[x.update, x.leaf.hex()] for x in lost]}
    home.mkdir(parents=True, exist_ok=True)
    atomic_write(home / PENDING_NAME, json.dumps(doc).encode())


def drop_pending(home: Path) -> None:
    """The update that lists them is on disk."""
    (home / PENDING_NAME).unlink(missing_ok=True)


def read_pending(home: Path) -> tuple[int, list[LostUpdate]] | None:
    """What :func:`keep_pending` kept (None when nothing is pending)."""
    path = home / PENDING_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text("utf-8"))
        return int(doc["version"]), [LostUpdate(int(u), bytes.fromhex(leaf)) for u, leaf in doc["lost"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise TranscriptError(f"{path} is damaged ({exc}): delete the transcript and train again") from exc


@dataclass(frozen=True)
class Resumed:
    """Where a run goes on from: state ``step`` (its canonical bytes), the lineage's leaves up to
    it, the entries of updates ``1..step`` and the lost updates the next entry lists."""

    step: int
    leaves: list[bytes]
    entries: list[ScheduleEntry]
    state: bytes
    lost: list[LostUpdate]


def resume(
    out: Path, cfg: TaskConfig, profile: str, home: Path, engine: StepEngine
) -> tuple[TranscriptWriter, Resumed]:
    """Reopen the unfinished transcript at ``out`` (of this task, on this profile) and find where
    its run goes on; the transcript must hold step 0 at least."""
    manifest = read_manifest(out)
    if manifest.complete:
        raise TranscriptError(f"{out} already holds a finished transcript; choose another --out")
    if manifest.profile != profile:
        raise TranscriptError(
            f"{out} was started on profile {manifest.profile!r}, not {profile!r}: go on with "
            f"--profile {manifest.profile}, or train afresh in another --out"
        )
    pending = read_pending(home)
    writer = TranscriptWriter.resume(out, cfg, keep=None if pending is None else pending[0] + 1)
    k = writer.num_done - 1
    if k < 0:
        return writer, Resumed(-1, [], [], b"", [])
    writer.flush()
    t = Transcript(out)
    entries = []
    for u in range(1, k + 1):
        entry, _ = decode_scheduled(t.chunk_bytes(u), t.spec_hash, u)
        entries.append(entry if entry is not None else ScheduleEntry.sync(u, cfg.accumulate))
    _, found = states_for(t, engine, [k])
    log.info("going on from update %d of %s", k, out)
    return writer, Resumed(k, t.leaves()[: k + 1], entries, found[k], [] if pending is None else pending[1])


__all__ = ["PENDING_NAME", "Resumed", "drop_pending", "keep_pending", "read_pending", "resume"]
