"""A chunk's zlib payload inflated, in one C call that holds no GIL where the library runs
(``vg_inflate`` of :mod:`~game.training.native.writerlib`), else by Python's zlib: the same bytes,
and the same refusals.

Why: an auditor reads the next step's chunk on a thread of its own while the step runs
(:class:`~game.training.transcript.readahead.ReadAhead`). Python's ``decompressobj`` lets the GIL
go and takes it back for every block of output it grows, some eight times for a GPT-2-shape
chunk's 7-16 MB, and each time it waits while the step's own thread holds the GIL. Beside a thread
of Python, a 6.6-million-entry chunk took 100-105 ms to read, against 46-50 ms alone; with the C
call, 70-83 ms (docs/benchmarks.md).

What a refusal means (:class:`Refused`) is worded by :func:`game.training.log.codec.decompress`, in
one place for both ways. Where the C call would refuse a stream other than Python does, or give
other bytes (another zlib), a probe finds it once a process and this module keeps to Python.
"""

from __future__ import annotations

import ctypes
import threading
import zlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from game.training.native import writerlib


@dataclass(frozen=True)
class Refused:
    """Why a zlib stream is not a payload of the stated size: it does not end within the input and
    that size and one byte more (``unfinished``: truncated, or longer), bytes follow its end
    (``trailing``, ``count`` of them), or zlib refused it (``zlib``: ``message`` is what Python's
    ``zlib.error`` says, :func:`zlib_words`)."""

    why: Literal["unfinished", "trailing", "zlib"]
    count: int = 0
    message: str = ""


def zlib_words(code: int, message: str) -> str:
    """What Python's ``zlib.error`` says of an inflate that failed with ``code`` and zlib's
    ``message`` (which may be empty), so that the C call's refusal reads the same."""
    return f"Error {code} while decompressing data" + (f": {message}" if message else "")


def inflate(body: bytes, cap: int) -> bytes | Refused:
    """The zlib stream ``body`` inflated, at most ``cap`` bytes of it (a payload's stated size and
    one more: no decompression bomb), or why not."""
    lib = _library()
    if lib is not None:
        got = _inflate_c(lib, body, cap)
        if got is not None:
            return got
    return inflate_python(body, cap)


def inflate_python(body: bytes, cap: int) -> bytes | Refused:
    """:func:`inflate` by Python's zlib (the reference: the C call must agree with it)."""
    z = zlib.decompressobj()
    try:
        out = z.decompress(body, cap)
    except zlib.error as exc:
        return Refused("zlib", message=str(exc))
    if not z.eof:
        return Refused("unfinished")
    if z.unused_data:
        return Refused("trailing", len(z.unused_data))
    return out


def _inflate_c(lib: ctypes.CDLL, body: bytes, cap: int) -> bytes | Refused | None:
    """``vg_inflate``: the payload, why not, or None (the library failed: Python's way then)."""
    src = np.frombuffer(body, dtype=np.uint8)
    out = np.empty(max(cap, 1), dtype=np.uint8)
    detail = np.zeros(1, dtype=np.int64)
    message = ctypes.create_string_buffer(256)
    got = int(lib.vg_inflate(src.ctypes.data, src.size, out.ctypes.data, cap, detail.ctypes.data, message))
    if got >= 0:
        return out[:got].tobytes()
    if got == -1:
        return Refused("unfinished")
    if got == -2:
        return Refused("trailing", int(detail[0]))
    if got == -3:
        return Refused("zlib", message=zlib_words(int(detail[0]), message.value.decode("utf-8", "replace")))
    return None


def _probe_streams() -> list[tuple[bytes, int]]:
    """Streams and caps on which the C call must do what Python does: whole ones (in one piece and
    in the writer's blocks), and broken ones of every kind the three ways can tell apart."""
    payload = np.random.default_rng(20261129).integers(0, 7, size=200_000, dtype=np.uint8).tobytes()
    one = zlib.compress(payload, 6)
    z = zlib.compressobj(1)  # flushed to a byte boundary halfway, as the writer's blocks are
    flushed = (
        z.compress(payload[:70_000]) + z.flush(zlib.Z_SYNC_FLUSH) + z.compress(payload[70_000:]) + z.flush()
    )
    n = len(payload)
    cases = [(one, n + 1), (flushed, n + 1), (one, n), (one, n - 1), (one[:-9], n + 1), (one + b"x", n + 1)]
    cases += [(b"", 1), (b"\x78\x9c", 1), (zlib.compress(b"", 9), 1), (b"\x78\xbb\x00\x00\x00\x00", 1)]
    for at in (0, 1, 2, 5, 100, len(one) // 2, len(one) - 2):  # a bit turned over at each
        cases.append((one[:at] + bytes([one[at] ^ 0x40]) + one[at + 1 :], n + 1))
    return cases


def _agrees(lib: ctypes.CDLL) -> str | None:
    """Why the C call would inflate or refuse a stream other than Python does, or None."""
    for i, (body, cap) in enumerate(_probe_streams()):
        if _inflate_c(lib, body, cap) != inflate_python(body, cap):
            return f"its inflate differs from Python's on probe stream {i} (zlib {zlib.ZLIB_RUNTIME_VERSION})"
    return None


_lock = threading.Lock()
_probed: tuple[ctypes.CDLL, bool] | None = None  # the library probed, and whether it agrees


def _library() -> ctypes.CDLL | None:
    """The writer's library where it runs (not with ``VGAME_NATIVE=0`` or ``VGAME_WRITER=0``) and
    its inflate agrees with Python's: probed once a process, and a disagreement keeps this module to
    Python, not the writer."""
    global _probed
    lib = writerlib.running()
    if lib is None:
        return None
    with _lock:
        if _probed is None or _probed[0] is not lib:
            _probed = (lib, _agrees(lib) is None)
        return lib if _probed[1] else None


__all__ = ["Refused", "inflate", "inflate_python", "zlib_words"]
