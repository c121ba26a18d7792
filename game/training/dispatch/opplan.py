"""An op's plan: what the rounding mode needs to know of one ATen op overload, worked out once from
the tables of :mod:`~game.training.dispatch.optable`, and what one call of it computes from its
arguments (its class, where that depends on them; the tensors it produced or changed).

Apart from the tables because it is their reading, not a table: the Python mode
(:mod:`~game.training.dispatch.mode`), the C++ front's rows (:mod:`~game.training.dispatch.front`)
and the construction mode (:mod:`~game.training.dispatch.initmode`) all read an op through
:func:`plan_of`, so all three round the same tensors of the same ops.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from game.training.dispatch.optable import (
    COMPLEX_INEXACT,
    GRADIENT_REFUSED,
    HIDDEN_WRITES,
    OpClass,
    base_name,
    op_name,
    static_class,
)


def _arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    i = _positions(func).get(name)
    return args[i] if i is not None and i < len(args) else default


_arg_positions: dict[int, tuple[Any, dict[str, int]]] = {}


def _positions(func: Any) -> dict[str, int]:
    """Positions of ``func``'s arguments that may be passed positionally (reading the schema's
    arguments costs microseconds, and add/sub/div ask on every call)."""
    entry = _arg_positions.get(id(func))
    if entry is None or entry[0] is not func:
        found = {a.name: i for i, a in enumerate(func._schema.arguments) if not a.kwarg_only}
        entry = _arg_positions[id(func)] = (func, found)
    return entry[1]


def _is_big_tensor(x: Any) -> bool:
    if isinstance(x, list | tuple):
        return all(_is_big_tensor(v) for v in x)
    return isinstance(x, Tensor) and x.dim() > 0


class OpPlan(NamedTuple):
    """What the mode needs to know of an op whatever its arguments, worked out once per overload."""

    func: Any
    name: str  # str(func): the op name in the log and in coverage sets
    fixed: OpClass | None  # the op's class, or None when it depends on the arguments
    written: tuple[tuple[int, str, bool], ...]  # see _written_args
    hidden: tuple[tuple[int, ...], int] | None  # see HIDDEN_WRITES


#: Plans by ``id(func)``: an int key, where a dict keyed by the OpOverload itself would call its
#: Python ``__hash__`` (some 600 ops a step, each looked up several times, made that milliseconds).
_plans: dict[int, OpPlan] = {}


def plan_of(func: Any) -> OpPlan:
    plan = _plans.get(id(func))
    if plan is None or plan.func is not func:  # ids of overloads are stable (their packets keep them)
        plan = OpPlan(
            func, op_name(func), static_class(func), _written_args(func), HIDDEN_WRITES.get(base_name(func))
        )
        _plans[id(func)] = plan
    return plan


def classify(func: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> OpClass:
    """The class of one call of ``func`` (an OpOverload) with these arguments."""
    fixed = plan_of(func).fixed
    if fixed is not None:
        return fixed
    return conditional_class(func, args, kwargs or {})


def conditional_class(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpClass:
    """The class of a call of one of the ``CONDITIONAL_OPS``, from its arguments."""
    name = base_name(func)
    if name in COMPLEX_INEXACT:
        if any(isinstance(a, Tensor) and a.is_complex() for a in (*args, *kwargs.values())):
            return OpClass.INEXACT
        if name != "div":
            return OpClass.EXACT
    if name in ("add", "sub", "rsub"):
        # a + alpha*b is fused (FMA) for alpha != 1: not IEEE-exact.
        return OpClass.EXACT if _arg(func, args, kwargs, "alpha", 1) == 1 else OpClass.INEXACT
    if name == "div":
        # No rounding mode and a real tensor divisor: CUDA turns division by a scalar into a multiply
        # by its reciprocal, which is not correctly rounded.
        if _arg(func, args, kwargs, "rounding_mode", None) is not None or len(args) < 2:
            return OpClass.INEXACT
        return OpClass.EXACT if _is_big_tensor(args[1]) else OpClass.INEXACT
    if name == "index_put":
        return OpClass.INEXACT if _arg(func, args, kwargs, "accumulate", False) else OpClass.MOVE
    if name == "scatter":
        return OpClass.INEXACT if "reduce" in func._overloadname else OpClass.MOVE
    if name == "round":  # round to integer is exact; round(decimals=n) scales by 10**n
        return OpClass.EXACT if func._overloadname in ("default", "out") else OpClass.INEXACT
    if name in GRADIENT_REFUSED:
        x = args[0] if args else None
        differentiated = isinstance(x, Tensor) and x.requires_grad and torch.is_grad_enabled()
        return OpClass.REFUSED if differentiated else OpClass.INEXACT
    return OpClass.INEXACT


# ---- which tensors an op produced or changed ------------------------------------------------------


def _tensors(x: Any) -> Iterator[Tensor]:
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, list | tuple):
        for v in x:
            yield from _tensors(v)


def _key(t: Tensor) -> tuple[Any, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


@functools.cache
def _written_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg-only) of the arguments the schema marks as written (``Tensor(a!)``)."""
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def touched_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[Tensor]:
    """Arguments the op mutates (schema ``(a!)`` plus known hidden writes), then its fresh outputs."""
    return touched_by(plan_of(func), args, kwargs, out)


def touched_by(plan: OpPlan, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[Tensor]:
    if not plan.written and plan.hidden is None:  # a functional op: only its fresh outputs
        return [out] if isinstance(out, Tensor) else list(_tensors(out))
    found: list[Tensor] = []
    for i, name, kwarg_only in plan.written:
        value = kwargs.get(name) if kwarg_only or name in kwargs else (args[i] if i < len(args) else None)
        found.extend(_tensors(value))
    hidden = plan.hidden
    if hidden is not None:
        positions, training_pos = hidden
        if len(args) > training_pos and args[training_pos]:
            found.extend(t for p in positions for t in _tensors(args[p]))
    if not found:  # a functional op: its outputs are fresh tensors, distinct from each other
        return list(_tensors(out))
    if isinstance(out, Tensor) and any(out is t for t in found):  # an in-place op returns its self
        return found
    seen = {_key(t) for t in found}
    for t in _tensors(out):
        k = _key(t)
        if k not in seen:
            seen.add(k)
            found.append(t)
    return found


__all__ = ["OpPlan", "classify", "conditional_class", "plan_of", "touched_by", "touched_tensors"]
