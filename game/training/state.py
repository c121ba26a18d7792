"""Training state: its tensors by canonical name, canonical bytes, state hash, and checkpoints.

State = parameters + persistent buffers (BatchNorm running stats) + optimizer state + the step number
(docs/architecture.md, "Training state and leaves"). Floating tensors are float64 in memory and lie
on the ``bits`` grid after every step, so they are written as float32 without loss. The canonical
bytes *are* the checkpoint format: a judge verifies a pre-state by hashing the file, and
``encode_state(decode_state(b, cfg)) == b`` for every valid ``b``.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import logging
import math
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from game.errors import TrainingError, TranscriptError
from game.training import leafhash
from game.training.config import TaskConfig
from game.training.native import bindings, front, stepwriter
from game.training.numerics import rounding

log = logging.getLogger(__name__)

STATE_MAGIC = b"vgame-state-v1\0"

Precision = Literal["fp64", "fp32"]

#: dtype tags of the canonical bytes. float64 is written as ``f32`` (it lies on the grid); float32
#: tensors that are float32 in memory (AdamW's step counter, fp32 baselines) are written as they are.
_TAGS: dict[torch.dtype, str] = {
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
_NUMPY: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


def _width(tag: str) -> int:
    """Bytes a value of a known tag takes in the canonical bytes (bfloat16 as its int16 bits)."""
    return 2 if tag == "bf16" else _NUMPY[tag].itemsize


class CheckpointError(TranscriptError, ValueError):
    """Canonical state bytes (a checkpoint) are truncated, corrupt, or do not fit the task's model."""


class OffGridError(TrainingError, ValueError):
    """A float64 state tensor is not on the rounding grid, so it has no canonical bytes."""


@dataclass
class TrainState:
    """The whole training state; ``step`` is the number of steps run (0 = initialisation)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: int
    #: What :func:`state_buffer` worked out from the tensors last time (checked before each use).
    buffer_plan: _BufferPlan | None = field(default=None, init=False, repr=False, compare=False)

    def parameters(self) -> dict[str, Tensor]:
        """Parameters by model name (for distances between two parties' weights)."""
        return {name: p for name, p in self.model.named_parameters()}

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return next(self.model.parameters()).device


# --------------------------------------------------------------------------------------------------
# Tensors by canonical name
# --------------------------------------------------------------------------------------------------


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _persistent_buffers(model: nn.Module) -> dict[str, Tensor]:
    """Buffers that are part of ``state_dict`` (non-persistent ones are constants, not state), in
    ``named_buffers`` order, read from each module's own table (building ``state_dict`` costs a
    walk of every module and a dict per module, on every state hash)."""
    out: dict[str, Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):  # as state_dict walks
        skip = module._non_persistent_buffers_set
        for name, t in module._buffers.items():
            if t is not None and name not in skip:
                out[f"{prefix}.{name}" if prefix else name] = t
    return out


def optimizer_state_tensors(state: TrainState) -> dict[str, Tensor]:
    """``optim/<param name>/<key>`` for every tensor in the optimizer's per-parameter state."""
    return _optimizer_tensors(state, _param_names(state.model))


def _optimizer_tensors(state: TrainState, names: dict[int, str]) -> dict[str, Tensor]:
    """:func:`optimizer_state_tensors` with the parameters' names (by ``id``) already known."""
    out: dict[str, Tensor] = {}
    for p, entries in state.optimizer.state.items():
        pname = names.get(id(p))
        if pname is None:
            raise TrainingError("optimizer holds state for a tensor that is not a model parameter")
        for key, value in entries.items():
            if value is None:
                continue  # SGD without momentum keeps momentum_buffer = None
            if not isinstance(value, Tensor):
                raise TrainingError(
                    f"optimizer state {pname}/{key} is a {type(value).__name__}, not a tensor"
                )
            out[f"optim/{pname}/{key}"] = value
    return out


def _module_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``named_parameters()`` and :func:`_persistent_buffers` in one walk of the modules, with no
    generator a level and no Python ``Tensor.__hash__`` a parameter (``named_parameters`` spends
    85 us a gpt-shakespeare step on those). The walk is ``named_modules(remove_duplicate=False)``'s:
    depth first, children in order, a shared module under each of its names (its buffers so, as
    ``state_dict`` has them); a parameter is named where first met, as ``named_parameters`` does
    (it skips a module met before, whose parameters were all met with it)."""
    params: dict[str, Tensor] = {}
    buffers: dict[str, Tensor] = {}
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        dot = f"{prefix}." if prefix else ""
        for name, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params[dot + name] = p
        skip = module._non_persistent_buffers_set
        for name, b in module._buffers.items():
            if b is not None and name not in skip:
                buffers[dot + name] = b
        stack.extend(reversed([(dot + name, m) for name, m in module._modules.items() if m is not None]))
    return params, buffers


def state_tensors(state: TrainState) -> dict[str, Tensor]:
    """Every tensor of the state by canonical name, sorted."""
    out: dict[str, Tensor] = {}
    names: dict[int, str] = {}
    params, buffers = _module_tensors(state.model)
    for name, p in params.items():
        out[f"param/{name}"] = p
        names[id(p)] = name
    for name, b in buffers.items():
        out[f"buffer/{name}"] = b
    out.update(_optimizer_tensors(state, names))
    return dict(sorted(out.items()))


def float_state_tensors(state: TrainState) -> dict[str, Tensor]:
    """The float64 tensors of the state (those that must lie on the grid)."""
    return {n: t for n, t in state_tensors(state).items() if t.dtype == torch.float64}


def check_on_grid(state: TrainState, bits: int) -> None:
    """Raise OffGridError naming the first float64 state tensor that is not on the ``bits`` grid."""
    for name, t in float_state_tensors(state).items():
        if not rounding.is_on_grid(t.detach(), bits):
            raise OffGridError(f"state tensor {name} (step {state.step}) is not on the {bits}-bit grid")


# --------------------------------------------------------------------------------------------------
# Canonical bytes
# --------------------------------------------------------------------------------------------------


#: Values per slice when a tensor is turned into canonical bytes: the float32 copy and the grid check
#: work a slice at a time, so a GPT-2-sized state never needs a second full copy of itself in memory.
_SLICE = 1 << 20
#: Pieces of the canonical bytes shorter than this are joined before they are hashed.
_JOIN_BELOW = 1 << 16


def _on_grid_float32(name: str, x: Tensor) -> Tensor:
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
        yield arr.astype(_NUMPY[_TAGS[t.dtype]], copy=False).data.cast("B")
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
            part = _on_grid_float32(name, part)
        arr = part.to(device="cpu").contiguous().numpy()
        yield arr.astype(_NUMPY[_TAGS[t.dtype]], copy=False).data.cast("B")


@functools.lru_cache(maxsize=1 << 14)
def _header(name: str, tag: str, shape: tuple[int, ...]) -> bytes:
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
def _layout(structure: tuple[tuple[str, str, tuple[int, ...]], ...]) -> _Layout:
    """``structure``: (name, tag, shape) a tensor; the tag ``f64`` is float64 (written as ``f32``)."""
    pos = len(STATE_MAGIC) + struct.calcsize("<QI")
    at: list[np.ndarray] = []
    raw: list[bytes] = []
    offsets: list[int] = []
    for name, tag, shape in structure:
        header = _header(name, "f32" if tag == "f64" else tag, shape)
        at.append(np.arange(pos, pos + len(header), dtype=np.int64))
        raw.append(header)
        pos += len(header)
        offsets.append(pos)
        pos += math.prod(shape) * _width("f32" if tag == "f64" else tag)
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
    device or of an unknown dtype)."""
    structure = []
    for name, t in zip(names, tensors, strict=True):
        tag = "f64" if t.dtype == torch.float64 else _TAGS.get(t.dtype)
        if tag is None or not t.is_cpu:
            return None
        structure.append((name, tag, tuple(t.shape)))
    layout = _layout(tuple(structure))
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
    where they must stream (:func:`encode_state`, :func:`state_hash`): a state on a device, one of
    more than :data:`_ONE_BUFFER_MAX` bytes, no kernels, or a value off the grid (whose error the
    streaming words). The tensors' layout and addresses come from the state's :class:`_BufferPlan`,
    made again whenever it no longer fits them."""
    if sys.byteorder != "little":
        return None
    by_name = state_tensors(state)
    names, tensors = list(by_name), list(by_name.values())
    plan = state.buffer_plan
    if plan is None or not plan.fits(names, tensors):
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
        tag = _TAGS.get(t.dtype)
        if tag is None:
            raise TrainingError(f"state tensor {name} has unsupported dtype {t.dtype}")
        yield _header(name, tag, tuple(t.shape))
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
            _on_grid_float32(name, t)
    host = f32.cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return {name: host[end - t.numel() : end] for name, t, end in zip(names, tensors, ends, strict=True)}


def encode_state(state: TrainState) -> bytes:
    """The canonical bytes (docs/architecture.md): header, then every tensor in sorted name order."""
    buf = state_buffer(state)
    if buf is not None:
        return buf.tobytes()
    return encode_streamed(state)


def state_hash(state: TrainState) -> bytes:
    """``leafhash.leaf_of(encode_state(state))``: the leaf of the state tree. A state on a GPU is
    hashed there (:func:`~game.training.leaves.device_leaf`); on the CPU a small state in one buffer
    (:func:`state_buffer`), a large one piece by piece (:func:`hash_streamed`)."""
    from game.training.leaves import device_leaf  # a GPU state is hashed where it lives

    on_device = device_leaf(state)
    if on_device is not None:
        return on_device.leaf()
    buf = state_buffer(state)
    if buf is not None:
        return stepwriter.leaf(buf)
    return hash_streamed(state)


def encoded_size(state: TrainState) -> int:
    """The length of :func:`encode_state`'s bytes (a checkpoint's size), from the tensors' names,
    types and shapes alone: nothing is encoded or copied."""
    tensors = state_tensors(state)
    size = len(STATE_MAGIC) + struct.calcsize("<QI")
    for name, t in tensors.items():
        tag = _TAGS.get(t.dtype)
        if tag is None:
            raise TrainingError(f"state tensor {name} has unsupported dtype {t.dtype}")
        size += len(_header(name, tag, tuple(t.shape))) + t.numel() * _width(tag)
    return size


def encode_streamed(state: TrainState) -> bytes:
    """:func:`encode_state` from the pieces, for a caller that :func:`state_buffer` already refused."""
    return b"".join(list(_state_parts(state)))


def hash_streamed(state: TrainState) -> bytes:
    """:func:`state_hash` piece by piece, for a caller that :func:`state_buffer` already refused.
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


# --------------------------------------------------------------------------------------------------
# Decoding (checkpoints)
# --------------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise CheckpointError(
                f"state bytes truncated at byte {len(self.data)} while reading {what} (needs {n} from {self.pos})"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def parse_state(data: bytes) -> tuple[int, dict[str, Tensor]]:
    """``(step, tensors by name)`` from canonical bytes; float tensors come back as float32 on CPU."""
    r = _Reader(data)
    if r.take(len(STATE_MAGIC), "magic") != STATE_MAGIC:
        raise CheckpointError("not vgame state bytes (bad magic)")
    step, count = r.unpack("<QI", "header")
    tensors: dict[str, Tensor] = {}
    prev: str | None = None
    for i in range(count):
        (nlen,) = r.unpack("<H", f"name length of tensor {i}")
        try:
            name = r.take(nlen, f"name of tensor {i}").decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"tensor {i}: name is not UTF-8") from None
        if prev is not None and name <= prev:
            raise CheckpointError(f"tensor {name!r} is out of sorted order or repeated")
        prev = name
        (tlen,) = r.unpack("<B", f"dtype of {name}")
        tag = r.take(tlen, f"dtype of {name}").decode("ascii", errors="replace")
        (ndim,) = r.unpack("<B", f"ndim of {name}")
        shape = r.unpack(f"<{ndim}Q", f"shape of {name}")
        numel = 1
        for d in shape:
            numel *= d
        if tag == "bf16":
            raw = r.take(_width(tag) * numel, f"values of {name}")
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy()).view(torch.bfloat16)
        elif tag in _NUMPY:
            dt = _NUMPY[tag]
            raw = r.take(_width(tag) * numel, f"values of {name}")
            t = torch.from_numpy(np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="), copy=True))
        else:
            raise CheckpointError(f"tensor {name}: unknown dtype tag {tag!r}")
        tensors[name] = t.reshape(shape)
    if r.pos != len(data):
        raise CheckpointError(f"{len(data) - r.pos} trailing bytes after the last tensor")
    return step, tensors


def fresh_state(
    cfg: TaskConfig, *, device: str | torch.device = "cpu", precision: Precision = "fp64"
) -> TrainState:
    """The step-0 state: the preset's model (built on CPU), rounded to the grid, on ``device``.

    fp64 state is rounded onto the ``cfg.bits`` grid; fp32 (the plain baseline) is converted.
    """
    from game.training.presets import get_preset

    preset = get_preset(cfg.preset)
    model = preset.build_model(cfg)
    with torch.no_grad():
        if precision == "fp64":
            model = model.to(torch.float64)
            for t in list(model.parameters()) + list(_persistent_buffers(model).values()):
                if t.dtype == torch.float64:
                    rounding.round_(t.data, cfg.bits)
        elif precision == "fp32":
            model = model.to(torch.float32)
        else:
            raise TrainingError(f"precision: {precision!r} is not fp64 or fp32")
    model = model.to(device)
    model.train()
    optimizer = preset.build_optimizer(cfg, model)
    return TrainState(model=model, optimizer=optimizer, step=0)


def decode_state(data: bytes, cfg: TaskConfig, *, device: str | torch.device = "cpu") -> TrainState:
    """Rebuild the state from canonical bytes: model and optimizer from the preset, values loaded."""
    step, tensors = parse_state(data)
    state = fresh_state(cfg, device="cpu")
    state.step = step
    expected: dict[str, Tensor] = {f"param/{n}": p for n, p in state.model.named_parameters()}
    expected.update({f"buffer/{n}": b for n, b in _persistent_buffers(state.model).items()})
    model_names = {n for n in tensors if not n.startswith("optim/")}
    missing, extra = sorted(set(expected) - model_names), sorted(model_names - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"state bytes do not fit preset {cfg.preset!r}: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    with torch.no_grad():
        for name, target in expected.items():
            src = tensors[name]
            if tuple(src.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"{name}: shape {tuple(src.shape)} in the bytes, model has {tuple(target.shape)}"
                )
            if src.is_floating_point() != target.is_floating_point():
                raise CheckpointError(f"{name}: dtype {src.dtype} in the bytes, model has {target.dtype}")
            target.copy_(src.to(target.dtype))
    _load_optimizer(state, {n: t for n, t in tensors.items() if n.startswith("optim/")})
    if torch.device(device) != torch.device("cpu"):
        move_state(state, device)
    return state


def _load_optimizer(state: TrainState, tensors: dict[str, Tensor]) -> None:
    params = dict(state.model.named_parameters())
    index: dict[int, int] = {}
    for group in state.optimizer.param_groups:
        for p in group["params"]:
            index[id(p)] = len(index)
    per_param: dict[int, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        pname, sep, key = name[len("optim/") :].rpartition("/")
        if not sep or pname not in params:
            raise CheckpointError(f"{name}: names no parameter of preset {state.model.__class__.__name__}")
        p = params[pname]
        if t.dim() > 0 and tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{name}: shape {tuple(t.shape)}, parameter has {tuple(p.shape)}")
        per_param.setdefault(index[id(p)], {})[key] = t
    sd = state.optimizer.state_dict()
    sd["state"] = per_param
    try:
        state.optimizer.load_state_dict(sd)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"optimizer state does not load: {exc}") from exc


def move_state(state: TrainState, device: str | torch.device) -> None:
    """Move model and optimizer state to ``device`` in place (0-dim float32 step counters stay put)."""
    dev = torch.device(device)
    state.model.to(dev)
    for entries in state.optimizer.state.values():
        for key, value in entries.items():
            if isinstance(value, Tensor) and not (value.dim() == 0 and value.dtype == torch.float32):
                entries[key] = value.to(dev)


def snapshot(state: TrainState) -> Callable[[], None]:
    """Copy the state's tensors where they live; the returned function puts the copy back.

    For a step that must run again from where it started (a CUDA step whose deferred checks failed,
    :class:`game.training.step.StepEngine`): parameters and buffers are written back in place (the
    model keeps its tensors), the optimizer's state is replaced (a first step creates it).
    """
    live = [*state.model.parameters(), *state.model.buffers()]
    saved = [t.detach().clone() for t in live]
    optimizer = state.optimizer
    kept = {
        p: {k: v.detach().clone() if isinstance(v, Tensor) else copy.deepcopy(v) for k, v in s.items()}
        for p, s in optimizer.state.items()
    }

    def restore() -> None:
        with torch.no_grad():
            for t, s in zip(live, saved, strict=True):
                t.copy_(s)
        optimizer.state.clear()
        optimizer.state.update(kept)

    return restore


__all__ = [
    "STATE_MAGIC",
    "CheckpointError",
    "OffGridError",
    "Precision",
    "TrainState",
    "check_on_grid",
    "decode_state",
    "encode_state",
    "encode_streamed",
    "encoded_size",
    "float_state_tensors",
    "fresh_state",
    "hash_streamed",
    "move_state",
    "optimizer_state_tensors",
    "parse_state",
    "snapshot",
    "state_hash",
    "state_tensors",
]
