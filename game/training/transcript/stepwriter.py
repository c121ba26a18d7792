"""A transcript step finished in one C call of the writer's library (``writer.c``,
:mod:`~game.training.native.writerlib`): the chunk compressed, both hashes and the files, with no GIL
held; or on that library's own thread (:class:`Ring`), which never takes the GIL.

Why: the trainer's thread runs beside the writer's, and a step written in Python lets the GIL go and
takes it back five times (:mod:`~game.training.native.writerlib` says what that cost). Where the
library is not used (:func:`available`: not built, switched off, inside :func:`disabled`, or where a
probe turned it down: its codecs, SHA-256 and chunk leaf here, its leaf in :mod:`~game.training.state.leafnative`),
:func:`finish_step` returns None and the writer writes the step in Python, to the same files
(tests/training/test_stepwriter.py holds both ways to it).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import weakref
import zlib
from typing import NamedTuple

import numpy as np

from game.chunkleaf import PIECE_BYTES, chunk_leaf
from game.training.log.codec import (
    CODECS,
    MAX_PAYLOAD,
    Compressible,
    compress_threads,
    compress_with,
    lzma_dict_size,
    tried_codecs,
    zlib_block,
    zlib_blocks,
    zlib_level,
)
from game.training.native import bindings, library, writerlib
from game.training.native.writerlib import ENV_SWITCH, available, describe, disabled

# For its probe, registered as it loads: ``vg_finish_step`` and the ring hash the state with
# ``vg_leaf``, which that probe holds to Python's leaf.
from game.training.state import leafnative  # noqa: F401

log = logging.getLogger(__name__)


def _probe() -> bytes:
    """A payload like a sparse chunk's (small varints, runs, a few larger values), fixed."""
    rng = np.random.default_rng(20261124)
    small = rng.geometric(0.3, size=3000).astype(np.uint8)
    small[::97] = rng.integers(128, 256, size=small[::97].size, dtype=np.uint8)
    return b"probe names\0" + small.tobytes()


def _agrees(lib: ctypes.CDLL) -> str | None:
    """Why the C codecs and SHA-256 would give other bytes than Python's, or None when they agree."""
    payload = _probe()
    for size in (len(payload), 200):
        part = payload[:size]
        for codec in ("zlib", "lzma"):
            got = compress(part, codec, lib)
            if got != compress_with(part, codec):
                return f"its {codec} gives other bytes than Python's (zlib {zlib.ZLIB_RUNTIME_VERSION} there)"
    # A large payload's blocks (codec.ZLIB_BLOCK), here at a probe's size: several, the last short.
    block = len(payload) // 3 - 7
    got = compress(payload, "zlib", lib, level=1, block=block, threads=2)
    if got != zlib_blocks(payload, 1, block):
        return f"its zlib in blocks gives other bytes than Python's (zlib {zlib.ZLIB_RUNTIME_VERSION} there)"
    digest = np.empty(32, dtype=np.uint8)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if lib.vg_sha256(buf.ctypes.data, buf.size, digest.ctypes.data) != 0:
        return "its SHA-256 failed"
    if digest.tobytes() != hashlib.sha256(payload).digest():
        return "its SHA-256 differs from hashlib's"
    # A chunk's leaf (game.chunkleaf): empty, one piece, at and past a piece's edge, an odd count.
    for size in (0, 1, PIECE_BYTES, PIECE_BYTES + 1, 3 * PIECE_BYTES + 5):
        chunk = (payload * (size // len(payload) + 1))[:size]
        buf = np.frombuffer(chunk, dtype=np.uint8) if size else np.zeros(1, dtype=np.uint8)
        if lib.vg_chunk_leaf(buf.ctypes.data, size, digest.ctypes.data) != 0:
            return "its chunk leaf failed"
        if digest.tobytes() != chunk_leaf(chunk):
            return f"its leaf of a {size}-byte chunk differs from game.chunkleaf's"
    return None


def compress(
    payload: bytes,
    codec: str,
    lib: ctypes.CDLL | None = None,
    *,
    level: int | None = None,
    block: int | None = None,
    threads: int | None = None,
) -> bytes | None:
    """``payload`` compressed by ``writer.c`` with "zlib" or "lzma" at the writer's settings
    (:func:`~game.training.log.codec.zlib_level`, :func:`~game.training.log.codec.zlib_block`,
    :func:`~game.training.log.codec.compress_threads`, :func:`~game.training.log.codec.lzma_dict_size`)
    unless ``level``, ``block`` or ``threads`` are given; None where the library is not used."""
    lib = lib or writerlib.running()
    if lib is None:
        return None
    buf = np.frombuffer(payload, dtype=np.uint8)
    cap = len(payload) + len(payload) // 8 + 1024
    out = np.empty(cap, dtype=np.uint8)
    n = lib.vg_compress(
        CODECS[codec], buf.ctypes.data, buf.size,
        zlib_level(buf.size) if level is None else level,
        zlib_block(buf.size) if block is None else block,
        compress_threads() if threads is None else threads,
        lzma_dict_size(buf.size), out.ctypes.data, cap,
    )  # fmt: skip
    return None if n < 0 else out[:n].tobytes()


class StepPaths(NamedTuple):
    """A step's files as ``vg_write_step`` takes them (file system bytes)."""

    chunk: bytes
    chunk_tmp: bytes
    log_dir: bytes
    hashes: bytes
    checkpoint: bytes | None  # with its temporary name and directory, when the step has one
    checkpoint_tmp: bytes | None
    checkpoint_dir: bytes | None
    leaves: bytes


def finish_step(chunk: Compressible, state: bytes | memoryview, paths: StepPaths) -> bytes | None:
    """Finish a step in one C call that holds no GIL: the chunk's bytes (as ``chunk.finish()``), its
    hash, the leaf (``leafhash.leaf_of(state)``), then the files as :func:`game.training.native.
    write_step` writes them (``state`` as the checkpoint where ``paths`` name one). Returns the
    leaf; None, with nothing written, where the C call is not used or could not do it (write the
    step in Python). Raises ``OSError`` naming the file that failed; nothing after it was written."""
    lib = writerlib.running()
    if lib is None or len(chunk.payload) > MAX_PAYLOAD:
        return None
    size = len(chunk.payload)
    head, payload = np.frombuffer(chunk.head, dtype=np.uint8), np.frombuffer(chunk.payload, dtype=np.uint8)
    body = np.frombuffer(state, dtype=np.uint8)
    leaf = np.empty(32, dtype=np.uint8)
    failed = np.zeros(1, dtype=np.int64)
    err = lib.vg_finish_step(
        head.ctypes.data, head.size, chunk.codec_at, payload.ctypes.data, size, *_codec_args(chunk),
        body.ctypes.data, body.size, int(paths.checkpoint is not None),
        paths.chunk, paths.chunk_tmp, paths.log_dir, paths.hashes,
        paths.checkpoint, paths.checkpoint_tmp, paths.checkpoint_dir, paths.leaves,
        leaf.ctypes.data, failed.ctypes.data, library.address("vg_write_step"),
    )  # fmt: skip
    if err < 0:
        return None
    if err > 0:
        raise _file_error(err, int(failed[0]), paths)
    return leaf.tobytes()


def _codec_args(chunk: Compressible) -> tuple[int, int, int, int, int]:
    """How the C call compresses ``chunk``'s payload: the codecs to try (a bit ``1 << id`` each),
    zlib's level, block and threads, and lzma's dictionary, as
    :func:`~game.training.log.codec.compress` would."""
    size = len(chunk.payload)
    tries = sum(1 << CODECS[c] for c in tried_codecs(chunk.codec, size))
    return tries, zlib_level(size), zlib_block(size), compress_threads(), lzma_dict_size(size)


def _file_error(err: int, which: int, paths: StepPaths) -> OSError:
    """``vg_write_step``'s errno as an ``OSError`` naming the file (``which``: 1-4) that failed."""
    where = {1: paths.chunk, 2: paths.hashes, 3: paths.checkpoint, 4: paths.leaves}[which]
    assert where is not None
    return OSError(err, f"{os.strerror(err)} (the step's {bindings.STEP_FILES[which]})", os.fsdecode(where))


class _Kept(NamedTuple):
    """What a step in the ring points into, kept alive until its thread is done with it."""

    chunk: Compressible
    state: bytes | memoryview
    paths: StepPaths


def _address(data: bytes | memoryview) -> int:
    """Where ``data``'s bytes are (contiguous bytes: a state's canonical buffer)."""
    if isinstance(data, memoryview) and not data.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(data))  # a few times cheaper than numpy's
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


def _free_ring(lib: ctypes.CDLL, handle: int, keep: dict[int, _Kept], pid: int) -> None:
    """Finish the ring's steps and stop its thread (``keep`` holds their buffers alive until then).
    Not in a child that ``fork`` made: the thread is its parent's, and the parent finishes it."""
    if os.getpid() == pid:
        lib.vg_ring_free(handle)
    keep.clear()


class Ring:
    """Steps finished in order by a thread of ``writer.c``'s own, which never takes the GIL.

    :meth:`push` hands a step over in one call that keeps the GIL; the trainer's thread does not
    stop for the writer again until it calls :meth:`wait`. Step ``i`` (the ``i``-th pushed) is done once
    :meth:`done` is past it; :meth:`result` then tells what became of it. The ring holds each step's
    buffers until :meth:`release`, and, where its owner is dropped without :meth:`close` (or the
    interpreter exits), finishes its steps before they are freed.
    """

    #: Steps in flight at most (``RING_CAP`` in writer.c): :meth:`result` reads a step's result until
    #: this many more are pushed.
    CAPACITY = 16

    def __init__(self, lib: ctypes.CDLL, held: ctypes.PyDLL) -> None:
        handle = lib.vg_ring_new(library.address("vg_write_step"))
        if not handle:
            raise OSError("the transcript writer's thread could not be started")
        self._lib, self._held, self._handle = lib, held, handle
        self._keep: dict[int, _Kept] = {}  # step index -> what its pointers point into
        self._leaf_out = np.empty(32, dtype=np.uint8)  # where result() has a step's leaf written
        self._failed_out = np.zeros(1, dtype=np.int64)
        self._out_at = (self._leaf_out.ctypes.data, self._failed_out.ctypes.data)  # worked out once
        self._closer = weakref.finalize(self, _free_ring, lib, handle, self._keep, os.getpid())

    @classmethod
    def start(cls) -> Ring | None:
        """A ring with its thread running; None where the C call is not used (:func:`available`)."""
        lib, held = writerlib.running(), writerlib.held()
        if lib is None or held is None:
            return None
        try:
            return cls(lib, held)
        except OSError as exc:
            log.warning("%s: steps are written by a Python thread", exc)
            return None

    def push(self, chunk: Compressible, state: bytes | memoryview, paths: StepPaths) -> int:
        """Queue a step (``state`` as the checkpoint too where ``paths`` name one); its index. The
        caller keeps fewer than :attr:`CAPACITY` steps in flight (else ``RuntimeError``)."""
        index = self.pushed
        self._keep[index] = _Kept(chunk, state, paths)  # before the push: its pointers must outlive it
        got = self._held.vg_ring_push(
            self._handle, chunk.head, len(chunk.head), chunk.codec_at, chunk.payload, len(chunk.payload),
            *_codec_args(chunk), _address(state), len(state), int(paths.checkpoint is not None), *paths,
        )  # fmt: skip
        if got < 0:
            raise RuntimeError(f"the writer's ring holds {self.CAPACITY} steps already")
        return int(got)

    @property
    def pushed(self) -> int:
        return int(self._held.vg_ring_pushed(self._handle))

    def done(self) -> int:
        """How many steps are done (written, failed, or dropped after a failure)."""
        return int(self._held.vg_ring_done(self._handle))

    def wait(self, upto: int) -> int:
        """Wait, without the GIL, until ``upto`` steps (or all pushed) are done; how many are."""
        return int(self._lib.vg_ring_wait(self._handle, upto))

    def result(self, index: int) -> bytes | OSError | None:
        """Step ``index``'s leaf once written; the ``OSError`` naming the file that failed; or None
        when it was not written (the C call could not compress or hash it, or an earlier step
        failed): the caller writes it in Python or drops it."""
        err = int(self._held.vg_ring_result(self._handle, index, *self._out_at))
        if err == -3:
            raise RuntimeError(f"step {index} of the writer's ring is not done or no longer kept")
        if err > 0:
            return _file_error(err, int(self._failed_out[0]), self._keep[index].paths)
        return self._leaf_out.tobytes() if err == 0 else None

    def release(self, upto: int) -> None:
        """Let go of the buffers of the steps before ``upto`` (done; their results read)."""
        for index in [i for i in self._keep if i < upto]:
            del self._keep[index]

    def close(self) -> None:
        """Finish every step pushed and stop the thread (waits, without the GIL)."""
        self._closer()


#: First, as it always ran; the leaf's probe (:mod:`~game.training.state.leafnative`) after it.
writerlib.add_probe(_agrees, order=0)

__all__ = [
    "ENV_SWITCH",
    "Ring",
    "StepPaths",
    "available",
    "compress",
    "describe",
    "disabled",
    "finish_step",
]
