"""The transcript writer's C library (``writer.c``): its source, build, load and ``ctypes`` signatures,
and whether it is used.

Why a library of its own: the trainer's thread runs beside the writer's. Done in Python, a step's
writing lets the GIL go and takes it back five times (zlib, lzma's two calls, the state's hash, the
files), and each time the writer's thread takes it back, the trainer's thread waits for it between
two torch ops: on cnn-digits that cost the trainer some 0.05-0.1x of a plain float64 step
(docs/benchmarks.md). Its calls are made by :mod:`game.training.transcript.stepwriter` (a step in one
call, or on the library's own thread), :mod:`game.training.state.leafnative` (a state's leaf) and,
on the reader's side, :mod:`game.training.log.inflate` (a chunk's zlib payload inflated).

``writer.c`` links zlib, liblzma and OpenSSL's libcrypto. It is compiled like the C kernels, into
their cache directory, the first time a caller needs it. It is not used where it cannot be built (no
compiler, or no headers of those libraries), with ``VGAME_NATIVE=0`` or ``VGAME_WRITER=0``, inside
:func:`disabled` or :func:`game.training.native.library.disabled`, or where a probe says it would not
give the bytes Python gives: the modules that call it register their probes (:func:`add_probe`: its
codecs and SHA-256, its leaf), and every probe registered runs once a process, when the library
loads (or when it registers, if later). Where it is not used, :func:`running` returns None and the
callers do the same in Python, to the same bytes.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from game.training.native import library

log = logging.getLogger(__name__)

#: Set to ``0`` to write every step in Python (``VGAME_NATIVE=0`` also does).
ENV_SWITCH = "VGAME_WRITER"
#: What ``writer.c`` links.
LIBS: tuple[str, ...] = ("-lz", "-llzma", "-lcrypto", "-pthread")

#: ``with writerlib.disabled():`` writes every step (and hashes every leaf) in Python inside.
disabled = library.OffSwitch()

#: A check of the loaded library against Python: why it would give other bytes, or None.
Probe = Callable[[ctypes.CDLL], str | None]

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_PATH = ctypes.c_char_p
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
#: The same library, loaded so that its calls keep the GIL: the ring's quick calls, made on the
#: trainer's thread, then neither let the GIL go nor wait to take it back.
_held: ctypes.PyDLL | None = None
_tried = False
_why: str | None = None  # why the library is not used, once a load found out
_probes: list[tuple[int, Probe]] = []  # (order, probe), run in that order


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
    lib.vg_compress.argtypes = [_I64, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _I64]
    lib.vg_sha256.restype = _I64
    lib.vg_sha256.argtypes = [_PTR, _I64, _PTR]
    lib.vg_chunk_leaf.restype = _I64
    lib.vg_chunk_leaf.argtypes = [_PTR, _I64, _PTR]
    lib.vg_leaf.restype = _I64
    lib.vg_leaf.argtypes = [_PTR, _I64, _PTR]
    lib.vg_inflate.restype = _I64
    lib.vg_inflate.argtypes = [_PTR, _I64, _PTR, _I64, _PTR, ctypes.c_char_p]
    lib.vg_finish_step.restype = _I64
    lib.vg_finish_step.argtypes = [
        *(_PTR, _I64, _I64, _PTR, _I64),  # head, codec byte, payload
        *(_I64,) * 5,  # the codecs tried; zlib's level, block and threads; lzma's dictionary
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
        *(_I64,) * 5,  # the codecs tried; zlib's level, block and threads; lzma's dictionary
        *(_PTR, _I64, _I64),  # the state, whether it is the checkpoint too
        *(_PATH,) * 8,  # the paths, as vg_finish_step takes them
    ]
    for name in ("vg_ring_pushed", "vg_ring_done"):
        getattr(held, name).restype = _I64
        getattr(held, name).argtypes = [_PTR]
    held.vg_ring_result.restype = _I64
    held.vg_ring_result.argtypes = [_PTR, _I64, _PTR, _PTR]
    return held


def add_probe(probe: Probe, *, order: int) -> None:
    """Have ``probe`` decide, with the others, whether the library is used (the probes run in
    ``order``; the first that disagrees says why). Where the library is already used, it runs now,
    and a disagreement turns the library down from here on."""
    global _lib, _held, _why
    with _lock:
        _probes.append((order, probe))
        _probes.sort(key=lambda entry: entry[0])
        if _lib is None:
            return
        why = probe(_lib)
        if why is not None:
            _lib, _held, _why = None, None, why
            log.info("the transcript writer's C call is not used: %s; steps are written in Python", why)


def _agrees(lib: ctypes.CDLL) -> str | None:
    """Why the library would give other bytes than Python's (the first probe that says so), or None."""
    for _, probe in _probes:
        why = probe(lib)
        if why is not None:
            return why
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


def running() -> ctypes.CDLL | None:
    """The library where it is used (loading and probing it now if it never was), else None."""
    if disabled.off or library.disabled.off:
        return None
    return _lib if _tried else _load()


def held() -> ctypes.PyDLL | None:
    """The library loaded so that its calls keep the GIL, once :func:`running` gave the library."""
    return _held


def available() -> bool:
    """Whether the library is used (building it now if it never was)."""
    return running() is not None


def describe() -> str:
    """Who writes a trainer's steps here, for ``vgame profiles``: ``c``, or ``python (why)``."""
    if available():
        return "c"
    return "python" if _why is None else f"python ({_why})"


__all__ = [
    "ENV_SWITCH",
    "LIBS",
    "Probe",
    "add_probe",
    "available",
    "describe",
    "disabled",
    "held",
    "library_path",
    "running",
]
