"""A transcript's logs in step order, the next one read on a thread while the caller replays this one.

Why: reading a step's chunk (the file, its hash check, decompression and decoding) is the
auditor's own work between steps. At the GPT-2-small shape a chunk lists some ten million values
and takes 45-140 ms of the 2-core CI machine's time, next to a step that on a GPU takes a few
hundred. Those parts release the GIL (file reads, SHA-256, zlib and the C decoder run without
it), so on a thread of its own the next chunk's read overlaps the replay of this one. For a
replay that defers its checks on a GPU the thread also puts the chunk's entries in page-locked
memory (``pin``, :meth:`~game.training.log.sparse.SparseStepLog.pin`), so that the step's copy of
them to the device does not wait for the host.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseStepLog
from game.training.transcript.reader import Transcript


def read_log(transcript: Transcript, step: int, *, pin: bool = False) -> ChunkLog:
    """``transcript.read_log(step)``, a sparse chunk pinned where ``pin`` says
    (:meth:`SparseStepLog.pin`)."""
    log = transcript.read_log(step)
    if pin and isinstance(log, SparseStepLog):
        log.pin()
    return log


class ReadAhead:
    """:meth:`Transcript.read_log` of steps asked for in order, each next one read ahead.

    ``read_log(step)`` gives what ``transcript.read_log(step)`` gives, its errors included (a read
    ahead's error is raised when its step is asked for, never before), and starts reading
    ``step + 1`` up to ``last``. A step asked for out of order is read then, on the caller's
    thread. At most one chunk is held ahead. ``pin``: each sparse chunk read is pinned
    (:meth:`SparseStepLog.pin`; a CUDA machine's, see :attr:`StepEngine.pins_logs
    <game.training.engine.step.StepEngine.pins_logs>`)."""

    def __init__(self, transcript: Transcript, last: int, *, pin: bool = False) -> None:
        self.transcript = transcript
        self.last = last
        self.pin = pin
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vgame-read-ahead")
        self._ahead: tuple[int, Future[ChunkLog]] | None = None

    def read_log(self, step: int) -> ChunkLog:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] != step:
            ahead[1].cancel()  # not the step asked for: dropped, its result or error never read
            ahead = None
        if step < self.last:
            self._ahead = (step + 1, self._pool.submit(self._read, step + 1))
        return ahead[1].result() if ahead is not None else self._read(step)

    def _read(self, step: int) -> ChunkLog:
        return read_log(self.transcript, step, pin=self.pin)

    def close(self) -> None:
        """Drop what was read ahead; waits for a read under way (one chunk at most)."""
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["ReadAhead", "read_log"]
