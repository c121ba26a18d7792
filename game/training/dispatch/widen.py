"""An inexact op on float32 tensors, computed in float64 and brought back to float32 on the grid.

A model that casts to float32 on purpose (transformers' Llama: its rotary table's ``cos`` and
``sin``, its RMSNorm's ``mean`` and ``rsqrt``) runs float32 ops whose results are the machine's
own: another CPU's libm, or a GPU, differs by an ulp. Exact float32 ops (IEEE additions,
multiplications, copies) are the same everywhere and pass; an inexact one is run again here on its
arguments widened to float64 (float32 tensors widened, a ``dtype=float32`` argument made float64),
so that its float64 result can be rounded to the grid as any float64 result is (in a step, through
the log; at construction, to nearest, see :mod:`~game.training.dispatch.nearest`), and then written into the
float32 result, which it fits exactly: the task's grid is float32's.

A float32 result may also come from no float32 argument at all: torch's default dtype, in a
factory (``torch.arange(0, 1, 0.1)``), a true division of integers, or a Python float with an
integer or boolean tensor (Phimoe's router: ``torch.add(0.3333, mask, alpha=0.6667)``). Its twin is
the same call under a float64 default dtype (:func:`default_twin`), run after the op: such a call
overwrites no float32 tensor, so its arguments are still as they were.

A call may also take float32 tensors beside float64 ones (:func:`mixed`): a model written for
float32 casts its input (``x.float()``) and meets the step's float64 parameters, a mix torch
refuses in a matrix product, a convolution, a norm or an indexed write. Where torch refuses it, the
call runs as its float64 twin alone, whose float64 results are the op's.

The Python dispatch mode and the model's construction call here; the C++ front
(``native/front.cpp``, ``widen_stack`` and ``default_twin``) does the same on its boxed stack, and
the two must agree.

Half and bfloat16 are widened too (:data:`IN_STEP`): torch's own optimizers compute in them on
purpose (``torch.optim.Muon`` runs its Newton-Schulz iteration on ``grad.bfloat16()``), and a
model may cast to them. Their inexact ops' results are the machine's own (a GPU's bfloat16 matrix
product accumulates in its own order), so such an op's twin runs in float64, is rounded to the grid
as a float32 result's is, and its value is then converted to half or bfloat16: an IEEE conversion
of a value both sides agree on, the same everywhere. Their exact ops (a product, a sum of two)
run as they are: torch computes them in float32 and converts once, on every device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from game.errors import UnsupportedOpError

#: The dtype an inexact op's tensors are widened from.
NARROW = torch.float32
#: The dtypes an inexact op's tensors are widened from in a step: float32's, and float16's and
#: bfloat16's, whose rounded value is converted to them when it is written back.
IN_STEP = (torch.float32, torch.float16, torch.bfloat16)
#: The dtypes widened at a model's construction: float32's, and float16's and bfloat16's, whose
#: result there is the nearest float32 converted once more (IEEE conversion, the same everywhere),
#: as torch computes them (in float32, then converted). A step leaves those two refused.
AT_CONSTRUCTION = (torch.float32, torch.float16, torch.bfloat16)
#: The dtypes a call that mixes them with float64 is widened from, where torch refuses the mix
#: (:func:`mixed`): a model cast to them on purpose, as at construction.
MIXED = AT_CONSTRUCTION


#: A complex tensor's dtype widened with its parts' (an FFT of float32 tensors gives complex64).
_COMPLEX_TWINS = {torch.float32: (torch.complex64, torch.complex128)}


def _wide_dtype(dtype: torch.dtype, narrow: tuple[torch.dtype, ...]) -> torch.dtype | None:
    """What a tensor of ``dtype`` is widened to (None: it is not)."""
    if dtype in narrow:
        return torch.float64
    for part, (small, wide) in _COMPLEX_TWINS.items():
        if dtype == small and part in narrow:
            return wide
    return None


def _narrow_in(x: Any, narrow: tuple[torch.dtype, ...]) -> bool:
    if isinstance(x, Tensor):
        return _wide_dtype(x.dtype, narrow) is not None
    if isinstance(x, list | tuple):
        return any(_narrow_in(v, narrow) for v in x)
    return isinstance(x, torch.dtype) and x in narrow


def narrow_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], narrow: tuple[torch.dtype, ...] = (NARROW,)
) -> bool:
    """Whether a call takes a float32 tensor or asks for a float32 result (``dtype=float32``): the
    calls :func:`widened` makes a float64 twin of (``narrow``: the dtypes widened, float32's alone
    but at construction, :data:`AT_CONSTRUCTION`)."""
    return _narrow_in(args, narrow) or _narrow_in(tuple(kwargs.values()), narrow)


def _float_kinds(x: Any, found: set[bool]) -> None:
    """Adds to ``found`` True for each tensor in ``x`` of :data:`MIXED`'s dtypes (or complex64),
    False for each float64 (or complex128) one."""
    if isinstance(x, Tensor):
        if x.dtype in MIXED or x.dtype == torch.complex64:
            found.add(True)
        elif x.dtype in (torch.float64, torch.complex128):
            found.add(False)
    elif isinstance(x, list | tuple):
        for v in x:
            _float_kinds(v, found)


def mixed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call takes float32 (or float16, bfloat16) tensors beside float64 ones. A model
    written for float32 casts on purpose (``x.float()`` on its input, ``.to(torch.float32)`` before
    a norm) and meets the step's float64 parameters; torch refuses such a mix in a matrix product,
    a convolution, a norm's parameters or an indexed write, where a float32 model never mixed. Such
    a call runs again as its float64 twin (:func:`widened` of :data:`MIXED`): float32 values are on
    the grid, so the twin computes what the float32 model would, and an in-place op's float32
    tensor takes its twin's values back (a bfloat16 one, those values converted as torch would)."""
    found: set[bool] = set()
    _float_kinds(args, found)
    _float_kinds(tuple(kwargs.values()), found)
    return len(found) == 2


def unaliased(out: Any, back: list[tuple[Tensor, Tensor]]) -> Any:
    """A twin's return value with each widened copy of a written tensor (an in-place op's ``self``,
    an ``out=``) replaced by the tensor itself, as the op would have returned it."""
    if isinstance(out, Tensor):
        return next((t for t, w in back if w is out), out)
    if isinstance(out, tuple | list):
        return type(out)(unaliased(v, back) for v in out)
    return out


def _widen(x: Any, narrow: tuple[torch.dtype, ...]) -> Any:
    if isinstance(x, Tensor):
        wide = _wide_dtype(x.dtype, narrow)
        return x if wide is None else x.to(wide)
    if isinstance(x, list | tuple):
        return type(x)(_widen(v, narrow) for v in x)
    return torch.float64 if isinstance(x, torch.dtype) and x in narrow else x


def widened(
    args: tuple[Any, ...], kwargs: dict[str, Any], narrow: tuple[torch.dtype, ...] = (NARROW,)
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's float64 twin: float32 tensors (those of ``narrow``'s dtypes) copied to float64
    (before the call, so that an in-place op's twin starts from the values the op started from),
    such dtypes asked for made float64."""
    return _widen(args, narrow), {k: _widen(v, narrow) for k, v in kwargs.items()}


def _apart(given: Any, wide: Any) -> Any:
    if isinstance(wide, Tensor):
        return wide.clone() if wide is given else wide
    if isinstance(wide, list | tuple) and isinstance(given, list | tuple):
        return type(wide)(_apart(g, w) for g, w in zip(given, wide, strict=False))
    return wide


def writes_apart(
    written: tuple[tuple[int, str, bool], ...],
    hidden: tuple[tuple[int, ...], int] | None,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    twin: tuple[tuple[Any, ...], dict[str, Any]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The twin's arguments (``twin``, :func:`widened` of ``call``) with its own copy of each tensor
    the op writes that widening left as it was: a float64 one is the same tensor, and the twin
    wrote it a second time after the op, so an in-place op with a float32 argument beside a float64
    ``self`` applied twice (ASGD's ``ax += mu * (p - ax)``, ``mu`` a float32 scalar tensor: ``ax``
    twice ``p``). ``written`` and ``hidden`` are the op's plan's (:class:`~game.training.dispatch.opplan.OpPlan`)."""
    (args, kwargs), (wide_args, wide_kwargs) = call, twin
    out_args, out_kwargs = list(wide_args), dict(wide_kwargs)
    places = list(written)
    if hidden is not None and len(args) > hidden[1] and args[hidden[1]]:
        places += [(i, "", False) for i in hidden[0]]
    for i, name, kwarg_only in places:
        if kwarg_only or name in kwargs:
            if name in kwargs:
                out_kwargs[name] = _apart(kwargs[name], wide_kwargs.get(name))
        elif i < len(args):
            out_args[i] = _apart(args[i], wide_args[i])
    return tuple(out_args), out_kwargs


@contextmanager
def _default_float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def defaulted(touched: list[Tensor]) -> bool:
    """Whether an op that took no float32 argument gave a float32 result: one in torch's default
    dtype, whose twin is :func:`default_twin`."""
    return any(t.dtype == NARROW for t in touched)


def default_twin(compute: Callable[[], Any]) -> Any:
    """The float64 twin of a call whose float32 result came from torch's default dtype: the call
    again (``compute``) with float64 as the default dtype."""
    with _default_float64():
        return compute()


def pairs(
    name: str,
    touched: list[Tensor],
    twins: list[Tensor],
    where: str = "",
    narrow: tuple[torch.dtype, ...] = (NARROW,),
) -> list[tuple[Tensor, Tensor]]:
    """The op's results beside its float64 twin's, one for one: (result, twin) for each float32 or
    float64 result whose twin is float64, and each complex one whose twin is complex128; any other
    result (half, bfloat16, integer) is paired with itself, so that its own checks still see it."""
    if len(touched) != len(twins) or any(t.shape != w.shape for t, w in zip(touched, twins, strict=True)):
        raise UnsupportedOpError(
            f"{where}{name}: its float64 twin gave other results than the float32 op, so it cannot be "
            "rounded: compute it in float64",
            op=name,
            fix="compute it in float64",
        )
    return [(t, w) if _twinned(t, w, narrow) else (t, t) for t, w in zip(touched, twins, strict=True)]


def _twinned(t: Tensor, w: Tensor, narrow: tuple[torch.dtype, ...]) -> bool:
    """Whether ``w`` is ``t``'s float64 twin: a real one's, or a complex one's (an FFT of float32
    tensors gives complex64, its twin complex128)."""
    if w.dtype == torch.float64:
        return t.dtype in narrow or t.dtype == torch.float64
    return w.dtype == torch.complex128 and t.dtype in (torch.complex64, torch.complex128)


def write_back(found: list[tuple[Tensor, Tensor]]) -> None:
    """Each result takes its twin's rounded values: exactly where it is float32 (they are on the
    float32 grid), converted by IEEE rounding to nearest where it is half or bfloat16."""
    for t, w in found:
        if t is not w:
            t.copy_(w)


__all__ = [
    "AT_CONSTRUCTION",
    "IN_STEP",
    "MIXED",
    "NARROW",
    "default_twin",
    "defaulted",
    "mixed",
    "narrow_inputs",
    "pairs",
    "unaliased",
    "widened",
    "write_back",
    "writes_apart",
]
