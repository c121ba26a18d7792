"""Canonical bytes of a state: the bytes its leaf hashes and its checkpoints hold.

Header (magic, step number, tensor count), then every tensor in sorted name order: its name, dtype
tag and shape, then its values little-endian (docs/architecture.md). float64 tensors lie on the
grid, so they are written as float32 without loss. Where everything goes is fixed by the state's
structure (:func:`structure`: name, tag and shape a tensor), the same every step: a CPU state of up
to :data:`_ONE_BUFFER_MAX` bytes is written into one buffer by a plan worked out once
(:func:`state_buffer`), a larger one streams piece by piece; the device leaf
(:mod:`.device_leaf`) builds the same bytes on a GPU from the same structure.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from game.errors import TrainingError
from game.training.native import bindings, front
from game.training.state import leafhash
from game.training.state.tensors import OffGridError, TrainState, state_tensors

log = logging.getLogger(__name__)

STATE_MAGIC = b"vgame-state-v1\0"

#: dtype tags of the canonical bytes. float64 is written as ``f32`` (it lies on the grid); float32
#: tensors that are float32 in memory (AdamW's step counter, fp32 baselines) are written as they are.
DTYPE_TAGS: dict[torch.dtype, str] = {
    torch.float64: "f32",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
NUMPY_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


def tag_width(tag: str) -> int:
    """Bytes a value of a known tag takes in the canonical bytes (bfloat16 as its int16 bits)."""
    return 2 if tag == "bf16" else NUMPY_DTYPES[tag].itemsize


#: A state's structure: (name, tag, shape) a tensor in name order, the tag ``f64`` for float64
#: (written as ``f32``). It fixes where everything goes in the canonical bytes.
Structure = tuple[tuple[str, str, tuple[int, ...]], ...]


def structure(names: list[str], tensors: list[Tensor]) -> Structure:
    """The structure of these tensors (in name order); TrainingError naming the first one whose dtype
    has no tag. The host's buffer plan and the device leaf both lay the bytes out from it."""
    out = []
    for name, t in zip(names, tensors, strict=True):
        tag = "f64" if t.dtype == torch.float64 else DTYPE_TAGS.get(t.dtype)
        if tag is None:
            raise TrainingError(f"state tensor {name} has unsupported dtype {t.dtype}")
        out.append((name, tag, tuple(t.shape)))
    return tuple(out)


def written_tag(tag: str) -> str:
    """The tag a structure's tag is written as (float64 as ``f32``)."""
    return "f32" if tag == "f64" else tag


#: Values per slice when a tensor is turned into canonical bytes: the float32 copy and the grid check
#: work a slice at a time, so a GPT-2-sized state never needs a second full copy of itself in memory.
_SLICE = 1 << 20
#: Pieces of the canonical bytes shorter than this are joined before they are hashed.
_JOIN_BELOW = 1 << 16


def on_grid_float32(name: str, x: Tensor) -> Tensor:
    """``x`` (float64) as float32, converted and checked where it lives; OffGridError naming the
    state tensor when a value is not on the float32 grid."""
    x32 = x.to(torch.float32)
    if not torch.equal(x32.to(torch.float64), x):
        raise OffGridError(f"state tensor {name} is float64 but not on the float32 grid; cannot encode it")
    return x32


def _values(name: str, t: Tensor) -> Iterator[memoryview]:
    """A tensor's canonical values (little-endian), a slice at a time (no second copy of the whole
    tensor is made on the way to the hash)."""
    t = t.detach()
    if t.is_cpu and t.dtype in (torch.float32, torch.int64) and t.numel() <= _SLICE:
        # small exact tensors (an optimizer's step counters, BatchNorm's count): no slicing
        arr = np.ascontiguousarray(t.numpy().reshape(-1))
        yield arr.astype(NUMPY_DTYPES[DTYPE_TAGS[t.dtype]], copy=False).data.cast("B")
        return
    if t.dtype == torch.bfloat16:
        yield t.cpu().contiguous().view(torch.int16).numpy().astype("<i2").data.cast("B")
        return
    flat = t.reshape(-1)
    if t.dtype == torch.float64 and t.is_cpu:
        flat = flat.contiguous()
    for start in range(0, max(flat.numel(), 1), _SLICE):
        part = flat[start : start + _SLICE]
        fast = bindings.to_float32([part]) if t.dtype == torch.float64 else None
        if fast is not None:  # the C kernel: one pass, no float64 copy
            yield fast[0].astype("<f4", copy=False).data.cast("B")
            continue
        if t.dtype == torch.float64:  # checked where the tensor lives: only float32 reaches the host
            part = on_grid_float32(name, part)
        arr = part.to(device="cpu").contiguous().numpy()
        yield arr.astype(NUMPY_DTYPES[DTYPE_TAGS[t.dtype]], copy=False).data.cast("B")


@functools.lru_cache(maxsize=1 << 14)
def tensor_header(name: str, tag: str, shape: tuple[int, ...]) -> bytes:
    """A tensor's header in the canonical bytes: its name, dtype tag and shape (the same every step,
    so built once)."""
    raw_name = name.encode("utf-8")
    return (
        struct.pack("<H", len(raw_name))
        + raw_name
        + struct.pack("<B", len(tag))
        + tag.encode("ascii")
        + struct.pack("<B", len(shape))
        + struct.pack(f"<{len(shape)}Q", *shape)
    )


#: States of up to this many canonical bytes are built in one buffer: one C call writes every
#: float64 tensor into its place and the hash takes one call. Streaming them piece by piece costs
#: some microseconds of Python a piece, which on a small model's 250 pieces was most of its state
#: hash (3 ms of 3.5 on gpt-shakespeare). Larger states stream (no second full copy in memory).
_ONE_BUFFER_MAX = 1 << 26


@dataclass(frozen=True)
class _Layout:
    """Where everything goes in the canonical bytes of states of one structure (names, dtype tags
    and shapes): the same every step, so worked out once."""

    size: int  # bytes in all
    header_at: np.ndarray  # positions of the tensors' header bytes
    header_bytes: np.ndarray  # ... and those bytes (uint8)
    offsets: tuple[int, ...]  # where each tensor's values start, in name order


@functools.lru_cache(maxsize=64)
def _layout(shape_of: Structure) -> _Layout:
    """Where the tensors of a state of this :func:`structure` go in its canonical bytes."""
    pos = len(STATE_MAGIC) + struct.calcsize("<QI")
    at: list[np.ndarray] = []
    raw: list[bytes] = []
    offsets: list[int] = []
    for name, tag, shape in shape_of:
        header = tensor_header(name, written_tag(tag), shape)
        at.append(np.arange(pos, pos + len(header), dtype=np.int64))
        raw.append(header)
        pos += len(header)
        offsets.append(pos)
        pos += math.prod(shape) * tag_width(written_tag(tag))
    return _Layout(
        size=pos,
        header_at=np.concatenate(at) if at else np.empty(0, dtype=np.int64),
        header_bytes=np.frombuffer(b"".join(raw), dtype=np.uint8),
        offsets=tuple(offsets),
    )


@dataclass
class _BufferPlan:
    """What :func:`state_buffer` works out from a state's tensors and reuses while they stay as they
    were: their layout, and for the copies the contiguous float64 tensors' addresses, value counts
    and offsets (one C call converts them), the other contiguous tensors' offsets, addresses and
    byte counts, and the strided ones (copied piece by piece). Working it out walks every tensor in
    Python; checking it costs less (0.15 ms less a gpt-shakespeare step). What it reads is fixed by
    what it checks: each tensor's name, data pointer, shape, dtype and contiguity (read in one call
    to the C++ front, :func:`~game.training.native.front.layouts`, once the front is loaded)."""

    names: list[str]
    pointers: list[int]
    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    contiguous: list[bool]
    layout: _Layout
    addresses: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    raw: tuple[tuple[int, int, int], ...]  # (offset in the bytes, address, byte count)
    strided: tuple[int, ...]  # positions in ``tensors``
    #: the tensors' :func:`front.layouts` (None until the front is loaded)
    layouts: bytes | None = None

    def fits(self, names: list[str], tensors: list[Tensor]) -> bool:
        """Whether the plan still describes these tensors: the same names, and each tensor where, what
        and how laid out it was, on the CPU (a restored checkpoint, an optimizer's new state or a
        parameter given new data fails this)."""
        if names != self.names:
            return False
        if self.layouts is not None and (now := front.layouts(tensors)) is not None:
            return now == self.layouts
        fits = (
            [t.data_ptr() for t in tensors] == self.pointers
            and [t.shape for t in tensors] == self.shapes
            and [t.dtype for t in tensors] == self.dtypes
            and [t.is_contiguous() for t in tensors] == self.contiguous
            and all(t.is_cpu for t in tensors)
        )
        if fits and self.layouts is None:
            self.layouts = front.layouts(tensors)  # the plan was made before the front loaded
        return fits


def _buffer_plan(names: list[str], tensors: list[Tensor]) -> _BufferPlan | None:
    """The plan for these tensors, or None where the canonical bytes must stream (a tensor on a
    device); TrainingError for a dtype the bytes have no tag for (:func:`structure`)."""
    if not all(t.is_cpu for t in tensors):
        return None
    layout = _layout(structure(names, tensors))
    contiguous = [t.is_contiguous() for t in tensors]
    at = list(zip(tensors, layout.offsets, contiguous, strict=True))
    wide = [(t, offset) for t, offset, flat in at if flat and t.dtype == torch.float64]
    return _BufferPlan(
        names=names,
        pointers=[t.data_ptr() for t in tensors],
        shapes=[t.shape for t in tensors],
        dtypes=[t.dtype for t in tensors],
        contiguous=contiguous,
        layout=layout,
        addresses=np.array([t.data_ptr() for t, _ in wide], dtype=np.int64),
        counts=np.array([t.numel() for t, _ in wide], dtype=np.int64),
        offsets=np.array([offset for _, offset in wide], dtype=np.int64),
        raw=tuple(
            (offset, t.data_ptr(), t.numel() * t.element_size())
            for t, offset, flat in at
            if flat and t.dtype != torch.float64
        ),
        strided=tuple(k for k, flat in enumerate(contiguous) if not flat),
        layouts=front.layouts(tensors),
    )


def state_buffer(state: TrainState) -> np.ndarray | None:
    """The canonical bytes in one new uint8 array (one C call writes the float64 tensors), or None
    where they must stream (:func:`encode_state`, :func:`~.leaves.state_hash`): a state on a
    device, one of more than :data:`_ONE_BUFFER_MAX` bytes, no kernels, or a value off the grid
    (whose error the streaming words). The tensors' layout and addresses come from the state's :class:`_BufferPlan`,
    made again whenever it no longer fits them."""
    if sys.byteorder != "little":
        return None
    by_name = state_tensors(state)
    names, tensors = list(by_name), list(by_name.values())
    plan = state.buffer_plan
    if not isinstance(plan, _BufferPlan) or not plan.fits(names, tensors):
        plan = state.buffer_plan = _buffer_plan(names, tensors)
    if plan is None or plan.layout.size > _ONE_BUFFER_MAX:
        return None
    layout = plan.layout
    buf = np.empty(layout.size, dtype=np.uint8)
    head = STATE_MAGIC + struct.pack("<QI", state.step, len(tensors))
    buf[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    buf[layout.header_at] = layout.header_bytes
    if not bindings.float32_at(plan.addresses, plan.counts, plan.offsets, buf):
        return None
    base = buf.ctypes.data
    for offset, address, size in plan.raw:  # an optimizer's step counters, a BatchNorm's count
        ctypes.memmove(base + offset, address, size)
    for k in plan.strided:  # a strided view: written a slice at a time
        offset = layout.offsets[k]
        for piece in _values(names[k], tensors[k]):
            buf[offset : offset + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            offset += len(piece)
    return buf


def _state_parts(state: TrainState) -> Iterator[bytes | memoryview]:
    """The canonical bytes (docs/architecture.md) in pieces: header, then every tensor in sorted
    name order. Hashing the pieces as they come costs no copy of the state."""
    tensors = state_tensors(state)
    yield STATE_MAGIC + struct.pack("<QI", state.step, len(tensors))
    small = [
        n
        for n, t in tensors.items()
        if t.dtype == torch.float64 and t.numel() <= _SLICE and t.is_contiguous()
    ]
    converted = bindings.to_float32([tensors[n] for n in small])  # one C call for them all
    ready = dict(zip(small, converted, strict=True)) if converted is not None else {}
    on_device = [n for n in small if tensors[n].is_cuda]
    if on_device:
        ready.update(_device_to_float32(on_device, [tensors[n] for n in on_device]))
    for name, t in tensors.items():
        tag = DTYPE_TAGS.get(t.dtype)
        if tag is None:
            raise TrainingError(f"state tensor {name} has unsupported dtype {t.dtype}")
        yield tensor_header(name, tag, tuple(t.shape))
        values = ready.get(name)
        if values is not None:
            yield values.astype("<f4", copy=False).data.cast("B")
        else:
            yield from _values(name, t)


def _device_to_float32(names: list[str], tensors: list[Tensor]) -> dict[str, np.ndarray]:
    """Small float64 tensors on a GPU as float32 arrays on the host: converted and checked on the
    device together, copied back in one transfer (per tensor it was a few launches and two
    synchronisations, some hundred times a step)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    f32 = flat.to(torch.float32)
    if not torch.equal(f32.to(torch.float64), flat):  # name the first tensor off the grid
        for name, t in zip(names, tensors, strict=True):
            on_grid_float32(name, t)
    host = f32.cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return {name: host[end - t.numel() : end] for name, t, end in zip(names, tensors, ends, strict=True)}


def encode_state(state: TrainState) -> bytes:
    """The canonical bytes (docs/architecture.md): header, then every tensor in sorted name order."""
    buf = state_buffer(state)
    if buf is not None:
        return buf.tobytes()
    return encode_streamed(state)


def encoded_size(state: TrainState) -> int:
    """The length of :func:`encode_state`'s bytes (a checkpoint's size), from the tensors' names,
    types and shapes alone: nothing is encoded or copied."""
    tensors = state_tensors(state)
    size = len(STATE_MAGIC) + struct.calcsize("<QI")
    for name, t in tensors.items():
        tag = DTYPE_TAGS.get(t.dtype)
        if tag is None:
            raise TrainingError(f"state tensor {name} has unsupported dtype {t.dtype}")
        size += len(tensor_header(name, tag, tuple(t.shape))) + t.numel() * tag_width(tag)
    return size


def encode_streamed(state: TrainState) -> bytes:
    """:func:`encode_state` from the pieces, for a caller that :func:`state_buffer` already refused."""
    return b"".join(list(_state_parts(state)))


def hash_streamed(state: TrainState) -> bytes:
    """:func:`~.leaves.state_hash` piece by piece, for a caller that :func:`state_buffer` already refused.
    Small pieces (headers, small tensors) are joined before hashing: a stream update costs
    microseconds of Python, which on the hundreds of pieces of a state add up."""
    stream = leafhash.LeafStream()
    pending: list[bytes | memoryview] = []
    for part in _state_parts(state):
        if len(part) < _JOIN_BELOW:
            pending.append(part)
            continue
        if pending:
            stream.update(b"".join(pending))
            pending.clear()
        stream.update(part)
    return stream.update(b"".join(pending)).digest()


__all__ = [
    "STATE_MAGIC",
    "Structure",
    "encode_state",
    "encode_streamed",
    "encoded_size",
    "hash_streamed",
    "state_buffer",
    "structure",
    "tag_width",
]
