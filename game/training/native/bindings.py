"""The calls into the C kernels (``kernels.c``, loaded by :mod:`~game.training.native.library`).

What they do in one pass, where torch or numpy needs many: the sparse log's round-and-band and
replay (the torch kernels of :mod:`game.training.numerics.bandcheck` make a dozen passes over every
logged tensor), the packed log's trits, the sparse log's varints, the RNG's Philox words
(:func:`philox_stream`), and a transcript step's files in one call that holds no GIL
(:func:`write_step`). Each returns None (or False) where the reference path must run: not loaded,
``VGAME_NATIVE=0``, a CUDA tensor, or rare lanes (float32-subnormal range, past the range, inf,
NaN); the results are the same bit for bit (tests/training/test_native.py holds them to it), and
the reference path words every error.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from game.fsio import temp_name
from game.training.native.library import _running

#: Up to this many values the trainer kernel lists positions into a reusable per-thread buffer.
_SCRATCH_MAX = 1 << 20
_scratch = threading.local()

#: The kernels read and write 8-byte lanes: float64 values (as their bit patterns) or int64 views.
_LANES = (torch.float64, torch.int64)


def _usable(*tensors: Tensor) -> ctypes.CDLL | None:
    for t in tensors:
        if not t.is_cpu or t.dtype not in _LANES or not t.is_contiguous():
            return None
    return _running()


def _positions_buffer(n: int) -> tuple[Tensor, int]:
    """Room for ``n`` positions and its address: this thread's reusable buffer for small tensors,
    else a fresh one (the address is kept with the buffer: asking numpy or torch for it each call
    cost microseconds)."""
    if n > _SCRATCH_MAX:
        fresh = torch.empty(n, dtype=torch.int64)  # untouched pages cost nothing
        return fresh, fresh.data_ptr()
    entry: tuple[Tensor, int] | None = getattr(_scratch, "buf", None)
    if entry is None or entry[0].numel() < n:
        buf = torch.empty(max(n, 1 << 12), dtype=torch.int64)
        entry = _scratch.buf = (buf, buf.data_ptr())
    return entry


def _stats_buffer() -> tuple[np.ndarray, int]:
    """This thread's two int64 slots for a kernel's counts, and their address."""
    entry: tuple[np.ndarray, int] | None = getattr(_scratch, "stats", None)
    if entry is None:
        stats = np.zeros(2, dtype=np.int64)
        entry = _scratch.stats = (stats, stats.ctypes.data)
    return entry


#: The trainer kernel's result for a tensor with no listed value (most): one shared, never written.
_NO_POSITIONS = torch.empty(0, dtype=torch.int64)


class BandParams(NamedTuple):
    """The integers a kernel needs: the grid (``k0``, its largest finite pattern) and the band."""

    k0: int
    max_finite: int
    rel: int
    abs: int


def round_and_band(xf: Tensor, p: BandParams) -> Tensor | None:
    """Trainer kernel, **in place** on a contiguous CPU tensor of float64 values (or their int64
    view), any shape: rounds it and returns the flat positions; None, with ``xf`` untouched, when the
    torch kernel must do it (rare lanes)."""
    lib = _usable(xf)
    if lib is None or xf.numel() == 0:
        return None
    n = xf.numel()
    out, address = _positions_buffer(n)
    m = lib.vg_round_and_band(xf.data_ptr(), n, p.k0, p.max_finite, p.rel, p.abs, address)
    if m < 0:
        return None
    return _NO_POSITIONS if m == 0 else out[:m].clone()


def round_inplace(xf: Tensor, k0: int, max_finite: int) -> bool:
    """Round a contiguous CPU float64 tensor (or its int64 view) in place, nearest, ties to even;
    False: use the torch kernel (then some lanes may be rounded already, which rounding again
    leaves as they are)."""
    lib = _usable(xf)
    if lib is None or xf.numel() == 0:
        return False
    return bool(lib.vg_round_inplace(xf.data_ptr(), xf.numel(), k0, max_finite) == 0)


def rounded_copy(x: Tensor, k0: int, max_finite: int) -> Tensor | None:
    """A rounded copy of a CPU float64 tensor (contiguous, ``x``'s shape, detached): one copy and
    one C pass, where torch's float32 round trip takes a scan, two conversions and a few small
    calls. None where :func:`round_inplace` would be False (the caller's own path then)."""
    if x.dtype != torch.float64 or not x.is_cpu or x.numel() == 0 or _running() is None:
        return None
    out = x.detach().clone(memory_format=torch.contiguous_format)
    return out if round_inplace(out, k0, max_finite) else None


def round_and_trits(xf: Tensor, k0: int, max_finite: int, threshold: int) -> Tensor | None:
    """Packed-log trainer kernel, **in place** on a contiguous CPU float64 tensor (or its int64 view):
    rounds it and returns its flat uint8 trits; None, with ``xf`` untouched, when the torch kernel
    must do it (rare lanes). ``threshold``: ``floor(tau * step)`` in float64 ulps."""
    lib = _usable(xf)
    if lib is None or xf.numel() == 0:
        return None
    trits = torch.empty(xf.numel(), dtype=torch.uint8)
    if lib.vg_round_and_trits(xf.data_ptr(), xf.numel(), k0, max_finite, threshold, trits.data_ptr()) != 0:
        return None
    return trits


def round_with_trits(xf: Tensor, p: BandParams, trits: Tensor) -> int | None:
    """Packed-log auditor kernel, **in place** on a contiguous CPU float64 tensor (or its int64 view),
    with the trainer's flat uint8 trits: checks the moved lanes' bands, rounds, returns how many
    moved; None, with ``xf`` untouched, when the torch kernel must do it (rare lanes, a trit above 2,
    a moved lane outside its band: the torch kernel words the error)."""
    lib = _usable(xf)
    if lib is None or xf.numel() == 0 or trits.numel() != xf.numel():
        return None
    if not trits.is_cpu or trits.dtype != torch.uint8 or not trits.is_contiguous():
        return None
    _, stats = _stats_buffer()
    moved = lib.vg_round_with_trits(
        xf.data_ptr(), xf.numel(), p.k0, p.max_finite, p.rel, p.abs, trits.data_ptr(), stats
    )
    return None if moved < 0 else int(moved)


class Replay(NamedTuple):
    """What the auditor kernel counted."""

    corrections: int
    free: int  # -1 when not counted


def round_with_entries(xf: Tensor, p: BandParams, positions: Tensor, count_free: bool) -> Replay | None:
    """Auditor kernel, **in place** on a contiguous CPU float64 tensor (or its int64 view), with the
    trainer's flat positions: ``(corrections, free)``; None, with ``xf`` untouched, when the torch
    kernel must do it (rare lanes, a listed zero, positions out of order or out of range, or an
    entry outside the band: the torch kernel words the error)."""
    lib = _usable(xf, positions)
    if lib is None or xf.numel() == 0:
        return None
    stats, address = _stats_buffer()
    rc = lib.vg_round_with_entries(
        xf.data_ptr(), xf.numel(), p.k0, p.max_finite, p.rel, p.abs,
        positions.data_ptr(), positions.numel(), int(count_free), address,
    )  # fmt: skip
    if rc != 0:
        return None
    return Replay(int(stats[0]), int(stats[1]))


def to_float32(tensors: list[Tensor]) -> list[np.ndarray] | None:
    """Contiguous CPU float64 tensors (the state's, or slices of them) as float32 arrays, views into
    one buffer, in one call; None: use torch (no kernels, a tensor the kernel cannot take, a lane off
    the float32 grid, whose error the caller words)."""
    if not tensors:
        return []
    counts = np.array([t.numel() for t in tensors], dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=np.float32)
    ends = np.cumsum(counts)
    if not to_float32_into(tensors, out.view(np.uint8), 4 * (ends - counts)):
        return None
    bounds = ends.tolist()  # views by slicing: np.split costs 4 us a piece
    return [out[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]


def to_float32_into(tensors: list[Tensor], out: np.ndarray, offsets: np.ndarray) -> bool:
    """Write contiguous CPU float64 tensors as little-endian float32 into the uint8 array ``out``,
    each at its byte offset (any alignment), in one call. False, with ``out`` partly written: use
    torch (no kernels, a big-endian machine, a tensor the kernel cannot take, a lane off the
    float32 grid, whose error the caller words)."""
    if not tensors:
        return True
    if _usable(*tensors) is None or any(t.dtype != torch.float64 for t in tensors):
        return False
    return float32_at(
        [t.data_ptr() for t in tensors], [t.numel() for t in tensors], np.asarray(offsets).tolist(), out
    )


def float32_at(
    addresses: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    offsets: Sequence[int] | np.ndarray,
    out: np.ndarray,
) -> bool:
    """:func:`to_float32_into` for a caller that has checked its tensors already (contiguous float64
    on the CPU) and gives their addresses and value counts (lists, or int64 arrays it can keep from
    step to step): a state's 100-odd tensors cost a Python call or two each to check again."""
    lib = _running()
    if lib is None or sys.byteorder != "little":
        return False
    if out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("float32 conversion: out must be a writable contiguous uint8 array")
    at = np.asarray(offsets, dtype=np.int64)
    n = np.asarray(counts, dtype=np.int64)
    if not (len(at) == len(n) == len(addresses)) or (at < 0).any() or (at + 4 * n > len(out)).any():
        raise ValueError("float32 conversion: a tensor does not fit in out at its offset")
    if len(addresses) == 0:
        return True
    addrs = np.asarray(addresses, dtype=np.int64)
    return bool(
        lib.vg_to_float32(addrs.ctypes.data, n.ctypes.data, at.ctypes.data, len(addrs), out.ctypes.data) == 0
    )


def uvarint_encode(values: np.ndarray) -> bytes | None:
    """LEB128 of int64 ``values`` (log.codec.uvarint_encode's bytes); None: use the numpy encoder
    (no kernels, or a negative value, whose error it words)."""
    lib = _running()
    if lib is None:
        return None
    v = np.ascontiguousarray(values, dtype=np.int64)
    out = np.empty(9 * v.size, dtype=np.uint8)
    n = lib.vg_uvarint_encode(v.ctypes.data, v.size, out.ctypes.data)
    return None if n < 0 else out[:n].tobytes()


def uvarint_decode(buf: np.ndarray, start: int, count: int) -> tuple[np.ndarray, int] | None:
    """``count`` LEB128 values from the uint8 array ``buf[start:]`` and the position after them;
    None: use the numpy decoder (no kernels, or malformed bytes, whose error it words)."""
    lib = _running()
    if lib is None or buf.dtype != np.uint8 or not buf.flags.c_contiguous:
        return None
    view = buf[start:]
    out = np.empty(count, dtype=np.int64)
    n = lib.vg_uvarint_decode(view.ctypes.data, view.size, count, out.ctypes.data)
    return None if n < 0 else (out, start + n)


def sparse_rows(buf: np.ndarray, start: int, n: int, n_names: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A sparse chunk's records from the uint8 array ``buf[start:]`` (after its name table), as
    :func:`game.training.log.sparse._parse_payload` reads them: the (n, 4) table with op indices, and the positions.
    None: use the numpy code (no kernels, or anything malformed, whose error it words)."""
    lib = _running()
    if lib is None or buf.dtype != np.uint8 or not buf.flags.c_contiguous:
        return None
    view = buf[start:]
    table = np.empty((n, 4), dtype=np.int64)
    positions = np.empty(view.size, dtype=np.int64)  # each position takes a byte at least
    m = lib.vg_sparse_rows(
        view.ctypes.data, view.size, n, n_names, table.ctypes.data, positions.ctypes.data, view.size
    )
    return None if m < 0 else (table, positions[:m])


def sparse_body(table: np.ndarray, positions: np.ndarray) -> bytes | None:
    """A sparse chunk's payload after its name table, from the (n, 4) int64 table of (op index,
    name id, value count, entry count) and every record's positions one after another, as
    :meth:`SparseStepLog.encode` writes it. None: use the numpy code (no kernels, or values it
    refuses: op indices or a record's positions not increasing, entry counts that do not add up)."""
    lib = _running()
    if lib is None:
        return None
    t = np.ascontiguousarray(table, dtype=np.int64)
    p = np.ascontiguousarray(positions, dtype=np.int64)
    if t.ndim != 2 or t.shape[1] != 4 or p.ndim != 1:
        return None
    out = np.empty(9 * (t.size + p.size), dtype=np.uint8)
    n = lib.vg_sparse_body(t.ctypes.data, t.shape[0], p.ctypes.data, p.size, out.ctypes.data)
    return None if n < 0 else out[:n].tobytes()


#: ``vg_write_step``'s numbers for the file it failed on.
STEP_FILES = {1: "chunk", 2: "chunk hashes", 3: "checkpoint", 4: "leaves"}


def write_step(
    chunk_path: Path,
    chunk: bytes,
    hashes_path: Path,
    chunk_hash: bytes,
    checkpoint_path: Path | None,
    checkpoint: bytes | memoryview | None,
    leaves_path: Path,
    leaf: bytes,
) -> bool:
    """Write a transcript step's files in one C call, which holds no GIL (``vg_write_step`` in
    kernels.c says why): the chunk and the checkpoint as :func:`game.fsio.atomic_write` writes a
    file, the hashes as :func:`game.fsio.append_fsync` appends them, in that order. False: nothing
    was written (no kernels, or a platform without them), write them in Python. Raises ``OSError``
    naming the file that failed; nothing after it was written."""
    lib = _running()
    if lib is None:
        return False
    if len(chunk_hash) != 32 or len(leaf) != 32:
        raise ValueError("a chunk hash and a leaf are 32 bytes")
    buffers = [np.frombuffer(b, dtype=np.uint8) for b in (chunk, chunk_hash, leaf)]
    ckpt = None if checkpoint is None else np.frombuffer(checkpoint, dtype=np.uint8)
    ckpt_paths: list[bytes | None] = [None, None, None]
    if checkpoint_path is not None:
        if ckpt is None:
            raise ValueError("a checkpoint path needs the checkpoint's bytes")
        ckpt_paths = [
            os.fsencode(p) for p in (checkpoint_path, temp_name(checkpoint_path), checkpoint_path.parent)
        ]
    failed = np.zeros(1, dtype=np.int64)
    err = lib.vg_write_step(
        os.fsencode(chunk_path),
        os.fsencode(temp_name(chunk_path)),
        os.fsencode(chunk_path.parent),
        buffers[0].ctypes.data,
        buffers[0].size,
        os.fsencode(hashes_path),
        buffers[1].ctypes.data,
        *ckpt_paths,
        0 if ckpt is None else ckpt.ctypes.data,
        0 if ckpt is None else ckpt.size,
        os.fsencode(leaves_path),
        buffers[2].ctypes.data,
        failed.ctypes.data,
    )
    if err < 0:
        return False
    if err > 0:
        where = {1: chunk_path, 2: hashes_path, 3: checkpoint_path, 4: leaves_path}[int(failed[0])]
        raise OSError(err, f"{os.strerror(err)} (the step's {STEP_FILES[int(failed[0])]})", str(where))
    return True


def pack_trit_blocks(trits: np.ndarray, blocks: int) -> bytes | None:
    """The first ``blocks`` blocks of the uint8 trits (each 0..2) as log.trits.pack_trits lays them
    out; None: use the numpy packer."""
    lib = _running()
    if lib is None:
        return None
    t = np.ascontiguousarray(trits, dtype=np.uint8)
    out = np.empty(23 * blocks, dtype=np.uint8)
    lib.vg_pack_trit_blocks(t.ctypes.data, blocks, out.ctypes.data)
    return out.tobytes()


def unpack_trit_blocks(data: np.ndarray, blocks: int, out: np.ndarray) -> bool:
    """Write ``116 * blocks`` trits from the uint8 array ``data`` to the start of the uint8 array
    ``out``; False: use the numpy unpacker (no kernels, or a group out of range, whose error it words)."""
    lib = _running()
    if lib is None or not all(a.dtype == np.uint8 and a.flags.c_contiguous for a in (data, out)):
        return False
    if data.size < 23 * blocks or out.size < 116 * blocks:
        return False
    return bool(lib.vg_unpack_trit_blocks(data.ctypes.data, blocks, out.ctypes.data) == 0)


def philox_stream(step: int, ids: Tensor | None, count: int, key: tuple[int, int]) -> Tensor | None:
    """The RNG's stream words (rng.stream's bits) on CPU: int64 ``[len(ids), count]`` (one row of id 0
    when ``ids`` is None); None: use the torch code (no kernels). The caller has checked the step and
    the ids fit 32 bits."""
    lib = _running()
    if lib is None:
        return None
    rows, address, _held = _stream_rows(ids)  # the ids' tensor, alive through the call
    out = torch.empty((rows, count), dtype=torch.int64)
    lib.vg_philox_stream(step, address, rows, count, key[0], key[1], out.data_ptr())
    return out


def philox_scaled_keep(
    step: int, ids: Tensor | None, count: int, key: tuple[int, int], threshold: int, value: float
) -> Tensor | None:
    """Dropout's scaled keep mask on CPU (rng.scaled_keep's values): float64 ``[len(ids), count]``,
    ``value`` where :func:`philox_stream`'s word is below ``threshold``, else 0; None: use the
    torch code (no kernels). The caller has checked the step and the ids fit 32 bits."""
    lib = _running()
    if lib is None:
        return None
    rows, address, _held = _stream_rows(ids)  # the ids' tensor, alive through the call
    out = torch.empty((rows, count), dtype=torch.float64)
    lib.vg_philox_scaled_keep(step, address, rows, count, key[0], key[1], threshold, value, out.data_ptr())
    return out


def _stream_rows(ids: Tensor | None) -> tuple[int, int | None, Tensor | None]:
    """A draw's rows (1 without ids), the address of its ids as contiguous int64 (None without
    them), and that tensor, to be held until the call has read it."""
    if ids is None:
        return 1, None, None
    ids = ids.to(dtype=torch.int64).contiguous()
    return ids.numel(), ids.data_ptr() if ids.numel() else None, ids


__all__ = [
    "STEP_FILES",
    "BandParams",
    "Replay",
    "float32_at",
    "pack_trit_blocks",
    "philox_scaled_keep",
    "philox_stream",
    "round_and_band",
    "round_and_trits",
    "round_inplace",
    "round_with_entries",
    "round_with_trits",
    "rounded_copy",
    "sparse_body",
    "sparse_rows",
    "to_float32",
    "unpack_trit_blocks",
    "uvarint_decode",
    "uvarint_encode",
    "write_step",
]
