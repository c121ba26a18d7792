"""A trainer's transcript written: started (or resumed after a crash), one step appended at a time
(log chunk, chunk hash, checkpoint when due, leaf), and finished with both roots.

The files are those of :mod:`~game.training.transcript.layout`. Crash safety: whole files are
written to a temporary name, fsynced and renamed; the two append-only files are fsynced after every
step. A step is *complete* once its leaf is in the leaves file: the leaf is written last, after the
chunk, its hash and any checkpoint, so after a crash everything past the last leaf is a partial step
that :meth:`TranscriptWriter.resume` cuts away.

Steps are written on a thread (:mod:`~game.training.transcript.pipeline`): given the state's
canonical bytes (:meth:`TranscriptWriter.append_state`) it also hashes them there; given a state
being hashed on its GPU (:meth:`TranscriptWriter.append_pending`) it waits there for the leaf, and
copies the bytes back only for a checkpoint. A step is durable once :meth:`TranscriptWriter.flush`
(or ``close``, ``finish``) returns.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path

from game.errors import TranscriptError
from game.fsio import atomic_write, fsync_dir, truncate_fsync
from game.merkle import HASH_SIZE, merkle_root
from game.training.log.formats import WritableChunk
from game.training.state import leafnative
from game.training.task.config import TaskConfig
from game.training.transcript.files import LogWriter, read_hashes
from game.training.transcript.layout import TranscriptPaths, checkpoint_file_step
from game.training.transcript.manifest import Manifest, config_of, make_transcript_dir, read_manifest
from game.training.transcript.pipeline import PendingState, StepJob, StepPipeline
from game.training.transcript.reader import steps_on_disk

log = logging.getLogger(__name__)


class TranscriptWriter(StepPipeline):
    """Appends one step at a time; :meth:`finish` writes the roots and marks the manifest complete.

    Steps are written by a thread of the writer's (:class:`StepPipeline`): :meth:`append_step`
    returns once the step is queued. Use the writer as a context manager, or call :meth:`close`, so
    the queued steps reach the disk when the caller stops early; an error of the thread (a full disk)
    is raised by the next call.
    """

    def __init__(self, directory: Path, cfg: TaskConfig, manifest: Manifest, done: list[bytes]) -> None:
        super().__init__(directory, cfg, done)
        self.manifest = manifest

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, cfg: TaskConfig, profile: str) -> TranscriptWriter:
        """Start a new transcript in ``directory`` (created if missing; must hold no transcript)."""
        directory = Path(directory)
        paths = TranscriptPaths(directory)
        if paths.manifest.exists():
            raise TranscriptError(f"{directory} already holds a transcript; choose another --out")
        make_transcript_dir(directory)
        try:
            paths.log_dir.mkdir(exist_ok=True)
            paths.checkpoint_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise TranscriptError(f"cannot make the transcript directory {directory}: {exc}") from exc
        for path in (paths.leaves, paths.chunk_hashes):
            atomic_write(path, b"")
        manifest = Manifest(
            config=cfg.to_dict(),
            inputs=cfg.inputs().to_dict(),
            spec_hash=cfg.spec_hash().hex(),
            profile=profile,
            steps=cfg.steps,
            checkpoint_interval=cfg.checkpoint_interval,
        )
        atomic_write(paths.manifest, manifest.to_json())
        log.info("new transcript at %s (%d steps, spec %s)", directory, cfg.steps, manifest.spec_hash[:16])
        return cls(directory, cfg, manifest, [])

    @classmethod
    def resume(cls, directory: Path, cfg: TaskConfig, *, keep: int | None = None) -> TranscriptWriter:
        """Reopen an incomplete transcript of the same task, cutting away any partial last step
        (and, with ``keep``, every step past the first ``keep`` leaves: a parameter server that
        failed over to an older state goes on from there)."""
        directory = Path(directory)
        paths = TranscriptPaths(directory)
        manifest = read_manifest(directory)
        if manifest.spec_hash != cfg.spec_hash().hex():
            raise TranscriptError(
                f"{directory} holds a transcript of another task (spec {manifest.spec_hash[:16]}..., "
                f"this task is {cfg.spec_hash().hex()[:16]}...); choose another --out or delete it"
            )
        config_of(manifest, paths.manifest)
        leaves_path = paths.leaves
        hashes_path = paths.chunk_hashes
        for p in (leaves_path, hashes_path):
            if not p.exists():
                atomic_write(p, b"")
        paths.log_dir.mkdir(exist_ok=True)
        paths.checkpoint_dir.mkdir(exist_ok=True)
        n = min(steps_on_disk(directory), manifest.num_leaves, manifest.num_leaves if keep is None else keep)
        if hashes_path.stat().st_size < n * HASH_SIZE:
            raise TranscriptError(
                f"{hashes_path} has fewer chunk hashes than {leaves_path} has leaves: the transcript is damaged"
            )
        # Everything past the last complete leaf belongs to a step that was cut off.
        truncate_fsync(leaves_path, n * HASH_SIZE)
        truncate_fsync(hashes_path, n * HASH_SIZE)
        LogWriter(paths.log_dir).truncate_after(n - 1)
        ckpt_dir = paths.checkpoint_dir
        for p in sorted(ckpt_dir.iterdir()):
            ckpt = checkpoint_file_step(p.name)
            if p.name.endswith(".tmp") or (ckpt is not None and ckpt >= n):
                p.unlink()
        fsync_dir(ckpt_dir)
        leaves = read_hashes(leaves_path, "leaves")
        manifest = replace(manifest, complete=False, state_root=None, log_root=None)
        atomic_write(paths.manifest, manifest.to_json())
        log.info("resuming transcript at %s with %d of %d leaves", directory, n, manifest.num_leaves)
        return cls(directory, cfg, manifest, leaves)

    # -- writing ---------------------------------------------------------------------------

    @property
    def leaves(self) -> list[bytes]:
        """Every accepted step's leaf (waiting for the thread to hash those queued by
        :meth:`append_state`)."""
        if self._written < len(self._leaves):
            self.flush()
        return [leaf for leaf in self._leaves if isinstance(leaf, bytes)]

    def append_step(
        self, step: int, state_hash: bytes, step_log: WritableChunk, checkpoint: bytes | None = None
    ) -> None:
        """Queue step ``step``'s chunk, chunk hash, checkpoint (when due) and leaf for writing, in
        that order (the leaf last). Blocks while :data:`~game.training.transcript.pipeline.WRITE_AHEAD`
        steps wait.

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
        self._queue(StepJob(step, bytes(state_hash), chunk, checkpoint))

    def append_state(self, step: int, state: bytes | memoryview, step_log: WritableChunk) -> None:
        """:meth:`append_step` with the step's canonical state bytes instead of their hash: the
        thread hashes them (the hash takes about a millisecond a megabyte, off the trainer's
        thread) and writes them as the checkpoint when one is due. ``state`` belongs to the writer
        from here and must not change. A sparse log's payload is built here, on the caller's
        thread (:class:`~game.training.log.chunks.PreparedChunk`); the thread compresses it."""
        checkpoint = state if self.wants_checkpoint(step) else None
        chunk = step_log.prepare(step, self.spec_hash)
        self._queue(StepJob(step, None, chunk, checkpoint, state))

    def append_pending(self, step: int, pending: PendingState, step_log: WritableChunk) -> None:
        """:meth:`append_step` for a state being hashed on its GPU: the thread waits for the leaf
        (and copies the canonical bytes to the host when a checkpoint is due) while the caller runs
        the next step. ``pending`` belongs to the writer from here."""
        chunk = step_log.prepare(step, self.spec_hash)
        self._queue(StepJob(step, None, chunk, None, pending=pending))

    def add_checkpoint(self, step: int, data: bytes) -> None:
        """Keep the canonical bytes of an earlier step as its checkpoint (an asynchronous task's
        state that an update after a later checkpoint computes on), held to that step's leaf."""
        leaves = self.leaves  # waits for the queued steps
        if not 0 <= step < len(leaves):
            raise TranscriptError(f"no leaf for step {step} yet: its checkpoint cannot be kept")
        if leafnative.leaf(data) != leaves[step]:
            raise TranscriptError(f"the state bytes given for step {step} do not hash to its leaf")
        path = self.paths.checkpoint(step)
        if not path.is_file():
            atomic_write(path, data)

    def finish(self) -> Manifest:
        """Write the queued steps, compute both roots, check every step is there, and mark the
        manifest complete."""
        self.close()
        if self.num_done != self.manifest.num_leaves:
            raise TranscriptError(
                f"cannot finish: {self.num_done} of {self.manifest.num_leaves} leaves written"
            )
        hashes = read_hashes(self.paths.chunk_hashes, "chunk hashes")
        self.manifest = replace(
            self.manifest,
            state_root=merkle_root(self.leaves).hex(),
            log_root=merkle_root(hashes).hex(),
            complete=True,
        )
        atomic_write(self.paths.manifest, self.manifest.to_json())
        return self.manifest

    def discard(self) -> None:
        """Remove the transcript this writer created, once closed, while it holds leaf 0 and at
        most step 1: a task refused in step 1 (an op, its code) or by the check after it (a state
        that does not load back) would otherwise leave a transcript that the run with the fix is
        refused into, as another task's. The files of a transcript go, by name; the directory
        itself stays (it may have been the user's before), as does anything else in it."""
        self.close()
        if self.num_done > 2:
            raise TranscriptError(f"{self.directory} holds trained steps: it is not discarded")
        paths = self.paths
        first = (paths.chunk(0), paths.checkpoint(0), paths.chunk(1), paths.checkpoint(1))
        for path in (paths.manifest, paths.leaves, paths.chunk_hashes, *first):
            path.unlink(missing_ok=True)
        for folder in (paths.log_dir, paths.checkpoint_dir):
            with contextlib.suppress(OSError):  # not empty: something not ours is in it
                folder.rmdir()
        log.info("removed the transcript at %s: it held leaf 0 and at most step 1", self.directory)
