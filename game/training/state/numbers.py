"""Python numbers in the committed state: as int64 tensors of (kind, payload) rows.

Why: an optimizer of the task's own often counts its steps in a Python int (``state["step"] +=
1``, as most optimizers written before torch kept it in a tensor do) and a scheduler stepped with
the loss keeps its best loss in a float; the next step computes with them, so a judge re-running a
step needs them as the trainer had them. A tensor of them is committed like any other: one row a
number, (0, the int), (1, the float's IEEE-754 bits) or (2, a bool as 0 or 1), exact and the same
bytes on every machine, where a float64 value off the grid would have no canonical bytes.

The tensors are kept on the state (:attr:`~.tensors.TrainState.numbers`) and written in place
while their shape holds, so that the canonical bytes' plan, made from the tensors' addresses, still
fits the next step.
"""

from __future__ import annotations

import struct
from typing import Any

import torch
from torch import Tensor

from game.errors import CheckpointError

_INT, _FLOAT, _BOOL = 0, 1, 2

Rows = list[tuple[int, int]]


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def row(value: Any) -> tuple[int, int] | None:
    """One number as a row; None for anything else (a one-value floating tensor counts: an lr
    given as a tensor)."""
    if isinstance(value, bool):
        return (_BOOL, int(value))
    if isinstance(value, int):
        return (_INT, value) if -(1 << 63) <= value < (1 << 63) else None
    if isinstance(value, float):
        return (_FLOAT, _bits(value))
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point():
        return (_FLOAT, _bits(float(value)))
    return None


def rows(value: Any) -> Rows | None:
    """A number, or a list or tuple of numbers, as rows; None for anything else."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = [row(v) for v in items]
    return None if any(r is None for r in out) else out  # type: ignore[return-value]


def values(t: Tensor) -> list[Any]:
    """The numbers a committed tensor holds; CheckpointError for a row of no kind."""
    if t.dtype != torch.int64 or t.dim() != 2 or t.shape[1] != 2:
        raise CheckpointError(
            f"a committed number is an int64 tensor of (kind, payload) rows, not {t.dtype} {tuple(t.shape)}"
        )
    out: list[Any] = []
    for kind, payload in t.tolist():
        if kind == _BOOL:
            out.append(bool(payload))
        elif kind == _INT:
            out.append(payload)
        elif kind == _FLOAT:
            out.append(struct.unpack("<d", struct.pack("<q", payload))[0])
        else:
            raise CheckpointError(f"a committed number has row kind {kind}, none of int, float, bool")
    return out


def kept(store: dict[str, Tensor], name: str, given: Rows) -> Tensor:
    """The tensor of ``given`` under ``name`` in ``store``: the one there, written in place, where
    its shape holds; a new one otherwise."""
    fresh = torch.tensor(given, dtype=torch.int64).reshape(len(given), 2)
    t = store.get(name)
    if t is None or t.shape != fresh.shape:
        store[name] = fresh
        return fresh
    t.copy_(fresh)
    return t


__all__ = ["Rows", "kept", "row", "rows", "values"]
