"""A state's leaf in one C call (``vg_leaf`` of the transcript writer's library,
:mod:`~game.training.native.writerlib`), which holds no GIL, with the probe that holds it to
:func:`~game.training.state.leafhash.leaf_of`.

Why: in Python the leaf lets go of the GIL once per 4 KiB chunk (some 325 times for
gpt-shakespeare's 1.33 MB state), which on a hashing thread slowed the training thread beside it by a
fifth. Where the library is not used (:func:`game.training.native.writerlib.running`), or where its
leaf would differ from Python's on the probe's states (checked once a process, as the library
loads), :func:`leaf` is ``leafhash.leaf_of``.
"""

from __future__ import annotations

import ctypes

import numpy as np

from game.training.native import writerlib
from game.training.state import leafhash

#: Sizes of the states whose leaves the probe compares: empty, tiny, one chunk and a byte more, and
#: one of three levels with a ragged last chunk (600,000 bytes: 147 chunks, 4,704 bytes of digests).
_LEAF_PROBE_SIZES = (0, 9, leafhash.CHUNK, leafhash.CHUNK + 1, 600_000)


def _agrees(lib: ctypes.CDLL) -> str | None:
    """Why the library's leaf would differ from ``leafhash.leaf_of``, or None when they agree."""
    digest = np.empty(32, dtype=np.uint8)
    state = np.random.default_rng(20261127).integers(0, 256, size=max(_LEAF_PROBE_SIZES), dtype=np.uint8)
    for size in _LEAF_PROBE_SIZES:
        if lib.vg_leaf(state.ctypes.data, size, digest.ctypes.data) != 0:
            return f"its leaf of {size} bytes failed"
        if digest.tobytes() != leafhash.leaf_of(state[:size]):
            return f"its leaf of {size} bytes differs from leafhash's"
    return None


#: After the codecs' and SHA-256's probe (:mod:`game.training.transcript.stepwriter`), as it always ran.
writerlib.add_probe(_agrees, order=1)


def leaf(data: bytes | memoryview | np.ndarray) -> bytes:
    """``leafhash.leaf_of(data)``, in one C call that holds no GIL where the library runs."""
    lib = writerlib.running()
    if lib is None:
        return leafhash.leaf_of(data)
    buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    digest = np.empty(32, dtype=np.uint8)
    if lib.vg_leaf(buf.ctypes.data, buf.size, digest.ctypes.data) != 0:
        return leafhash.leaf_of(data)
    return digest.tobytes()


__all__ = ["leaf"]
