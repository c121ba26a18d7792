"""An inexact op on float32 tensors, computed in float64 and brought back to float32 on the grid.

A model that casts to float32 on purpose (transformers' Llama: its rotary table's ``cos`` and
``sin``, its RMSNorm's ``mean`` and ``rsqrt``) runs float32 ops whose results are the machine's
own: another CPU's libm, or a GPU, differs by an ulp. Exact float32 ops (IEEE additions,
multiplications, copies) are the same everywhere and pass; an inexact one is run again here on its
arguments widened to float64 (float32 tensors widened, a ``dtype=float32`` argument made float64),
so that its float64 result can be rounded to the grid as any float64 result is (in a step, through
the log; at construction, to nearest, see :mod:`~game.training.dispatch.nearest`), and then written into the
float32 result, which it fits exactly: the task's grid is float32's.

The Python dispatch mode and the model's construction call here; the C++ front
(``native/front.cpp``, ``widen_stack``) does the same on its boxed stack, and the two must agree.
Half and bfloat16 are not widened: an op with such a result stays refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.numerics import rounding

#: The dtype an inexact op's tensors are widened from.
NARROW = torch.float32

#: At construction there is no log, so a float64 result is rounded to nearest float32 only where
#: every machine's float64 result rounds the same way: farther than this fraction of a float32 ulp
#: from a rounding boundary (a float64 libm is within a few float64 ulps, 2**-29 of a float32 ulp).
MARGIN = 2.0**-20


def _narrow_in(x: Any) -> bool:
    if isinstance(x, Tensor):
        return x.dtype == NARROW
    if isinstance(x, list | tuple):
        return any(_narrow_in(v) for v in x)
    return x is NARROW


def narrow_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call takes a float32 tensor or asks for a float32 result (``dtype=float32``): the
    calls :func:`widened` makes a float64 twin of."""
    return _narrow_in(args) or _narrow_in(tuple(kwargs.values()))


def _widen(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.to(torch.float64) if x.dtype == NARROW else x
    if isinstance(x, list | tuple):
        return type(x)(_widen(v) for v in x)
    return torch.float64 if x is NARROW else x


def widened(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's float64 twin: float32 tensors copied to float64 (before the call, so that an
    in-place op's twin starts from the values the op started from), float32 dtypes made float64."""
    return _widen(args), {k: _widen(v) for k, v in kwargs.items()}


def pairs(
    name: str, touched: list[Tensor], twins: list[Tensor], where: str = ""
) -> list[tuple[Tensor, Tensor]]:
    """The op's results beside its float64 twin's, one for one: (result, twin) for each float32 or
    float64 result whose twin is float64; any other result (half, bfloat16, integer) is paired with
    itself, so that its own checks still see it."""
    if len(touched) != len(twins) or any(t.shape != w.shape for t, w in zip(touched, twins, strict=True)):
        raise UnsupportedOpError(
            f"{where}{name}: its float64 twin gave other results than the float32 op, so it cannot be "
            "rounded: compute it in float64",
            op=name,
            fix="compute it in float64",
        )
    return [
        (t, w) if t.dtype in (NARROW, torch.float64) and w.dtype == torch.float64 else (t, t)
        for t, w in zip(touched, twins, strict=True)
    ]


def write_back(found: list[tuple[Tensor, Tensor]]) -> None:
    """Each result takes its twin's rounded values (exactly: they are on the float32 grid)."""
    for t, w in found:
        if t is not w:
            t.copy_(w)


def nearest_float32(x: Tensor, name: str, where: str, fix: str) -> Tensor:
    """A float64 tensor rounded to nearest float32, where that is the same on every machine (see
    :data:`MARGIN`); raises, naming ``name`` and the ``fix``, for a value too near a rounding
    boundary (a tie included), or one past float32's range or not finite."""
    if rounding.magnitude(x) > rounding.FLOAT32_MAX:
        raise UnsupportedOpError(
            f"{where}{name} gives a value past float32's range, or not finite: {fix}", op=name, fix=fix
        )
    if bool((rounding.midpoint_distance(x, rounding.MAX_BITS) <= MARGIN).any()):
        raise UnsupportedOpError(
            f"{where}{name}: a float64 result lies within {MARGIN:g} of a float32 ulp of a rounding "
            f"boundary, where another machine's float64 libm could round it the other way: {fix}",
            op=name,
            fix=fix,
        )
    return rounding.rnd(x, rounding.MAX_BITS).to(NARROW)


__all__ = ["MARGIN", "NARROW", "narrow_inputs", "nearest_float32", "pairs", "widened", "write_back"]
