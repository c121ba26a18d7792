"""The transcript writer's thread: steps handed over by the trainer, written in step order while the
trainer computes the next one.

The writer does this on a thread of its own, in step order, so a trainer computes step ``n + 1``
while step ``n`` is compressed and synced (four fsyncs a step, milliseconds on a real disk, against a
small model's step of 10 ms); given the state's canonical bytes it also hashes them there; given a
state being hashed on its GPU (:class:`PendingState`) it waits there for the leaf, and copies the
bytes back only for a checkpoint. At most :data:`WRITE_AHEAD` steps wait while one is written; a
step is durable once :meth:`StepPipeline.flush` (or ``close``) returns. A crash loses at most those
steps, which a resumed run computes again.

A step's files go to disk in one C call (:func:`game.training.native.bindings.write_step`), which holds no
GIL: in Python they were some twenty calls, and the trainer's thread waited for the GIL after each.
A sparse chunk given with the state's bytes goes further in one C call
(:func:`game.training.transcript.stepwriter.finish_step`): compressed, hashed with the state and
written. Such steps go to a thread of that C library's own (:class:`~game.training.transcript.
stepwriter.Ring`), which never takes the GIL; the Python thread writes the others (a packed log, a
state given by its hash, or where the C library is not used). Each step goes to one of the two
only once the other has written every step before it, so the steps still land in order.

Why apart from :mod:`~game.training.transcript.writer`: that module says what a transcript holds
(create, resume, append, finish); this one only how its steps reach the disk in order.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from game.errors import StepWriteError, TranscriptError
from game.fsio import append_fsync, atomic_write, temp_file_name
from game.training.log.chunks import PreparedChunk, chunk_hash
from game.training.native import bindings
from game.training.state import leafnative
from game.training.task.config import TaskConfig
from game.training.transcript import stepwriter
from game.training.transcript.layout import TranscriptPaths, checkpoint_name, chunk_file_name
from game.training.transcript.manifest import is_checkpoint_step

log = logging.getLogger(__name__)


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
class StepJob:
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
        bytes, which are the checkpoint too where one is due (as :meth:`~game.training.transcript.
        writer.TranscriptWriter.append_state` queues them)."""
        return (  # the chunk asked last: a payload left to build is built by whoever asks
            self.state is not None
            and (self.checkpoint is None or self.checkpoint is self.state)
            and self.chunk.compressible is not None
        )


class StepPipeline:
    """Writes the steps handed to it, in order, on a thread of its own or the C library's (module
    docstring); :class:`~game.training.transcript.writer.TranscriptWriter` says what they are.

    An error of the thread (a full disk) is raised by the next call; use it as a context manager,
    or call :meth:`close`, so the queued steps reach the disk when the caller stops early.
    """

    def __init__(self, directory: Path, cfg: TaskConfig, done: list[bytes]) -> None:
        self.directory = directory
        self.cfg = cfg
        self.spec_hash = cfg.spec_hash()
        self.paths = TranscriptPaths(Path(directory))
        # Every accepted step, in order: its leaf once on disk, its job while the thread has it. The
        # caller's one ``append`` hands a step over; the thread puts the leaf in the job's place.
        self._leaves: list[bytes | StepJob] = list(done)
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
        #: steps that keep a checkpoint besides the interval's: an asynchronous task's states that
        #: updates after a checkpoint still compute on (a replay from that checkpoint needs them)
        self.extra_checkpoints: set[int] = set()
        # the step's files' directories as the C calls take them, worked out once
        paths = self.paths
        self._dir_bytes = tuple(
            os.fsencode(p) for p in (paths.log_dir, paths.checkpoint_dir, paths.chunk_hashes, paths.leaves)
        )

    def __enter__(self) -> Self:
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

    @property
    def num_done(self) -> int:
        """Number of steps accepted, on disk or queued (the next step to append is ``num_done``)."""
        return len(self._leaves)

    def wants_checkpoint(self, step: int) -> bool:
        """Whether ``step`` keeps a checkpoint (:func:`~game.training.transcript.manifest.is_checkpoint_step`)."""
        return step in self.extra_checkpoints or is_checkpoint_step(
            step, self.cfg.checkpoint_interval, self.cfg.steps
        )

    def _queue(self, job: StepJob) -> None:
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

    def _to_ring(self, job: StepJob) -> bool:
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
            assert isinstance(job, StepJob) and job.chunk.compressible is not None and job.state is not None
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
                assert isinstance(job, StepJob)
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
                assert isinstance(job, StepJob)
                if result is None:  # the C call could not compress or hash it: Python can
                    self._ring_off = True
                    self._write_here(job)
                else:
                    self._fail(job.step, result)
            self._written += 1
            ring.release(index + 1)

    def _write_here(self, job: StepJob) -> None:
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
                assert isinstance(job, StepJob)  # a step's leaf replaces its job only here
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

    def _write(self, job: StepJob, *, in_c: bool = True) -> None:
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
                if leafnative.leaf(checkpoint) != leaf:  # the bytes the judge will hash, held to the leaf
                    raise TranscriptError(f"checkpoint bytes of step {step} do not hash to its state hash")
        elif leaf is None:
            assert job.state is not None
            leaf = leafnative.leaf(job.state)
        elif job.checkpoint is not None and leafnative.leaf(job.checkpoint) != leaf:
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
        """The step's files, in the order :mod:`~game.training.transcript.writer` gives, the leaf
        last: it is what marks the step complete. In one C call where the kernels run (no GIL held,
        so the trainer's thread does not wait for the GIL after each file call), else the same moves
        in Python."""
        chunk_path = self.paths.chunk(step)
        ckpt_path = None if checkpoint is None else self.paths.checkpoint(step)
        hashes_path, leaves_path = self.paths.chunk_hashes, self.paths.leaves
        hashed = chunk_hash(chunk)
        if bindings.write_step(
            chunk_path, chunk, hashes_path, hashed, ckpt_path, checkpoint, leaves_path, leaf
        ):
            return
        atomic_write(chunk_path, chunk)
        append_fsync(hashes_path, hashed)
        if ckpt_path is not None:
            assert checkpoint is not None
            atomic_write(ckpt_path, checkpoint)
        append_fsync(leaves_path, leaf)
