"""A state's leaf: at once (:func:`state_hash`), on its GPU (:func:`device_leaf`), or on a thread of
its own while the next step runs (:class:`LeafHasher`).

An auditor compares every state it reaches with the trainer's leaf. Hashing the state on its own
thread costs it the leaf's SHA-256 (:mod:`~game.training.state.leafhash`; about a millisecond a
megabyte of canonical bytes, 1.33 MB on gpt-shakespeare) on every step; on a thread of its own,
which SHA-256 lets run beside the step (it releases the GIL), the step only pays for the copy of
the canonical bytes. The caller learns of a leaf one step late, so it keeps those bytes: they
rebuild the state when the step it ran in the meantime must run again (an auditor that stops
using the trainer's log at its first divergent step). A state too large for one buffer
(:func:`~game.training.state.canonical.state_buffer`) is hashed at once, piece by piece, as before: its
leaf is ready and no copy is kept.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from game.training.state import leafnative
from game.training.state.canonical import hash_streamed, state_buffer
from game.training.state.tensors import TrainState

if TYPE_CHECKING:  # Triton loads only for a state on a GPU
    from game.training.state.device_leaf import DeviceLeaf


def device_leaf(state: TrainState) -> DeviceLeaf | None:
    """The state's leaf computed on its GPU (:mod:`~game.training.state.device_leaf`), started and
    not waited for; None for a state on the CPU or on a device the kernels do not run on. On a GPU
    this replaces copying the whole state to the host and hashing it on one thread every step."""
    if state.device.type == "cpu":
        return None
    from game.training.state import device_leaf as on_device
    from game.training.state import sha256_kernel

    return on_device.DeviceLeaf.start(state) if sha256_kernel.runs_on(state.device) else None


def state_hash(state: TrainState) -> bytes:
    """``leafhash.leaf_of(encode_state(state))``: the leaf of the state tree. A state on a GPU is
    hashed there (:func:`device_leaf`); on the CPU a small state in one buffer
    (:func:`~.canonical.state_buffer`), a large one piece by piece (:func:`~.canonical.hash_streamed`)."""
    on_device = device_leaf(state)
    if on_device is not None:
        return on_device.leaf()
    buf = state_buffer(state)
    if buf is not None:
        return leafnative.leaf(buf)
    return hash_streamed(state)


class PendingLeaf:
    """The leaf of the state after ``step``, on its way: hashed on the hasher's thread from the
    state's canonical bytes (kept in ``buffer``), or on the state's GPU (``device``, which keeps
    them there); ``ready`` when it was hashed at once (a large state on the CPU: nothing kept)."""

    __slots__ = ("_future", "_leaf", "buffer", "device", "step")

    def __init__(
        self,
        step: int,
        buffer: np.ndarray | None,
        future: Future[bytes] | None,
        leaf: bytes | None,
        device: DeviceLeaf | None = None,
    ):
        self.step = step
        self.buffer = buffer
        self.device = device
        self._future = future
        self._leaf = leaf

    @property
    def ready(self) -> bool:
        """Whether the leaf is known without waiting (a large state, hashed at once)."""
        return self._leaf is not None

    def leaf(self) -> bytes:
        """The state hash (waits for the thread or the device)."""
        if self._leaf is None:
            if self.device is not None:
                self._leaf = self.device.leaf()
            else:
                assert self._future is not None
                self._leaf = self._future.result()
        return self._leaf

    @property
    def keeps_bytes(self) -> bool:
        """Whether :meth:`state_bytes` has the state's bytes (not for a state hashed piece by piece)."""
        return self.device is not None or self.buffer is not None

    def state_bytes(self) -> bytes:
        """The canonical bytes the leaf is of, as kept (the engine decodes them into a state)."""
        if self.device is not None:
            return bytes(self.device.canonical_bytes())
        if self.buffer is None:
            raise ValueError(
                f"the state after step {self.step} was hashed piece by piece: no bytes were kept"
            )
        return self.buffer.tobytes()


class LeafHasher:
    """Hashes states on one thread of its own. Use as a context manager: leaving it waits for the
    hash in flight, if any (an error leaves nothing running)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vgame-leaf")

    def submit(self, state: TrainState) -> PendingLeaf:
        """Take the state's canonical bytes now (the state may change at once) and hash them on the
        thread, or on the state's GPU; a CPU state that does not fit one buffer is hashed here."""
        on_device = device_leaf(state)
        if on_device is not None:
            return PendingLeaf(state.step, None, None, None, on_device)
        buf = state_buffer(state)
        if buf is None:
            return PendingLeaf(state.step, None, None, hash_streamed(state))
        return PendingLeaf(state.step, buf, self._pool.submit(leafnative.leaf, buf), None)  # C: no GIL held

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> LeafHasher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["LeafHasher", "PendingLeaf", "device_leaf", "state_hash"]
