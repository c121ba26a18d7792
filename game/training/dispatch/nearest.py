"""An inexact op at a model's construction, rounded to nearest float32 the same on every machine.

At construction there is no log. An op whose float64 result every machine's libm gives within a few
float64 ulps of the true value (:data:`NEAREST`: IEEE arithmetic, ``pow``, ``exp``, ``log``,
``sin``, ``cos``, ...) has each value rounded to nearest float32, whatever the op's dtype: a rotary
or sinusoid table built in float32 (Llama's, by way of its float64 twin, see
:mod:`~game.training.dispatch.widen`) or in float64 (GPT-J's and CodeGen's, under construction's
float64 default dtype). A float32 result holds the value exactly; a float64 one holds a float32
value, which the grid of step 0 then keeps or rounds the same everywhere.

Where torch's float64 value lies farther than :data:`MARGIN` of a
float32 ulp from a rounding boundary, every machine rounds it the same way, and its rounding is the
answer. A value nearer (some one in half a million, for values that fall anywhere) is worked out
again from the op's arguments in 320-bit arithmetic (mpmath) and rounded to 24 bits, half to even:
the correctly rounded value, the same on every machine. So no table is refused for where its values
happen to fall. An op not in the list (``erfinv``, which torch builds from Newton steps that a
last-ulp difference in ``erf`` moves by far more; a sum, whose order is the machine's) is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import mpmath
import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch.initrules import INIT_FIX, WHERE, exact_float32
from game.training.numerics import rounding

_Mpf = Any  # mpmath's numbers are untyped

#: Each op (ATen name without overload, an in-place op's trailing ``_`` dropped): its operands
#: (the leading arguments that are tensors or numbers) and its value in mpmath from them and the
#: op's ``alpha`` (1 where it has none). ``arange`` is worked out exactly on its own.
_EXACT: dict[str, tuple[int, Callable[..., _Mpf]]] = {
    "add": (2, lambda x, y, a: x + a * y),
    "sub": (2, lambda x, y, a: x - a * y),
    "mul": (2, lambda x, y, a: x * y),
    "div": (2, lambda x, y, a: x / y),
    "reciprocal": (1, lambda x, a: 1 / x),
    "sqrt": (1, lambda x, a: mpmath.sqrt(x)),
    "rsqrt": (1, lambda x, a: 1 / mpmath.sqrt(x)),
    "exp": (1, lambda x, a: mpmath.exp(x)),
    "exp2": (1, lambda x, a: mpmath.power(2, x)),
    "expm1": (1, lambda x, a: mpmath.expm1(x)),
    "log": (1, lambda x, a: mpmath.log(x)),
    "log2": (1, lambda x, a: mpmath.log(x, 2)),
    "log10": (1, lambda x, a: mpmath.log10(x)),
    "log1p": (1, lambda x, a: mpmath.log1p(x)),
    "pow": (2, lambda x, y, a: mpmath.power(x, y)),
    "sigmoid": (1, lambda x, a: 1 / (1 + mpmath.exp(-x))),
    "sin": (1, lambda x, a: mpmath.sin(x)),
    "cos": (1, lambda x, a: mpmath.cos(x)),
    "tan": (1, lambda x, a: mpmath.tan(x)),
    "asin": (1, lambda x, a: mpmath.asin(x)),
    "acos": (1, lambda x, a: mpmath.acos(x)),
    "atan": (1, lambda x, a: mpmath.atan(x)),
    "atan2": (2, lambda y, x, a: mpmath.atan2(y, x)),
    "sinh": (1, lambda x, a: mpmath.sinh(x)),
    "cosh": (1, lambda x, a: mpmath.cosh(x)),
    "tanh": (1, lambda x, a: mpmath.tanh(x)),
    "asinh": (1, lambda x, a: mpmath.asinh(x)),
    "acosh": (1, lambda x, a: mpmath.acosh(x)),
    "atanh": (1, lambda x, a: mpmath.atanh(x)),
    "erf": (1, lambda x, a: mpmath.erf(x)),
    "erfc": (1, lambda x, a: mpmath.erfc(x)),
    "hypot": (2, lambda x, y, a: mpmath.hypot(x, y)),
}

#: At construction there is no log, so a float64 result is rounded to nearest float32 as it is only
#: where every machine's float64 result rounds the same way: farther than this fraction of a float32
#: ulp from a rounding boundary (a float64 libm is within a few float64 ulps, 2**-29 of a float32 ulp).
MARGIN = 2.0**-20

#: The ops rounded to nearest at construction (module docstring).
NEAREST = frozenset({*_EXACT, "arange"})

#: Working precision of a value worked out again, in bits.
_PREC = 320


def rounds_to_nearest(func: Any) -> bool:
    """Whether ``func`` is one of :data:`NEAREST`."""
    return _name(func) in NEAREST


def _name(func: Any) -> str:
    return str(func.overloadpacket.__name__).rstrip("_")


def before(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments as they are before the op runs, for :func:`to_nearest` to work values
    out again from: float64 copies of the floating ones where the op writes an argument (an in-place
    op overwrites its own), the arguments themselves where it writes none (no copy of each
    tensor a model's construction passes through such an op)."""
    if not any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return args, kwargs

    def copy(x: Any) -> Any:
        if isinstance(x, Tensor) and (x.is_floating_point() or x.is_complex()):
            return x.detach().to(torch.float64, copy=True)
        return x

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


def to_nearest(
    func: Any, found: Sequence[tuple[Tensor, Tensor]], given: tuple[tuple[Any, ...], dict[str, Any]]
) -> None:
    """Each pair's float64 values (the second: a float32 or float64 result's own, or its float64
    twin's) rounded to nearest float32 and written into the first (exactly: it holds float32);
    values near a boundary worked out again from ``given`` (:func:`before`). Raises for a value
    past float32's range or not finite."""
    name = str(func)
    for t, w in found:
        if rounding.magnitude(w) > rounding.FLOAT32_MAX:
            raise UnsupportedOpError(
                f"{WHERE}{name} gives a value past float32's range, or not finite: {INIT_FIX}",
                op=name,
                fix=INIT_FIX,
            )
        w = w.contiguous()
        out = rounding.rnd(w, rounding.MAX_BITS)
        near = (rounding.midpoint_distance(w, rounding.MAX_BITS) <= MARGIN).reshape(-1)
        if bool(near.any()):
            lanes = near.nonzero().squeeze(1)
            if len(found) != 1:
                raise _undecided(name)
            exact = _worked_out(func, given, tuple(w.shape), lanes.tolist())
            out.view(-1)[lanes] = torch.tensor(exact, dtype=torch.float64)
        t.copy_(out)


def _undecided(name: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"{WHERE}{name}: a float64 result lies within {MARGIN:g} of a float32 ulp of a rounding "
        f"boundary, where another machine's float64 libm could round it the other way, and vgame "
        f"cannot work it out again: {INIT_FIX}",
        op=name,
        fix=INIT_FIX,
    )


def _worked_out(func: Any, given: tuple[tuple[Any, ...], dict[str, Any]], shape: tuple[int, ...],
                lanes: list[int]) -> list[float]:  # fmt: skip
    """The values at flat positions ``lanes`` of the op's result (of ``shape``), worked out again
    at :data:`_PREC` bits from its arguments ``given`` and rounded to 24 bits, half to even."""
    name, (args, kwargs) = _name(func), given
    values: list[Any]
    with mpmath.workprec(_PREC):
        if name == "arange":
            values = _arange(args, lanes)
        else:
            arity, rule = _EXACT[name]
            operands = args[:arity]
            alpha = kwargs.get("alpha", args[2] if name in ("add", "sub") and len(args) > 2 else 1)
            if len(operands) != arity or kwargs.keys() - {"alpha", "out"} or not _real(alpha):
                raise _undecided(str(func))
            columns = [_lanes(x, shape, lanes, str(func)) for x in operands]
            values = [rule(*row, mpmath.mpf(alpha)) for row in zip(*columns, strict=True)]
    return [_round24(v, str(func)) for v in values]


def _real(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _lanes(x: Any, shape: tuple[int, ...], lanes: list[int], name: str) -> list[_Mpf]:
    """Operand ``x`` (a tensor broadcast to ``shape``, or a number) at the flat positions ``lanes``."""
    if isinstance(x, Tensor):
        flat = torch.broadcast_to(x.detach().to(torch.float64), shape).reshape(-1)
        return [mpmath.mpf(v) for v in flat[torch.tensor(lanes)].tolist()]
    if not _real(x):
        raise _undecided(name)
    return [mpmath.mpf(x)] * len(lanes)


def _arange(args: tuple[Any, ...], lanes: list[int]) -> list[Fraction]:
    """``arange``'s values at ``lanes``: ``start + i * step``, exactly."""
    numbers = [a for a in args if _real(a)]
    start, step = (Fraction(0), Fraction(1)) if len(numbers) < 2 else (Fraction(numbers[0]), Fraction(1))
    if len(numbers) >= 3:
        step = Fraction(numbers[2])
    return [start + i * step for i in lanes]


def _round24(v: _Mpf | Fraction, name: str) -> float:
    """``v`` (an exact rational, or an mpmath number at :data:`_PREC` bits) rounded to 24 bits,
    half to even (:func:`~game.training.dispatch.initrules.exact_float32`): float32's rounding, for
    a normal float32 value; anything else raises."""
    if isinstance(v, mpmath.mpf) and mpmath.isfinite(v):
        man, exp = v.man_exp  # of the magnitude
        v = Fraction(-man if v < 0 else man) * Fraction(2) ** exp
    r = exact_float32(v) if isinstance(v, Fraction) else None  # else complex: a power of a negative number
    if r is None:
        raise _undecided(name)
    return r


__all__ = ["MARGIN", "NEAREST", "before", "rounds_to_nearest", "to_nearest"]
