"""Checkpoints: canonical state bytes read back into a :class:`~.tensors.TrainState`.

The canonical bytes *are* the checkpoint format (:mod:`.canonical`): a judge verifies a pre-state
by hashing the file, and ``encode_state(decode_state(b, cfg)) == b`` for every valid ``b``. A
state is rebuilt as the preset builds it (:func:`fresh_state`), then given the bytes' values.
"""

from __future__ import annotations

import struct

import numpy as np
import torch
from torch import Tensor

from game.errors import TrainingError, TranscriptError
from game.training.numerics import rounding
from game.training.state.canonical import NUMPY_DTYPES, STATE_MAGIC, tag_width
from game.training.state.tensors import Precision, TrainState, move_state, persistent_buffers
from game.training.task.config import TaskConfig


class CheckpointError(TranscriptError, ValueError):
    """Canonical state bytes (a checkpoint) are truncated, corrupt, or do not fit the task's model."""


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
            raw = r.take(tag_width(tag) * numel, f"values of {name}")
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy()).view(torch.bfloat16)
        elif tag in NUMPY_DTYPES:
            dt = NUMPY_DTYPES[tag]
            raw = r.take(tag_width(tag) * numel, f"values of {name}")
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
    from game.training.task.presets import get_preset

    preset = get_preset(cfg.preset)
    model = preset.build_model(cfg)
    with torch.no_grad():
        if precision == "fp64":
            model = model.to(torch.float64)
            for t in list(model.parameters()) + list(persistent_buffers(model).values()):
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
    expected.update({f"buffer/{n}": b for n, b in persistent_buffers(state.model).items()})
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


__all__ = ["CheckpointError", "decode_state", "fresh_state", "parse_state"]
