"""A transcript's logs in step order, the next ones read on threads while the caller replays this one.

Why: reading a step's chunk (the file, its hash check, decompression and decoding) is the
auditor's own work between steps. At the GPT-2-small shape a chunk lists some ten million values
and takes 45-140 ms of the 2-core CI machine's time, next to a step that on a GPU takes a few
hundred. Those parts release the GIL (file reads, SHA-256, zlib and the C decoder run without
it), so on a thread of its own the next chunk's read overlaps the replay of this one (a GPU
auditor reads its next two side by side: :func:`depth_for`). For a replay that defers its checks
on a GPU the thread also puts the chunk's entries in page-locked memory (``pin``,
:meth:`~game.training.log.sparse.SparseStepLog.pin`), so that the step's copy of them to the
device does not wait for the host.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from game.training.log.codec import compress_threads
from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseStepLog
from game.training.transcript.reader import Transcript

#: How many chunks a GPU auditor reads ahead, side by side (:func:`depth_for`). Two keep up with a
#: step as short as one chunk's read; at the GPT-2-small shape each chunk held has 52-127 MB of
#: entries.
GPU_DEPTH = 2


def depth_for(pin: bool) -> int:
    """The read-ahead's depth: :data:`GPU_DEPTH` for a GPU auditor (``pin``), where the host has a
    core for each beside the step's (:func:`~game.training.log.codec.compress_threads`), else 1 (a
    CPU step takes far longer than a read)."""
    return max(1, min(GPU_DEPTH, compress_threads())) if pin else 1


def read_log(transcript: Transcript, step: int, *, pin: bool = False) -> ChunkLog:
    """``transcript.read_log(step)``, a sparse chunk pinned where ``pin`` says
    (:meth:`SparseStepLog.pin`)."""
    log = transcript.read_log(step)
    if pin and isinstance(log, SparseStepLog):
        log.pin()
    return log


class ReadAhead:
    """:meth:`Transcript.read_log` of steps asked for in order, the next ones read ahead.

    ``read_log(step)`` gives what ``transcript.read_log(step)`` gives, its errors included (a read
    ahead's error is raised when its step is asked for, never before), and keeps the ``depth``
    steps after it (up to ``last``) read or being read, each on a thread of its own. A step asked
    for out of order is read then, on the caller's thread, and the reads ahead are dropped. At most
    ``depth`` chunks are held ahead (by default :func:`depth_for`). ``pin``: each sparse chunk
    read is pinned (:meth:`SparseStepLog.pin`; a GPU auditor's, see :attr:`StepEngine.pins_logs
    <game.training.engine.step.StepEngine.pins_logs>`).

    Why more than one: a step on a GPU may be shorter than one chunk's read (at the GPT-2-small
    shape a read takes 44-51 ms of the 2-core CI machine's time, and the target step 46 ms).
    Chunks read side by side on the host's cores keep up where one thread would not."""

    def __init__(
        self, transcript: Transcript, last: int, *, pin: bool = False, depth: int | None = None
    ) -> None:
        depth = depth_for(pin) if depth is None else depth
        if depth < 1:
            raise ValueError(f"a read-ahead's depth is at least 1, not {depth}")
        self.transcript = transcript
        self.last = last
        self.pin = pin
        self.depth = depth
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="vgame-read-ahead")
        self._ahead: deque[tuple[int, Future[ChunkLog]]] = deque()  # the next steps, in order

    def read_log(self, step: int) -> ChunkLog:
        ahead = self._ahead.popleft() if self._ahead and self._ahead[0][0] == step else None
        if ahead is None:
            self._drop()  # not the steps asked for: dropped, their results or errors never read
        after = self._ahead[-1][0] if self._ahead else step
        for later in range(after + 1, min(step + self.depth, self.last) + 1):
            self._ahead.append((later, self._pool.submit(self._read, later)))
        return ahead[1].result() if ahead is not None else self._read(step)

    def _read(self, step: int) -> ChunkLog:
        return read_log(self.transcript, step, pin=self.pin)

    def _drop(self) -> None:
        while self._ahead:
            self._ahead.pop()[1].cancel()

    def close(self) -> None:
        """Drop what was read ahead; waits for the reads under way (``depth`` chunks at most)."""
        self._drop()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["GPU_DEPTH", "ReadAhead", "depth_for", "read_log"]
