"""A trainer's transcript on disk: manifest, state leaves, rounding-log chunks and checkpoints.

Layout of a transcript directory (format ``vgame-transcript-v1``)::

    manifest.json               task config, spec hash, versions, profile, roots, ``complete`` flag
    leaves.bin                  32-byte state hashes; leaf i = state after step i (leaf 0 = init)
    chunk_hashes.bin            32-byte hashes of the log chunks of steps 0..S, same order
    log/                        one rounding-log chunk per step (named as ``roundlog.LogWriter`` names them)
    checkpoints/state-<step:09d>.bin   canonical state bytes at step 0, every k steps and the last

Crash safety: whole files are written to a temporary name, fsynced and renamed; the two append-only
files are fsynced after every step. A step is *complete* once its leaf is in ``leaves.bin``: the
leaf is written last, after the chunk, its hash and any checkpoint, so after a crash everything
past the last leaf is a partial step that :meth:`TranscriptWriter.resume` cuts away.

The writer does this on a thread of its own, in step order, so a trainer computes step ``n + 1``
while step ``n`` is compressed and synced (four fsyncs a step, milliseconds on a real disk, against a
small model's step of 10 ms); given the state's canonical bytes (:meth:`TranscriptWriter.append_state`)
it also hashes them there; given a state being hashed on its GPU (:meth:`TranscriptWriter.
append_pending`) it waits there for the leaf, and copies the bytes back only for a checkpoint. At most :data:`WRITE_AHEAD` steps wait while one is written; a step
is durable once :meth:`TranscriptWriter.flush` (or ``close``, ``finish``) returns. A crash loses at
most those steps, which a resumed run computes again.

A step's files go to disk in one C call (:func:`game.training.native.write_step`), which holds no
GIL: in Python they were some twenty calls, and the trainer's thread waited for the GIL after each.
A sparse chunk given with the state's bytes goes further in one C call
(:func:`game.training.native.stepwriter.finish_step`): compressed, hashed with the state and
written. Such steps go to a thread of that C library's own (:class:`~game.training.native.
stepwriter.Ring`), which never takes the GIL; the Python thread writes the others (a packed log, a
state given by its hash, or where the C library is not used). Each step goes to one of the two
only once the other has written every step before it, so the steps still land in order.

The judge, the agents and ``vgame audit`` read transcripts with this module. Its own code uses no
torch, but the chunk decoders and the kernels it calls (:mod:`game.training.roundlog`,
:mod:`game.training.native`) import it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import queue
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from game.errors import RoundingLogError, StepWriteError, TranscriptError
from game.fsio import append_fsync, atomic_write, fsync_dir, temp_file_name, truncate_fsync
from game.merkle import HASH_SIZE, merkle_root
from game.training import native
from game.training.native import stepwriter
from game.training.roundlog import (
    ChunkLog,
    LogReader,
    LogWriter,
    PreparedChunk,
    chunk_file_name,
    chunk_hash,
    decode_chunk,
)
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

FORMAT = "vgame-transcript-v1"
MANIFEST_NAME = "manifest.json"
LEAVES_NAME = "leaves.bin"
CHUNK_HASHES_NAME = "chunk_hashes.bin"
LOG_DIR_NAME = "log"
CHECKPOINT_DIR_NAME = "checkpoints"
_CHECKPOINT_RE = re.compile(r"^state-(\d{9})\.bin$")


# --------------------------------------------------------------------------------------------
# Small crash-safe file helpers
# --------------------------------------------------------------------------------------------


def _read_hashes(path: Path, what: str) -> list[bytes]:
    if not path.is_file():
        raise TranscriptError(f"{what} file {path} is missing; the transcript is incomplete or damaged")
    data = path.read_bytes()
    if len(data) % HASH_SIZE:
        raise TranscriptError(
            f"{path} holds {len(data)} bytes, not a multiple of {HASH_SIZE}: a step was cut off "
            "(resume training with the same --out to repair it)"
        )
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


def steps_on_disk(directory: Path) -> int:
    """How many steps of the transcript in ``directory`` are complete on disk (its whole leaves),
    read only: what a resumed run keeps. 0 when there is no transcript yet."""
    try:
        return (Path(directory) / LEAVES_NAME).stat().st_size // HASH_SIZE
    except FileNotFoundError:
        return 0


def software_versions() -> dict[str, str]:
    """Versions that went into a transcript: recorded for people, never part of any hash."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "vgame": version("vgame"),
        "torch": version("torch"),
        "python": platform.python_version(),
        "numpy": version("numpy"),
    }


def is_checkpoint_step(step: int, interval: int, steps: int) -> bool:
    """Checkpoints are kept at init, every ``interval`` steps and at the last step."""
    return step == 0 or step == steps or (interval > 0 and step % interval == 0)


def checkpoint_name(step: int) -> str:
    return f"state-{step:09d}.bin"


def checkpoint_step(relpath: str) -> int | None:
    """The step of the checkpoint at ``relpath`` (relative to the transcript, ``/``-separated, as
    a published archive names it); None for any other file."""
    folder, _, name = relpath.rpartition("/")
    m = _CHECKPOINT_RE.match(name)
    return int(m.group(1)) if m and folder == CHECKPOINT_DIR_NAME else None


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """The transcript's ``manifest.json``; roots are hex strings (``None`` until complete)."""

    config: dict[str, Any]
    spec_hash: str
    profile: str
    steps: int
    checkpoint_interval: int
    versions: dict[str, str] = field(default_factory=software_versions)
    state_root: str | None = None
    log_root: str | None = None
    complete: bool = False

    @property
    def num_leaves(self) -> int:
        """A run of ``S`` steps has ``S + 1`` leaves: leaf 0 is the initial state."""
        return self.steps + 1

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "config": self.config,
            "spec_hash": self.spec_hash,
            "versions": self.versions,
            "profile": self.profile,
            "steps": self.steps,
            "num_leaves": self.num_leaves,
            "state_root": self.state_root,
            "log_root": self.log_root,
            "checkpoint_interval": self.checkpoint_interval,
            "complete": self.complete,
        }
        return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> Manifest:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TranscriptError(f"{where} is not valid JSON ({exc}); the transcript is damaged") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else None
            raise TranscriptError(f"{where} has format {found!r}, expected {FORMAT!r}")
        try:
            manifest = cls(
                config=dict(doc["config"]),
                spec_hash=str(doc["spec_hash"]),
                profile=str(doc["profile"]),
                steps=int(doc["steps"]),
                checkpoint_interval=int(doc["checkpoint_interval"]),
                versions={str(k): str(v) for k, v in dict(doc["versions"]).items()},
                state_root=doc["state_root"],
                log_root=doc["log_root"],
                complete=bool(doc["complete"]),
            )
            num_leaves = int(doc["num_leaves"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TranscriptError(
                f"{where} lacks or mistypes field {exc}; the transcript is damaged"
            ) from None
        if num_leaves != manifest.num_leaves:
            raise TranscriptError(
                f"{where} says num_leaves={num_leaves} but steps={manifest.steps} needs {manifest.num_leaves}"
            )
        return manifest


def _config_of(manifest: Manifest, where: Path) -> TaskConfig:
    """Rebuild the task config and check it still hashes to the recorded spec hash."""
    try:
        cfg = TaskConfig.from_dict(manifest.config)
    except Exception as exc:
        raise TranscriptError(f"{where}: the recorded task config is invalid ({exc})") from exc
    if cfg.spec_hash().hex() != manifest.spec_hash:
        raise TranscriptError(
            f"{where}: the recorded config hashes to {cfg.spec_hash().hex()} but the manifest's spec_hash "
            f"is {manifest.spec_hash}: the config or the spec hash was edited"
        )
    if cfg.steps != manifest.steps or cfg.checkpoint_interval != manifest.checkpoint_interval:
        raise TranscriptError(f"{where}: steps or checkpoint_interval disagree with the recorded config")
    return cfg


def make_transcript_dir(directory: Path) -> None:
    """Make ``directory`` for a transcript (with its parents), or say in one line why it cannot be."""
    if directory.exists() and not directory.is_dir():
        raise TranscriptError(f"{directory} is a file, not a directory; choose another --out")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TranscriptError(f"cannot make the transcript directory {directory}: {exc}") from exc


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise TranscriptError(
            f"no transcript at {directory}: {MANIFEST_NAME} is missing (run `vgame train --out {directory}`)"
        )
    return Manifest.from_json(path.read_bytes(), path)


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


#: Steps that may wait for the writer's thread while it writes one (each holds its log chunk and, at
#: a checkpoint step, the state's bytes).
WRITE_AHEAD = 2


class PendingState(Protocol):
    """A state hashed where it lives (on a GPU: :class:`~game.training.state.device_leaf.DeviceLeaf`), its
    leaf not waited for yet."""

    def leaf(self) -> bytes:
        """The leaf (waits for the device)."""
        ...

    def canonical_bytes(self) -> Any:
        """The canonical bytes on the host, as a buffer (a checkpoint)."""
        ...


@dataclass(frozen=True)
class _StepJob:
    """One step for the writer's thread."""

    step: int
    state_hash: bytes | None  # None: the thread hashes ``state``, or waits for ``pending``
    chunk: PreparedChunk  # the step's log, its payload built on the caller's thread
    checkpoint: bytes | memoryview | None
    state: bytes | memoryview | None = None  # the canonical state bytes, for append_state
    pending: PendingState | None = None  # a state hashed on its device, for append_pending

    @property
    def finishable_in_c(self) -> bool:
        """Whether the C library can finish this step on its own: a sparse chunk and the state's
        bytes, which are the checkpoint too where one is due (as :meth:`TranscriptWriter.
        append_state` queues them)."""
        return (
            self.chunk.compressible is not None
            and self.state is not None
            and (self.checkpoint is None or self.checkpoint is self.state)
        )


class TranscriptWriter:
    """Appends one step at a time; :meth:`finish` writes the roots and marks the manifest complete.

    Steps are written by a thread of the writer's (module docstring): :meth:`append_step` returns
    once the step is queued. Use the writer as a context manager, or call :meth:`close`, so the
    queued steps reach the disk when the caller stops early; an error of the thread (a full disk)
    is raised by the next call.
    """

    def __init__(self, directory: Path, cfg: TaskConfig, manifest: Manifest, done: list[bytes]) -> None:
        self.directory = directory
        self.cfg = cfg
        self.spec_hash = cfg.spec_hash()
        self.manifest = manifest
        # Every accepted step, in order: its leaf once on disk, its job while the thread has it. The
        # caller's one ``append`` hands a step over; the thread puts the leaf in the job's place.
        self._leaves: list[bytes | _StepJob] = list(done)
        self._written = len(done)  # steps the thread is done with (written, or dropped after a failure)
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()  # to the thread: steps are waiting
        self._done: queue.SimpleQueue[None] = queue.SimpleQueue()  # from it, while the caller waits
        self._waiting = False  # whether the caller waits for ``_done``
        self._stop = False  # the thread returns once it has written every step
        self._thread: threading.Thread | None = None
        self._failure: TranscriptError | None = None  # set by the thread; later steps are dropped
        # Steps from ``_ring_base`` on go to the C library's thread, while ``_ring`` is not None
        # (the Python thread is idle then); ``_ring_off``: a step it could not write turned it off.
        self._ring: stepwriter.Ring | None = None
        self._ring_base = 0
        self._ring_off = False
        self._cut_short: int | None = None  # a step _write_here started and did not finish
        # the step's files' directories as the C calls take them, worked out once
        self._dir_bytes = tuple(
            os.fsencode(directory / name)
            for name in (LOG_DIR_NAME, CHECKPOINT_DIR_NAME, CHUNK_HASHES_NAME, LEAVES_NAME)
        )

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *rest: object
    ) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the caller's error is the one to see; the writer's is only logged
            self.close()
        except TranscriptError as failure:
            if failure is not exc:  # close raises the writer's one failure; once in flight, it is seen
                log.warning("%s", failure)

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, cfg: TaskConfig, profile: str) -> TranscriptWriter:
        """Start a new transcript in ``directory`` (created if missing; must hold no transcript)."""
        directory = Path(directory)
        if (directory / MANIFEST_NAME).exists():
            raise TranscriptError(f"{directory} already holds a transcript; choose another --out")
        make_transcript_dir(directory)
        try:
            (directory / LOG_DIR_NAME).mkdir(exist_ok=True)
            (directory / CHECKPOINT_DIR_NAME).mkdir(exist_ok=True)
        except OSError as exc:
            raise TranscriptError(f"cannot make the transcript directory {directory}: {exc}") from exc
        for name in (LEAVES_NAME, CHUNK_HASHES_NAME):
            atomic_write(directory / name, b"")
        manifest = Manifest(
            config=cfg.to_dict(),
            spec_hash=cfg.spec_hash().hex(),
            profile=profile,
            steps=cfg.steps,
            checkpoint_interval=cfg.checkpoint_interval,
        )
        atomic_write(directory / MANIFEST_NAME, manifest.to_json())
        log.info("new transcript at %s (%d steps, spec %s)", directory, cfg.steps, manifest.spec_hash[:16])
        return cls(directory, cfg, manifest, [])

    @classmethod
    def resume(cls, directory: Path, cfg: TaskConfig) -> TranscriptWriter:
        """Reopen an incomplete transcript of the same task, cutting away any partial last step."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        if manifest.spec_hash != cfg.spec_hash().hex():
            raise TranscriptError(
                f"{directory} holds a transcript of another task (spec {manifest.spec_hash[:16]}..., "
                f"this task is {cfg.spec_hash().hex()[:16]}...); choose another --out or delete it"
            )
        _config_of(manifest, directory / MANIFEST_NAME)
        leaves_path = directory / LEAVES_NAME
        hashes_path = directory / CHUNK_HASHES_NAME
        for p in (leaves_path, hashes_path):
            if not p.exists():
                atomic_write(p, b"")
        (directory / LOG_DIR_NAME).mkdir(exist_ok=True)
        (directory / CHECKPOINT_DIR_NAME).mkdir(exist_ok=True)
        n = min(steps_on_disk(directory), manifest.num_leaves)
        if hashes_path.stat().st_size < n * HASH_SIZE:
            raise TranscriptError(
                f"{hashes_path} has fewer chunk hashes than {leaves_path} has leaves: the transcript is damaged"
            )
        # Everything past the last complete leaf belongs to a step that was cut off.
        truncate_fsync(leaves_path, n * HASH_SIZE)
        truncate_fsync(hashes_path, n * HASH_SIZE)
        LogWriter(directory / LOG_DIR_NAME).truncate_after(n - 1)
        ckpt_dir = directory / CHECKPOINT_DIR_NAME
        for p in sorted(ckpt_dir.iterdir()):
            m = _CHECKPOINT_RE.match(p.name)
            if p.name.endswith(".tmp") or (m and int(m.group(1)) >= n):
                p.unlink()
        fsync_dir(ckpt_dir)
        leaves = _read_hashes(leaves_path, "leaves")
        manifest = replace(manifest, complete=False, state_root=None, log_root=None)
        atomic_write(directory / MANIFEST_NAME, manifest.to_json())
        log.info("resuming transcript at %s with %d of %d leaves", directory, n, manifest.num_leaves)
        return cls(directory, cfg, manifest, leaves)

    # -- writing ---------------------------------------------------------------------------

    @property
    def num_done(self) -> int:
        """Number of steps accepted, on disk or queued (the next step to append is ``num_done``)."""
        return len(self._leaves)

    @property
    def leaves(self) -> list[bytes]:
        """Every accepted step's leaf (waiting for the thread to hash those queued by
        :meth:`append_state`)."""
        if self._written < len(self._leaves):
            self.flush()
        return [leaf for leaf in self._leaves if isinstance(leaf, bytes)]

    def wants_checkpoint(self, step: int) -> bool:
        return is_checkpoint_step(step, self.cfg.checkpoint_interval, self.cfg.steps)

    def append_step(
        self, step: int, state_hash: bytes, step_log: ChunkLog, checkpoint: bytes | None = None
    ) -> None:
        """Queue step ``step``'s chunk, chunk hash, checkpoint (when due) and leaf for writing, in
        that order (the leaf last). Blocks while :data:`WRITE_AHEAD` steps wait.

        ``checkpoint`` must be the canonical state bytes when :meth:`wants_checkpoint` says so; they
        must hash to ``state_hash``. ``step_log`` and ``checkpoint`` belong to the writer from here.
        """
        if len(state_hash) != HASH_SIZE:
            raise TranscriptError(f"a state hash is {HASH_SIZE} bytes, got {len(state_hash)}")
        if self.wants_checkpoint(step):
            if checkpoint is None:
                raise TranscriptError(f"step {step} is a checkpoint step but no state bytes were given")
        else:
            checkpoint = None
        chunk = step_log.prepare(step, self.spec_hash)
        self._queue(_StepJob(step, bytes(state_hash), chunk, checkpoint))

    def append_state(self, step: int, state: bytes | memoryview, step_log: ChunkLog) -> None:
        """:meth:`append_step` with the step's canonical state bytes instead of their hash: the
        thread hashes them (the hash takes about a millisecond a megabyte, off the trainer's
        thread) and writes them as the checkpoint when one is due. ``state`` belongs to the writer
        from here and must not change. A sparse log's payload is built here, on the caller's
        thread (:class:`~game.training.roundlog.PreparedChunk`); the thread compresses it."""
        checkpoint = state if self.wants_checkpoint(step) else None
        chunk = step_log.prepare(step, self.spec_hash)
        self._queue(_StepJob(step, None, chunk, checkpoint, state))

    def append_pending(self, step: int, pending: PendingState, step_log: ChunkLog) -> None:
        """:meth:`append_step` for a state being hashed on its GPU: the thread waits for the leaf
        (and copies the canonical bytes to the host when a checkpoint is due) while the caller runs
        the next step. ``pending`` belongs to the writer from here."""
        chunk = step_log.prepare(step, self.spec_hash)
        self._queue(_StepJob(step, None, chunk, None, pending=pending))

    def _queue(self, job: _StepJob) -> None:
        """Hand ``job`` to the thread: one ``list.append``, which a Ctrl-C cannot cut in half, and no
        lock held across Python code (a ``queue.Queue``'s could be left held by a KeyboardInterrupt
        and hang ``close``). Waits while :data:`WRITE_AHEAD` steps wait."""
        self._raise_failure()
        if job.step != self.num_done:
            raise TranscriptError(
                f"steps are written in order: expected step {self.num_done}, got {job.step}"
            )
        if job.step > self.cfg.steps:
            raise TranscriptError(f"step {job.step} is past the task's last step {self.cfg.steps}")
        if self._to_ring(job):
            return
        if self._ring is not None:  # its steps first
            self._close_ring()
            self._raise_failure()
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._write_steps, name="vgame-transcript", daemon=True)
            self._thread.start()
        self._wait_until(len(self._leaves) - WRITE_AHEAD)  # one being written, WRITE_AHEAD waiting
        self._leaves.append(job)
        self._wake.put(None)

    def _to_ring(self, job: _StepJob) -> bool:
        """Hand ``job`` to the C library's thread, when it can take it; whether it did."""
        if self._ring_off or not job.finishable_in_c:
            return False
        if self._ring is None:
            if not stepwriter.available():
                return False
            self._stop_thread()  # the Python thread's steps first; it is not there while the ring is
            self._raise_failure()
            self._ring = stepwriter.Ring.start()
            if self._ring is None:  # no thread could be started: the Python thread from here on
                self._ring_off = True
                return False
            self._ring_base = len(self._leaves)
        self._wait_until(len(self._leaves) - WRITE_AHEAD)  # one being written, WRITE_AHEAD waiting
        self._leaves.append(job)
        self._announce()
        return True

    def _announce(self) -> None:
        """Push to the ring the steps appended but not pushed yet (one, or none after a Ctrl-C
        between the two)."""
        ring = self._ring
        assert ring is not None
        for index in range(ring.pushed + self._ring_base, len(self._leaves)):
            job = self._leaves[index]
            assert isinstance(job, _StepJob) and job.chunk.compressible is not None and job.state is not None
            if self._failure is not None or self._ring_off:
                return  # _collect drops them, or writes them in Python
            try:
                job.chunk.check_for(job.step, self.spec_hash)
                paths = self._step_paths(job.step, job.checkpoint is not None)
            except Exception as exc:  # as the thread would have met it: the step fails
                self._fail(job.step, exc)
                return
            ring.push(job.chunk.compressible, job.state, paths)

    def _collect(self, written: int) -> None:
        """Wait (without the GIL) until the ring has done ``written`` steps, and take their leaves.
        Each step's result is read by its index, so a Ctrl-C that cuts this short loses nothing:
        the next call takes up from ``_written``."""
        ring = self._ring
        assert ring is not None
        self._announce()
        done = ring.done()
        if done + self._ring_base < written:
            done = ring.wait(written - self._ring_base)
        while self._written < min(written, len(self._leaves)):
            index = self._written - self._ring_base
            if index >= done:  # not pushed: after a failure, dropped; else written here, in Python
                job = self._leaves[self._written]
                assert isinstance(job, _StepJob)
                if self._failure is None:
                    self._ring_off = True  # no later step may go to the ring past this one
                    self._write_here(job)
                self._written += 1
                continue
            result = ring.result(index)
            if isinstance(result, bytes):
                self._leaves[self._written] = result
            elif self._failure is None:
                job = self._leaves[self._written]
                assert isinstance(job, _StepJob)
                if result is None:  # the C call could not compress or hash it: Python can
                    self._ring_off = True
                    self._write_here(job)
                else:
                    self._fail(job.step, result)
            self._written += 1
            ring.release(index + 1)

    def _write_here(self, job: _StepJob) -> None:
        """Write ``job`` on the caller's thread, as the Python thread would. A Ctrl-C may cut that
        short, with some of the step's files written: then the step is not written again (a second
        chunk hash would land), it fails, and a resumed run cuts the partial step away."""
        if self._cut_short == job.step:
            self._fail(job.step, InterruptedError("interrupted while its files were written"))
            return
        self._cut_short = job.step
        try:
            self._write(job, in_c=False)
        except Exception as exc:
            self._fail(job.step, exc)
        self._cut_short = None

    def _fail(self, step: int, exc: BaseException) -> None:
        failure = StepWriteError(f"writing step {step} to {self.directory} failed: {exc}", step)
        failure.__cause__ = exc
        self._failure = failure

    def _close_ring(self) -> None:
        """Take every step from the ring and stop its thread."""
        assert self._ring is not None
        self._collect(len(self._leaves))
        self._ring.close()
        self._ring = None

    def _wait_until(self, written: int) -> None:
        """Block until the thread is done with ``written`` steps (a Ctrl-C comes out of the wait
        with nothing held)."""
        if self._written >= written:
            return
        if self._ring is not None:
            self._collect(written)
            return
        self._waiting = True  # before the check: the thread tells every step it is done with now
        try:
            while self._written < written:
                self._done.get()
        finally:
            self._waiting = False

    def flush(self) -> None:
        """Wait until every queued step is on disk; raise the thread's error if one failed."""
        if self._ring is not None:
            self._collect(len(self._leaves))
        elif self._thread is not None:
            self._wake.put(None)  # a step appended but not yet announced (a Ctrl-C between the two)
            self._wait_until(len(self._leaves))
        self._raise_failure()

    def close(self) -> None:
        """Write the queued steps and stop the thread (the writer takes more steps afterwards)."""
        if self._ring is not None:
            self._close_ring()
        self._stop_thread()
        self._raise_failure()

    def _stop_thread(self) -> None:
        """Let the Python thread write its steps, and stop it."""
        if self._thread is not None:
            self._stop = True
            self._wake.put(None)
            self._thread.join()
            self._thread = None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _write_steps(self) -> None:
        """The thread: write the steps in order until told to stop with none left; after a failure,
        drop the rest (a later step's leaf must never land after a missing one)."""
        while True:
            self._wake.get()
            while self._written < len(self._leaves):
                job = self._leaves[self._written]
                assert isinstance(job, _StepJob)  # a step's leaf replaces its job only here
                try:
                    if self._failure is None:
                        self._write(job)
                except Exception as exc:  # handed to the caller's thread
                    self._fail(job.step, exc)
                finally:
                    self._written += 1
                    if self._waiting:
                        self._done.put(None)
            if self._stop:
                return

    def _write(self, job: _StepJob, *, in_c: bool = True) -> None:
        """Write ``job``'s files: in one C call where it can (``in_c``), else the chunk encoded here
        and the files by :meth:`_put_files`."""
        step = job.step
        compressible, state = job.chunk.compressible, job.state
        if in_c and job.finishable_in_c and stepwriter.available():
            assert compressible is not None and state is not None
            job.chunk.check_for(step, self.spec_hash)
            paths = self._step_paths(step, job.checkpoint is not None)
            written = stepwriter.finish_step(compressible, state, paths)
            if written is not None:
                self._leaves[step] = written
                return
        chunk = job.chunk.encode(step, self.spec_hash)
        leaf, checkpoint = job.state_hash, job.checkpoint
        if job.pending is not None:
            leaf = job.pending.leaf()
            if self.wants_checkpoint(step):
                checkpoint = memoryview(job.pending.canonical_bytes()).cast("B")
                if stepwriter.leaf(checkpoint) != leaf:  # the bytes the judge will hash, held to the leaf
                    raise TranscriptError(f"checkpoint bytes of step {step} do not hash to its state hash")
        elif leaf is None:
            assert job.state is not None
            leaf = stepwriter.leaf(job.state)
        elif job.checkpoint is not None and stepwriter.leaf(job.checkpoint) != leaf:
            raise TranscriptError(f"checkpoint bytes of step {step} do not hash to its state hash")
        self._put_files(step, chunk, checkpoint, leaf)
        self._leaves[step] = leaf

    def _step_paths(self, step: int, checkpoint: bool) -> stepwriter.StepPaths:
        """A step's files for :func:`stepwriter.finish_step`, named as :meth:`_put_files` names them
        (joined by hand: ``os.path.join`` costs the trainer's thread several times more)."""
        log_dir, ckpt_dir, hashes, leaves = self._dir_bytes
        sep = os.sep.encode()
        name = chunk_file_name(step)
        chunk, chunk_tmp = (log_dir + sep + os.fsencode(n) for n in (name, temp_file_name(name)))
        if not checkpoint:
            return stepwriter.StepPaths(chunk, chunk_tmp, log_dir, hashes, None, None, None, leaves)
        ckpt = checkpoint_name(step)
        ckpt_path, ckpt_tmp = (ckpt_dir + sep + os.fsencode(n) for n in (ckpt, temp_file_name(ckpt)))
        return stepwriter.StepPaths(chunk, chunk_tmp, log_dir, hashes, ckpt_path, ckpt_tmp, ckpt_dir, leaves)

    def _put_files(self, step: int, chunk: bytes, checkpoint: bytes | memoryview | None, leaf: bytes) -> None:
        """The step's files, in the order of the module docstring, the leaf last: it is what marks
        the step complete. In one C call where the kernels run (no GIL held, so the trainer's thread
        does not wait for the GIL after each file call), else the same moves in Python."""
        chunk_path = self.directory / LOG_DIR_NAME / chunk_file_name(step)
        ckpt_path = (
            None if checkpoint is None else self.directory / CHECKPOINT_DIR_NAME / checkpoint_name(step)
        )
        hashes_path, leaves_path = self.directory / CHUNK_HASHES_NAME, self.directory / LEAVES_NAME
        hashed = chunk_hash(chunk)
        if native.write_step(
            chunk_path, chunk, hashes_path, hashed, ckpt_path, checkpoint, leaves_path, leaf
        ):
            return
        atomic_write(chunk_path, chunk)
        append_fsync(hashes_path, hashed)
        if ckpt_path is not None:
            assert checkpoint is not None
            atomic_write(ckpt_path, checkpoint)
        append_fsync(leaves_path, leaf)

    def finish(self) -> Manifest:
        """Write the queued steps, compute both roots, check every step is there, and mark the
        manifest complete."""
        self.close()
        if self.num_done != self.manifest.num_leaves:
            raise TranscriptError(
                f"cannot finish: {self.num_done} of {self.manifest.num_leaves} leaves written"
            )
        hashes = _read_hashes(self.directory / CHUNK_HASHES_NAME, "chunk hashes")
        self.manifest = replace(
            self.manifest,
            state_root=merkle_root(self.leaves).hex(),
            log_root=merkle_root(hashes).hex(),
            complete=True,
        )
        atomic_write(self.directory / MANIFEST_NAME, self.manifest.to_json())
        return self.manifest


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


class Transcript:
    """Read access to a transcript directory, with the checks an auditor or judge needs."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            what = "is a file, not a directory" if self.directory.exists() else "does not exist"
            raise TranscriptError(
                f"transcript directory {self.directory} {what} (pass the --out of `vgame train`)"
            )
        self.manifest = read_manifest(self.directory)
        self.config = _config_of(self.manifest, self.directory / MANIFEST_NAME)
        self.spec_hash = self.config.spec_hash()
        self._leaves: list[bytes] | None = None
        self._chunk_hashes: list[bytes] | None = None
        self._reader = LogReader(self.directory / LOG_DIR_NAME, self.spec_hash)

    @property
    def steps(self) -> int:
        return self.manifest.steps

    @property
    def profile(self) -> str:
        return self.manifest.profile

    def _leaf_list(self) -> list[bytes]:
        if self._leaves is None:
            self._leaves = _read_hashes(self.directory / LEAVES_NAME, "leaves")
        return self._leaves

    def _chunk_hash_list(self) -> list[bytes]:
        if self._chunk_hashes is None:
            self._chunk_hashes = _read_hashes(self.directory / CHUNK_HASHES_NAME, "chunk hashes")
        return self._chunk_hashes

    def leaves(self) -> list[bytes]:
        return list(self._leaf_list())

    def leaf(self, step: int) -> bytes:
        leaves = self._leaf_list()  # not a copy: an audit asks once a step
        if not 0 <= step < len(leaves):
            raise TranscriptError(
                f"step {step} is out of range: the transcript has leaves for steps 0..{len(leaves) - 1}"
            )
        return leaves[step]

    def chunk_hashes(self) -> list[bytes]:
        return list(self._chunk_hash_list())

    def read_log(self, step: int) -> ChunkLog:
        """The rounding log of ``step``, checked against its recorded chunk hash.

        A chunk that matches its hash but does not decode raises RoundingLogError: that is the
        trainer's fault at that step, not a damaged transcript.
        """
        return decode_chunk(self.chunk_bytes(step), self.spec_hash, step)

    def chunk_bytes(self, step: int) -> bytes:
        """The raw chunk of ``step``, checked against its recorded chunk hash (what the judge gets).
        The bytes checked are the bytes returned: the file is read once."""
        return self._checked_chunk(step)

    def chunk_path(self, step: int) -> Path:
        """Path of the chunk file of ``step`` (what the judge is handed)."""
        return Path(self._reader.chunk_path(step))

    def _checked_chunk(self, step: int) -> bytes:
        hashes = self._chunk_hash_list()
        if not 0 <= step < len(hashes):
            raise TranscriptError(f"no log chunk for step {step}: the transcript has {len(hashes)} chunks")
        try:
            data = self._reader.read_bytes(step)
        except (RoundingLogError, OSError) as exc:
            raise TranscriptError(f"log chunk of step {step} in {self.directory} is unusable: {exc}") from exc
        actual = chunk_hash(data)
        if actual != hashes[step]:
            raise TranscriptError(
                f"log chunk of step {step} hashes to {actual.hex()[:16]}..., but {CHUNK_HASHES_NAME} "
                f"records {hashes[step].hex()[:16]}...: the chunk was altered"
            )
        return data

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_steps(self) -> list[int]:
        ckpt_dir = self.directory / CHECKPOINT_DIR_NAME
        if not ckpt_dir.is_dir():
            return []
        steps = []
        for p in ckpt_dir.iterdir():
            m = _CHECKPOINT_RE.match(p.name)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def nearest_checkpoint(self, step: int) -> int:
        """The latest checkpoint at or before ``step``."""
        usable = [s for s in self.checkpoint_steps() if s <= step]
        if not usable:
            raise TranscriptError(f"no checkpoint at or before step {step} in {self.directory}")
        return usable[-1]

    def load_checkpoint(self, step: int) -> bytes:
        """Canonical state bytes at ``step``, verified against leaf ``step``."""
        path = self.directory / CHECKPOINT_DIR_NAME / checkpoint_name(step)
        if not path.is_file():
            raise TranscriptError(f"no checkpoint for step {step} in {self.directory}")
        data = path.read_bytes()
        if stepwriter.leaf(data) != self.leaf(step):
            raise TranscriptError(f"checkpoint {path.name} does not hash to leaf {step}: it was altered")
        return data

    # -- whole-transcript checks -----------------------------------------------------------

    def verify(self, *, check_chunks: bool = True) -> None:
        """Check counts and both roots (and every chunk against its hash); raise on the first problem."""
        m = self.manifest
        if not m.complete:
            raise TranscriptError(
                f"{self.directory} is an unfinished transcript; resume `vgame train` with the same --out"
            )
        leaves = self.leaves()
        if len(leaves) != m.num_leaves:
            raise TranscriptError(
                f"{LEAVES_NAME} holds {len(leaves)} leaves, the manifest says {m.num_leaves}"
            )
        if merkle_root(leaves).hex() != m.state_root:
            raise TranscriptError(
                f"the state root recomputed from {LEAVES_NAME} differs from the manifest's: a leaf was altered"
            )
        hashes = self.chunk_hashes()
        if len(hashes) != m.num_leaves:
            raise TranscriptError(
                f"{CHUNK_HASHES_NAME} holds {len(hashes)} hashes, the manifest says {m.num_leaves}"
            )
        if merkle_root(hashes).hex() != m.log_root:
            raise TranscriptError(
                f"the log root recomputed from {CHUNK_HASHES_NAME} differs from the manifest's"
            )
        if check_chunks:
            for step in range(m.num_leaves):
                self._checked_chunk(step)

    def iter_logs(self, start: int = 0) -> Iterator[tuple[int, ChunkLog]]:
        for step in range(start, len(self.chunk_hashes())):
            yield step, self.read_log(step)
