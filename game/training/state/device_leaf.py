"""The state hash (leaf, :mod:`~game.training.state.leafhash`) computed on the state's own device.

Why: a leaf hashed on the host means copying the whole state there and hashing it on one thread,
every step: 1.1 s a step at the GPT-2-small shape on an H100. The chunked leaf (``vgame-leaf-v2``)
lets a GPU do it: every 4096-byte chunk of the canonical bytes is hashed independently, one chunk
per GPU thread, level by level, until at most 4096 bytes remain; only those (a few hundred bytes)
and the grid check's result cross to the host, where :func:`leafhash.finish` takes the tagged last
hash.

What it computes, bit for bit what the host computes:

* :func:`canonical_bytes_on_device`: :func:`~game.training.state.canonical.encode_state`'s bytes,
  built where the state lives. The fixed bytes (magic, tensor count, every tensor's name, dtype tag and shape,
  zero padding to 64 bytes) are a device tensor cached per structure; the float64 tensors are
  joined in one ``torch.cat``, converted to float32 in one launch and checked against the grid on
  the device (a flag, the first off-grid position and its value, none of them read back there);
  one more ``torch.cat`` joins the fixed pieces and the values (viewed as bytes). Tensors left on
  the host (an optimizer's ``step`` counters beside a GPU state) travel with the step number in one
  pinned buffer and one copy.
* :func:`~.sha256_kernel.device_levels`: the SHA-256 Triton kernel
  (:func:`~.sha256_kernel.hash_chunks`: one chunk a lane, :data:`~.sha256_kernel.BLOCK` lanes a program, each lane's SHA-256 padding done in the kernel) once per level.
* :class:`DeviceLeaf`: both, then one non-blocking copy of (last level, flag, position, value) into
  pinned host memory behind a CUDA event; :meth:`DeviceLeaf.leaf` waits for the event (the GIL
  released) and finishes the hash, or raises the
  :class:`~game.training.state.tensors.OffGridError` the host path raises (``canonical.on_grid_float32`` on the first off-grid value, naming its tensor).

Launches per leaf on CUDA, with nothing waited for until :meth:`DeviceLeaf.leaf` (or
:meth:`DeviceLeaf.canonical_bytes`): one host-to-device copy (the step number and any host
tensors), the float64 ``cat`` (torch batches its inputs: a few launches), the float32 conversion,
four for the grid check (compare, ``any``, ``argmax``, ``index_select``), the bytes' ``cat`` (a few
launches), one SHA-256 kernel a level (three for 1 GB of float64 state: 512 MB, 4 MB, 32 KB of
input), one small ``cat`` and one device-to-host copy. Transient device memory: the float64 copy,
the float32 values, one byte a value for the check, and the canonical bytes (which the
:class:`DeviceLeaf` keeps for :meth:`~DeviceLeaf.canonical_bytes`): about 2.1 times the float64
state.

Tests (``tests/training/test_cuda_leaf.py``) check the bytes against ``encode_state``, byte for
byte, and the leaf against the host's, in Triton's interpreter on CPU tensors or on a GPU.
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from game.errors import TrainingError
from game.training.state import leafhash, sha256_kernel
from game.training.state.canonical import (
    STATE_MAGIC,
    Structure,
    on_grid_float32,
    structure,
    tag_width,
    tensor_header,
    written_tag,
)
from game.training.state.tensors import OffGridError, TrainState, state_tensors


@dataclass(frozen=True)
class _Plan:
    """What the canonical bytes of states of one structure (names, dtype tags, shapes) hold apart
    from the step number and the values: on the device, cut into the pieces that go between them."""

    total: int  # canonical bytes
    magic: Tensor  # STATE_MAGIC (before the step number)
    gaps: tuple[Tensor, ...]  # before each tensor's values (the count, then headers), then padding


@functools.lru_cache(maxsize=64)
def _plan(device: torch.device, shape_of: Structure) -> _Plan:
    """The fixed pieces of the canonical bytes of a state of this
    :func:`~game.training.state.canonical.structure`."""
    gaps: list[bytes] = [struct.pack("<I", len(shape_of))]
    total = len(STATE_MAGIC) + 8 + 4
    for name, tag, shape in shape_of:
        written = written_tag(tag)
        header = tensor_header(name, written, shape)
        gaps[-1] += header
        gaps.append(b"")
        total += len(header) + math.prod(shape) * tag_width(written)
    gaps[-1] += bytes(sha256_kernel.padded(total) - total)
    blob = STATE_MAGIC + b"".join(gaps)
    fixed = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
    pieces: list[Tensor] = []
    at = len(STATE_MAGIC)
    for gap in gaps:
        pieces.append(fixed[at : at + len(gap)])
        at += len(gap)
    return _Plan(total=total, magic=fixed[: len(STATE_MAGIC)], gaps=tuple(pieces))


@dataclass
class _Built:
    """A state's canonical bytes on its device, and what its grid check left there."""

    buf: Tensor  # uint8, the canonical bytes and zeros up to a multiple of 64 bytes
    total: int
    off_grid: Tensor  # 0-dim bool: some float64 value is off the float32 grid
    first: Tensor | None  # 0-dim int64: the first off-grid position in the float64 values (None: none)
    value: Tensor | None  # (1,) float64: the value there
    f64_names: list[str]  # the float64 tensors in name order ...
    f64_ends: list[int]  # ... and where each ends in the float64 values


def _bytes_of(t: Tensor) -> Tensor:
    """A tensor's values as little-endian bytes (a flat uint8 view; a copy only when strided)."""
    return t.reshape(-1).view(torch.uint8)


def _build(state: TrainState) -> _Built:
    """The canonical bytes on the state's device (see :func:`canonical_bytes_on_device`)."""
    if sys.byteorder != "little":
        raise TrainingError("the device leaf builds little-endian bytes on a little-endian host only")
    device = state.device
    by_name = state_tensors(state)
    names = list(by_name)
    tensors = [t.detach() for t in by_name.values()]
    plan = _plan(device, structure(names, tensors))
    step = torch.frombuffer(bytearray(struct.pack("<Q", state.step)), dtype=torch.uint8)
    with torch.no_grad():
        step, tensors = _to_device(step, tensors, device)
        f64 = [k for k, t in enumerate(tensors) if t.dtype == torch.float64]
        values: list[Tensor | None] = [None if t.dtype == torch.float64 else _bytes_of(t) for t in tensors]
        first = value = None
        ends: list[int] = []
        if sum(tensors[k].numel() for k in f64):
            flat = torch.cat([tensors[k].reshape(-1) for k in f64])
            f32 = flat.to(torch.float32)
            bad = f32 != flat  # compared as float64 (no float64 copy of f32); NaN too, as on the host
            off_grid = bad.any()
            first = torch.argmax(bad.view(torch.uint8))  # the first maximum: the first off-grid value
            value = torch.index_select(flat, 0, first.reshape(1))
            raw = f32.view(torch.uint8)
            at = 0
            for k in f64:
                n = tensors[k].numel()
                values[k] = raw[4 * at : 4 * (at + n)]
                at += n
                ends.append(at)
        else:  # no float64 values (argmax has none to look at)
            off_grid = torch.zeros((), dtype=torch.bool, device=device)
            for k in f64:
                values[k] = _bytes_of(tensors[k].to(torch.float32))
        pieces = [plan.magic, step]
        for gap, v in zip(plan.gaps, values, strict=False):
            assert v is not None
            pieces += [gap, v]
        pieces.append(plan.gaps[-1])
        buf = torch.cat(pieces)
    return _Built(buf, plan.total, off_grid, first, value, [names[k] for k in f64], ends)


def _to_device(
    step: Tensor, tensors: list[Tensor], device: torch.device, away: list[int] | None = None
) -> tuple[Tensor, list[Tensor]]:
    """The step number's bytes and the tensors on ``device``: those elsewhere (``away``; by default
    those not on ``device``: an optimizer's step counters on the host) travel together in one
    pinned buffer and one non-blocking copy. They come back as flat bytes (uint8), except float64
    ones (flat float64: they are converted on the device), which go first so that they stay
    8-byte aligned."""
    if away is None:
        away = [k for k, t in enumerate(tensors) if t.device != device]
        if not away and step.device == device:
            return step, tensors
    if any(tensors[k].device.type != "cpu" for k in away):
        raise TrainingError("state tensors live on more than one device besides the host")
    away = sorted(away, key=lambda k: tensors[k].dtype != torch.float64)  # stable: float64 first
    wide = sum(tensors[k].dtype == torch.float64 for k in away)
    parts = [_bytes_of(tensors[k]) for k in away]
    parts.insert(wide, step.reshape(-1))
    host = torch.empty(sum(p.numel() for p in parts), dtype=torch.uint8, pin_memory=device.type == "cuda")
    torch.cat(parts, out=host)
    moved = host.to(device, non_blocking=True)
    out = list(tensors)
    at = 0
    for i, part in enumerate(parts):
        piece = moved[at : at + part.numel()]
        at += part.numel()
        if i == wide:
            step = piece
        elif i < wide:
            out[away[i]] = piece.view(torch.float64)
        else:
            out[away[i - 1]] = piece
    return step, out


def canonical_bytes_on_device(state: TrainState) -> tuple[Tensor, Tensor]:
    """The state's canonical bytes (:func:`~game.training.state.canonical.encode_state`'s) as one uint8 tensor
    on its device, and a 0-dim bool tensor there: whether some float64 value was off the float32
    grid (then the bytes are not canonical). Nothing is waited for."""
    built = _build(state)
    return built.buf[: built.total], built.off_grid


class DeviceLeaf:
    """A state's leaf on its way from the device: :meth:`start` launches everything and returns at
    once; :meth:`leaf` waits. The state may change as soon as :meth:`start` returns, on the same CUDA
    stream (everything read from it is read in stream order before the next launch)."""

    def __init__(self, built: _Built, last: Tensor, host: Tensor, event: Any) -> None:
        self.total = built.total
        self._built = built  # the canonical bytes stay alive while the kernels read them
        self._last = last
        self._host = host  # last level, off-grid flag, first off-grid position, its value
        self._event = event
        self._leaf: bytes | None = None

    @classmethod
    def start(cls, state: TrainState) -> DeviceLeaf:
        """Build the canonical bytes, reduce them to their last level and start copying that (with
        the grid check's flag) to the host; nothing is waited for."""
        if not sha256_kernel.runs_on(state.device):
            raise TrainingError(f"the device leaf does not run on {state.device}")
        built = _build(state)
        last = sha256_kernel.device_levels(built.buf, built.total)
        tail = [last]
        if built.first is not None and built.value is not None:
            tail += [
                built.off_grid.reshape(1).view(torch.uint8),
                built.first.reshape(1).view(torch.uint8),
                built.value.view(torch.uint8),
            ]
        with torch.no_grad():
            packed = torch.cat(tail)
        if packed.is_cuda:
            host = torch.empty(packed.numel(), dtype=torch.uint8, pin_memory=True)
            with torch.cuda.device(packed.device):
                host.copy_(packed, non_blocking=True)
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(packed.device))
            return cls(built, last, host, event)
        return cls(built, last, packed, None)

    def leaf(self) -> bytes:
        """The leaf (waits for the device, the GIL released); OffGridError naming the first float64
        tensor off the float32 grid, as the host path words it."""
        if self._leaf is not None:
            return self._leaf
        if self._event is not None:
            self._event.synchronize()
        data = self._host.numpy()
        n = self._last.numel()
        if self._built.first is not None and data[n]:
            self._raise_off_grid(data[n + 1 :])
        self._leaf = leafhash.finish(data[:n], self.total)
        return self._leaf

    def _raise_off_grid(self, data: np.ndarray) -> None:
        first = int(data[:8].view("<i8")[0])
        value = torch.from_numpy(data[8:16].view("<f8").copy())
        name = self._built.f64_names[bisect.bisect_right(self._built.f64_ends, first)]
        on_grid_float32(name, value)  # raises (the value is off the grid)
        raise OffGridError(f"state tensor {name} is float64 but not on the float32 grid")

    def canonical_bytes(self) -> np.ndarray:
        """The canonical bytes on the host (for a checkpoint, or an auditor rebuilding the state);
        waits for the device."""
        return self._built.buf[: self.total].cpu().numpy()


__all__ = ["DeviceLeaf", "canonical_bytes_on_device"]
