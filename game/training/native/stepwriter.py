"""The transcript writer's step in one C call (``writer.c``): the chunk compressed, both hashes and
the files, with no GIL held.

Why: the trainer's thread runs beside the writer's. Done in Python, a step's writing lets the GIL go
and takes it back five times (zlib, lzma's two calls, the state's hash, the files), and each time
the writer's thread takes it back, the trainer's thread waits for it between two torch ops: on
cnn-digits that cost the trainer some 0.05-0.1x of a plain float64 step (docs/benchmarks.md).

``writer.c`` links zlib, liblzma and OpenSSL's libcrypto. It is compiled like the C kernels, into
their cache directory, the first time a transcript writer needs it. Where it cannot be built (no
compiler, or no headers of those libraries), with ``VGAME_NATIVE=0`` or ``VGAME_WRITER=0``, inside
:func:`disabled` or :func:`game.training.native.library.disabled`, or where its codecs or its leaf
(:mod:`~game.training.state.leafhash`) would not give the bytes Python's give (a probe, once a process),
:func:`finish_step` returns None and the writer writes the step in Python, to the same files
(tests/training/test_stepwriter.py holds both ways to it).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import threading
import weakref
import zlib
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np

from game.training.log.codec import (
    CODECS,
    MAX_PAYLOAD,
    Compressible,
    compress_with,
    lzma_dict_size,
    tried_codecs,
    zlib_level,
)
from game.training.native import bindings, library
from game.training.state import leafhash

log = logging.getLogger(__name__)

#: Set to ``0`` to write every step in Python (``VGAME_NATIVE=0`` also does).
ENV_SWITCH = "VGAME_WRITER"
#: What ``writer.c`` links.
LIBS: tuple[str, ...] = ("-lz", "-llzma", "-lcrypto", "-pthread")

#: ``with stepwriter.disabled():`` writes every step in Python inside.
disabled = library.OffSwitch()

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_PATH = ctypes.c_char_p
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
#: The same library, loaded so that its calls keep the GIL: the ring's quick calls, made on the
#: trainer's thread, then neither let the GIL go nor wait to take it back.
_held: ctypes.PyDLL | None = None
_tried = False
_why: str | None = None  # why the C call is not used, once a load found out


def _source() -> bytes:
    return resources.files(__package__).joinpath("writer.c").read_bytes()


def library_path() -> Path:
    """Where the compiled writer is (or will be) kept: keyed by the source, the flags and the platform."""
    tag = "|".join([platform.machine(), platform.system(), *library.CFLAGS, *LIBS]).encode()
    key = hashlib.sha256(_source() + tag).hexdigest()
    return library.cache_dir() / f"writer-{key[:16]}.so"


def _open() -> ctypes.CDLL:
    lib = library.open_library(_source(), library_path(), name="writer.c", libs=LIBS)
    lib.vg_compress.restype = _I64
    lib.vg_compress.argtypes = [_I64, _PTR, _I64, _I64, _I64, _PTR, _I64]
    lib.vg_sha256.restype = _I64
    lib.vg_sha256.argtypes = [_PTR, _I64, _PTR]
    lib.vg_leaf.restype = _I64
    lib.vg_leaf.argtypes = [_PTR, _I64, _PTR]
    lib.vg_finish_step.restype = _I64
    lib.vg_finish_step.argtypes = [
        *(_PTR, _I64, _I64, _PTR, _I64),  # head, codec byte, payload
        *(_I64, _I64, _I64),  # the codecs tried, zlib's level, lzma's dictionary
        *(_PTR, _I64, _I64),  # the state, whether it is the checkpoint too
        *(_PATH, _PATH, _PATH, _PATH),  # the chunk, its temporary name, the log directory, the hashes
        *(_PATH, _PATH, _PATH, _PATH),  # the checkpoint, its temporary name, its directory, the leaves
        *(_PTR, _PTR, _PTR),  # the leaf, where it failed, vg_write_step
    ]
    lib.vg_ring_new.restype = _PTR
    lib.vg_ring_new.argtypes = [_PTR]
    lib.vg_ring_wait.restype = _I64
    lib.vg_ring_wait.argtypes = [_PTR, _I64]
    lib.vg_ring_free.restype = None
    lib.vg_ring_free.argtypes = [_PTR]
    return lib


def _open_held(lib: ctypes.CDLL) -> ctypes.PyDLL:
    held = ctypes.PyDLL(lib._name)
    held.vg_ring_push.restype = _I64
    held.vg_ring_push.argtypes = [
        *(_PTR, _PATH, _I64, _I64, _PATH, _I64),  # the ring, head, codec byte, payload
        *(_I64, _I64, _I64),  # the codecs tried, zlib's level, lzma's dictionary
        *(_PTR, _I64, _I64),  # the state, whether it is the checkpoint too
        *(_PATH,) * 8,  # the paths, as vg_finish_step takes them
    ]
    for name in ("vg_ring_pushed", "vg_ring_done"):
        getattr(held, name).restype = _I64
        getattr(held, name).argtypes = [_PTR]
    held.vg_ring_result.restype = _I64
    held.vg_ring_result.argtypes = [_PTR, _I64, _PTR, _PTR]
    return held


def _probe() -> bytes:
    """A payload like a sparse chunk's (small varints, runs, a few larger values), fixed."""
    rng = np.random.default_rng(20261124)
    small = rng.geometric(0.3, size=3000).astype(np.uint8)
    small[::97] = rng.integers(128, 256, size=small[::97].size, dtype=np.uint8)
    return b"probe names\0" + small.tobytes()


#: Sizes of the states whose leaves the probe compares: empty, tiny, one chunk and a byte more, and
#: one of three levels with a ragged last chunk (600,000 bytes: 147 chunks, 4,704 bytes of digests).
_LEAF_PROBE_SIZES = (0, 9, leafhash.CHUNK, leafhash.CHUNK + 1, 600_000)


def _agrees(lib: ctypes.CDLL) -> str | None:
    """Why the C codecs and hashes would give other bytes than Python's, or None when they agree."""
    payload = _probe()
    for size in (len(payload), 200):
        part = payload[:size]
        for codec in ("zlib", "lzma"):
            got = compress(part, codec, lib)
            if got != compress_with(part, codec):
                return f"its {codec} gives other bytes than Python's (zlib {zlib.ZLIB_RUNTIME_VERSION} there)"
    digest = np.empty(32, dtype=np.uint8)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if lib.vg_sha256(buf.ctypes.data, buf.size, digest.ctypes.data) != 0:
        return "its SHA-256 failed"
    if digest.tobytes() != hashlib.sha256(payload).digest():
        return "its SHA-256 differs from hashlib's"
    state = np.random.default_rng(20261127).integers(0, 256, size=max(_LEAF_PROBE_SIZES), dtype=np.uint8)
    for size in _LEAF_PROBE_SIZES:
        if lib.vg_leaf(state.ctypes.data, size, digest.ctypes.data) != 0:
            return f"its leaf of {size} bytes failed"
        if digest.tobytes() != leafhash.leaf_of(state[:size]):
            return f"its leaf of {size} bytes differs from leafhash's"
    return None


def _load() -> ctypes.CDLL | None:
    global _lib, _held, _tried, _why
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get(library.ENV_SWITCH, "1") == "0" or os.environ.get(ENV_SWITCH, "1") == "0":
            _why = f"switched off: {library.ENV_SWITCH}=0 or {ENV_SWITCH}=0"
            return None
        if library.address("vg_write_step") == 0:
            _why = "no C kernels"  # the files are written in Python anyway
            return None
        try:
            lib = _open()
            held = _open_held(lib)
        except (OSError, AttributeError) as exc:  # AttributeError: a library of an older writer.c
            _why = f"not built: {exc}"
            log.info("the transcript writer's C call is unavailable (%s): steps are written in Python", exc)
            return None
        _why = _agrees(lib)
        if _why is not None:
            log.info("the transcript writer's C call is not used: %s; steps are written in Python", _why)
            return None
        _lib, _held = lib, held
        return lib


def _running() -> ctypes.CDLL | None:
    if disabled.off or library.disabled.off:
        return None
    return _lib if _tried else _load()


def available() -> bool:
    """Whether :func:`finish_step` writes steps (building the library now if it never was)."""
    return _running() is not None


def describe() -> str:
    """Who writes a trainer's steps here, for ``vgame profiles``: ``c``, or ``python (why)``."""
    if available():
        return "c"
    return "python" if _why is None else f"python ({_why})"


def compress(payload: bytes, codec: str, lib: ctypes.CDLL | None = None) -> bytes | None:
    """``payload`` compressed by ``writer.c`` with "zlib" or "lzma" at the writer's settings
    (:func:`~game.training.log.codec.zlib_level`, :func:`~game.training.log.codec.lzma_dict_size`);
    None where the library is not used."""
    lib = lib or _running()
    if lib is None:
        return None
    buf = np.frombuffer(payload, dtype=np.uint8)
    cap = len(payload) + len(payload) // 8 + 1024
    out = np.empty(cap, dtype=np.uint8)
    n = lib.vg_compress(
        CODECS[codec], buf.ctypes.data, buf.size, zlib_level(buf.size), lzma_dict_size(buf.size),
        out.ctypes.data, cap,
    )  # fmt: skip
    return None if n < 0 else out[:n].tobytes()


def leaf(data: bytes | memoryview | np.ndarray) -> bytes:
    """``leafhash.leaf_of(data)``, in one C call that holds no GIL where the library runs. In Python
    the leaf lets go of the GIL once per 4 KiB chunk (some 325 times for gpt-shakespeare's 1.33 MB
    state), which on a hashing thread slowed the training thread beside it by a fifth."""
    lib = _running()
    if lib is None:
        return leafhash.leaf_of(data)
    buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    digest = np.empty(32, dtype=np.uint8)
    if lib.vg_leaf(buf.ctypes.data, buf.size, digest.ctypes.data) != 0:
        return leafhash.leaf_of(data)
    return digest.tobytes()


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
    lib = _running()
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


def _codec_args(chunk: Compressible) -> tuple[int, int, int]:
    """How the C call compresses ``chunk``'s payload: the codecs to try (a bit ``1 << id`` each),
    zlib's level and lzma's dictionary, as :func:`~game.training.log.codec.compress` would."""
    size = len(chunk.payload)
    tries = sum(1 << CODECS[c] for c in tried_codecs(chunk.codec, size))
    return tries, zlib_level(size), lzma_dict_size(size)


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
        lib = _running()
        if lib is None or _held is None:
            return None
        try:
            return cls(lib, _held)
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


__all__ = [
    "ENV_SWITCH",
    "Ring",
    "StepPaths",
    "available",
    "compress",
    "describe",
    "disabled",
    "finish_step",
    "library_path",
]
