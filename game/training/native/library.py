"""The C kernels' library (``kernels.c``): the off switch, the build cache, compiling and loading.

Why a C library at all: on CPU the torch kernels of :mod:`game.training.numerics.bandcheck` make a
dozen passes over every logged tensor (the candidate filter, ``nonzero``, the band geometry), which
costs as much as the training step itself at paper sizes; ``kernels.c`` does the same integer
arithmetic in one pass (the calls are in :mod:`~game.training.native.bindings`). It is compiled
with the machine's C compiler (``$CC``, else ``cc``) into a cache directory the first time it is
needed (``$VGAME_CACHE_DIR``, else ``$XDG_CACHE_HOME/vgame``, else ``~/.cache/vgame``), keyed by the
source's hash, the flags and the platform. Without a compiler or with ``VGAME_NATIVE=0`` nothing
loads and the torch kernels run instead. :mod:`~game.training.native.writerlib` builds its own
library with the same helpers.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

#: Set to ``0`` to never compile or use the C kernels.
ENV_SWITCH = "VGAME_NATIVE"

#: Compiler flags (part of the cache key). No -ffast-math: the kernels are integer code and exact
#: float64 -> float32 conversions, which it could change. -Wno-psabi: the sieve's helpers take
#: four-lane vectors by value, about which GCC and Clang note an ABI change where AVX is off; they
#: are always inlined, so no call crosses it.
CFLAGS: tuple[str, ...] = ("-O3", "-std=c99", "-shared", "-fPIC", "-fno-fast-math", "-Wno-psabi")

_I64 = ctypes.c_int64
#: Pointers go in as plain addresses (``Tensor.data_ptr()``, ``ndarray.ctypes.data``): a ctypes
#: pointer object costs microseconds to build, which adds up over the ~400 small tensors of a step.
_PTR = ctypes.c_void_p

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


class OffSwitch:
    """A nestable off switch for a fast path: ``with switch(): ...`` runs the reference path
    inside (tests compare both; benchmarks can time both); ``switch.off`` says whether one is open."""

    def __init__(self) -> None:
        self._depth = 0

    @property
    def off(self) -> bool:
        return self._depth > 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1


#: ``with library.disabled():`` runs the torch kernels inside.
disabled = OffSwitch()


def cache_dir() -> Path:
    """Where compiled kernels are kept."""
    explicit = os.environ.get("VGAME_CACHE_DIR")
    if explicit:
        return Path(explicit) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vgame" / "native"


def _source() -> bytes:
    return resources.files(__package__).joinpath("kernels.c").read_bytes()


def library_path() -> Path:
    """Where the compiled kernels are (or will be) kept: keyed by the source, the flags and the platform."""
    tag = "|".join([platform.machine(), platform.system(), *CFLAGS]).encode()
    key = hashlib.sha256(_source() + tag).hexdigest()
    return cache_dir() / f"kernels-{key[:16]}.so"


def compile_library(
    source: bytes, target: Path, *, name: str = "kernels.c", libs: Sequence[str] = ()
) -> None:
    """Compile ``source`` (a C file called ``name``) into the shared library ``target``, linked with
    ``libs`` (``-l`` flags), atomically: a temporary file, then a rename. ``OSError`` with the
    compiler's message when it fails."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler found (set CC, or install cc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / name
        src.write_bytes(source)
        out = Path(tmp) / target.name
        cmd = [cc, *CFLAGS, "-o", str(out), str(src), *libs]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(cmd[: len(CFLAGS) + 1])} failed: {done.stderr.strip()[:500]}")
        os.replace(out, target)


def open_library(
    source: bytes, target: Path, *, name: str = "kernels.c", libs: Sequence[str] = ()
) -> ctypes.CDLL:
    """The shared library ``target`` built from ``source`` (:func:`compile_library`), loaded; built
    now if it never was, or again if it does not load (a damaged cache entry: disk trouble, a
    foreign file). ``OSError`` when it cannot be built or loaded."""
    if not target.exists():
        compile_library(source, target, name=name, libs=libs)
    try:
        return ctypes.CDLL(str(target))
    except OSError:
        compile_library(source, target, name=name, libs=libs)
        return ctypes.CDLL(str(target))


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get(ENV_SWITCH, "1") == "0":
            log.info("native kernels switched off (%s=0): using the torch kernels", ENV_SWITCH)
            return None
        try:
            lib = open_library(_source(), library_path())
        except OSError as exc:
            log.warning("native kernels unavailable (%s): using the torch kernels", exc)
            return None
        lib.vg_round_and_band.restype = _I64
        lib.vg_round_and_band.argtypes = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR]
        lib.vg_round_with_entries.restype = _I64
        lib.vg_round_with_entries.argtypes = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR]
        lib.vg_round_inplace.restype = _I64
        lib.vg_round_inplace.argtypes = [_PTR, _I64, _I64, _I64]
        lib.vg_to_float32.restype = _I64
        lib.vg_to_float32.argtypes = [_PTR, _PTR, _PTR, _I64, _PTR]
        lib.vg_uvarint_encode.restype = _I64
        lib.vg_uvarint_encode.argtypes = [_PTR, _I64, _PTR]
        lib.vg_uvarint_decode.restype = _I64
        lib.vg_uvarint_decode.argtypes = [_PTR, _I64, _I64, _PTR]
        lib.vg_sparse_rows.restype = _I64
        lib.vg_sparse_rows.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64]
        lib.vg_sparse_body.restype = _I64
        lib.vg_sparse_body.argtypes = [_PTR, _I64, _PTR, _I64, _PTR]
        lib.vg_round_and_trits.restype = _I64
        lib.vg_round_and_trits.argtypes = [_PTR, _I64, _I64, _I64, _I64, _PTR]
        lib.vg_round_with_trits.restype = _I64
        lib.vg_round_with_trits.argtypes = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR]
        lib.vg_pack_trit_blocks.restype = None
        lib.vg_pack_trit_blocks.argtypes = [_PTR, _I64, _PTR]
        lib.vg_unpack_trit_blocks.restype = _I64
        lib.vg_unpack_trit_blocks.argtypes = [_PTR, _I64, _PTR]
        lib.vg_init.restype = None
        lib.vg_init.argtypes = []
        lib.vg_init()  # the kernels' tables, before any of them runs
        lib.vg_philox_stream.restype = None
        lib.vg_philox_stream.argtypes = [_I64, _PTR, _I64, _I64, _I64, _I64, _PTR]
        lib.vg_philox_scaled_keep.restype = None
        lib.vg_philox_scaled_keep.argtypes = [_I64, _PTR, _I64, _I64, _I64, _I64, _I64, ctypes.c_double, _PTR]
        lib.vg_write_step.restype = _I64
        _path = ctypes.c_char_p
        lib.vg_write_step.argtypes = [
            *(_path, _path, _path, _PTR, _I64),  # the chunk
            *(_path, _PTR),  # its hash
            *(_path, _path, _path, _PTR, _I64),  # the checkpoint
            *(_path, _PTR, _PTR),  # the leaf, where it failed
        ]
        _lib = lib
        return lib


def available() -> bool:
    """Whether the C kernels run: loaded (compiling them now if they never were), and not inside
    :func:`disabled`."""
    return not disabled.off and _load() is not None


def _running() -> ctypes.CDLL | None:
    """The loaded kernels, or None (not built, or inside :func:`disabled`); no lock once loaded
    (the hot paths ask on every call)."""
    if disabled.off:
        return None
    return _lib if _tried else _load()


#: Kernel addresses looked up so far (the library is loaded once a process).
_addresses: dict[str, int] = {}


def address(name: str) -> int:
    """A kernel's address, for the C++ dispatch front to call it without Python; 0 where the
    kernels do not run (not built, or inside :func:`disabled`)."""
    lib = _running()
    if lib is None:
        return 0
    found = _addresses.get(name)
    if found is None:
        found = _addresses[name] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
    return found


__all__ = [
    "CFLAGS",
    "ENV_SWITCH",
    "OffSwitch",
    "address",
    "available",
    "cache_dir",
    "compile_library",
    "disabled",
    "library_path",
    "open_library",
]
