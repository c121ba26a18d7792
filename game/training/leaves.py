"""State leaves hashed on a thread of their own, while the next step runs.

An auditor compares every state it reaches with the trainer's leaf. Hashing the state on its own
thread costs it the SHA-256 (about a millisecond a megabyte of canonical bytes; 1.33 MB on
gpt-shakespeare) on every step; on a thread of its own, which SHA-256 lets run beside the step
(it releases the GIL), the step only pays for the copy of the canonical bytes. The caller learns
of a leaf one step late, so it keeps those bytes: they rebuild the state when the step it ran in
the meantime must run again (an auditor that stops using the trainer's log at its first
divergent step). A state too large for one buffer (:func:`~game.training.state.state_buffer`) is
hashed at once, piece by piece, as before: its leaf is ready and no copy is kept.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from game.training.config import TaskConfig
from game.training.state import TrainState, decode_state, hash_streamed, state_buffer


def _sha256(buf: np.ndarray) -> bytes:
    return hashlib.sha256(buf.data).digest()


class PendingLeaf:
    """The leaf of the state after ``step``, on its way; with the state's canonical bytes when it
    came from one buffer (``ready`` False until the hash is asked for)."""

    __slots__ = ("_future", "_leaf", "buffer", "step")

    def __init__(
        self, step: int, buffer: np.ndarray | None, future: Future[bytes] | None, leaf: bytes | None
    ):
        self.step = step
        self.buffer = buffer
        self._future = future
        self._leaf = leaf

    @property
    def ready(self) -> bool:
        """Whether the leaf is known without waiting (a large state, hashed at once)."""
        return self._leaf is not None

    def leaf(self) -> bytes:
        """The state hash (waits for the thread)."""
        if self._leaf is None:
            assert self._future is not None
            self._leaf = self._future.result()
        return self._leaf

    def rebuild(self, cfg: TaskConfig) -> TrainState:
        """The state the leaf is of, decoded from the kept bytes (on CPU; the step engine moves it)."""
        if self.buffer is None:
            raise ValueError(
                f"the state after step {self.step} was hashed piece by piece: no bytes were kept"
            )
        return decode_state(self.buffer.tobytes(), cfg)


class LeafHasher:
    """Hashes states on one thread of its own. Use as a context manager: leaving it waits for the
    hash in flight, if any (an error leaves nothing running)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vgame-leaf")

    def submit(self, state: TrainState) -> PendingLeaf:
        """Take the state's canonical bytes now (the state may change at once) and hash them on the
        thread; a state that does not fit one buffer is hashed here."""
        buf = state_buffer(state)
        if buf is None:
            return PendingLeaf(state.step, None, None, hash_streamed(state))
        return PendingLeaf(state.step, buf, self._pool.submit(_sha256, buf), None)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> LeafHasher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["LeafHasher", "PendingLeaf"]
