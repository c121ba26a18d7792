"""Checkpoints: canonical state bytes parsed back into named tensors.

The canonical bytes *are* the checkpoint format (:mod:`.canonical`): a judge verifies a pre-state
by hashing the file, and ``encode_state(decode_state(b, cfg)) == b`` for every valid ``b``. Putting
the tensors into a task's model is the engine's (:mod:`game.training.engine.states`): the model is
the task's code.
"""

from __future__ import annotations

import struct

import numpy as np
import torch
from torch import Tensor

from game.errors import CheckpointError
from game.training.state.canonical import NUMPY_DTYPES, STATE_MAGIC, tag_width


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


__all__ = ["CheckpointError", "parse_state"]
