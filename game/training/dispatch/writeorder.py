"""Writes to repeated indices (``x[idx] = v``, ``index_put_``, ``scatter_``, ``index_copy_``,
``put_``): the last write wins on every device.

Why: torch documents these ops' result as undefined, or nondeterministic, where an index repeats:
the elements run in parallel and any of the values written to one place may stay. On this CPU
with two threads, ``x[idx] = v`` and ``x.index_copy_(0, idx, v)`` over a million repeated
indices left another value on most runs, and CUDA's kernels write in the order their threads
happen to run. A step that writes a batch's features into a bank by label (prototypes, a memory
queue) or scatters by a computed index then kept one value on the trainer's machine and another on
the auditor's, which the rounding log cannot correct: an honest trainer lost its audit.

Each such call is now made with values that agree wherever an index repeats: every written element
takes the value of the last element written to its place (in the row-major order of the written
elements, the order a sequential loop writes in), so the kernel may write them in any order and
the result is the same. Only the last element's value reaches its place, so only it receives a
gradient (torch's own backward gives every repeated element the place's gradient). Which
elements share a place is worked out with integer arithmetic, out of sight of the interceptors;
the values are picked with ordinary selections, under them. A call that cannot repeat (slices,
integers and masks as indices, a number as the value) and a call that accumulates (``accumulate=True``,
``reduce=``) go to torch as they are: accumulation is a sum, rounded and logged as any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from game.training.dispatch.draws import Draws, named_args, serves, suspended


def last_of_each_place(places: Tensor) -> Tensor:
    """For each element of ``places`` (flattened: the linear place it writes), the position of the
    last element that writes the same place."""
    with suspended():  # integer arithmetic: the same everywhere, nothing to round
        flat = places.reshape(-1)
        order = torch.sort(flat, stable=True).indices  # a place's writers stay in their order
        ordered = flat[order]
        last = torch.searchsorted(ordered, ordered, right=True) - 1  # each run's last, in sorted order
        winner = torch.empty_like(order)
        winner[order] = order[last]  # a permutation: no place repeats
        return winner


def _agreeing(values: Tensor, winner: Tensor, dim: int = 0) -> Tensor:
    """``values`` with each slice along ``dim`` replaced by its place's last one's (``winner``, from
    :func:`last_of_each_place`): the same values where a place repeats, the gradient reaching only
    the last (a loser's copy is detached)."""
    with suspended():
        own = winner == torch.arange(winner.numel(), device=winner.device)
        own = own.view([-1 if d == dim else 1 for d in range(values.dim())])
    return torch.where(own, values, values.detach().index_select(dim, winner))


def _write_call(
    names: tuple[str, ...], values: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, Any], Tensor, Tensor, Tensor] | None:
    """A write's arguments by name and its ``self``, ``index`` and values (the argument named
    ``values``), or None for a call torch makes as it is: another keyword (``value=``, ``reduce=``,
    ``out=``), an ``accumulate`` set, a number where a tensor goes, a single index."""
    given = named_args(names, args, kwargs)
    if given.keys() - set(names) or given.get("accumulate", False):
        return None
    x, index, source = given.get("self"), given.get("index"), given.get(values)
    if not (isinstance(x, Tensor) and isinstance(index, Tensor) and isinstance(source, Tensor)):
        return None
    return (given, x, index, source) if index.numel() > 1 else None


def _may_repeat(key: Any) -> bool:
    """Whether an index (a ``__getitem__`` key) may name one place twice: it holds an integer
    tensor of more than one element, or a list or array."""
    for item in key if isinstance(key, tuple) else (key,):
        if isinstance(item, Tensor):
            if item.dtype != torch.bool and item.numel() > 1:
                return True
        elif isinstance(item, list | np.ndarray):
            return True
    return False


def _strides(shape: torch.Size) -> list[int]:
    """A contiguous tensor's strides for ``shape``: an element's linear place."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _indexed_places(x: Tensor, key: Any) -> Tensor:
    """The linear place in ``x`` of each element of ``x[key]``, shaped as ``x[key]``: each dim's
    coordinates (an expanded view: no copy of ``x``'s size) indexed by ``key`` as ``x`` would be."""
    places: Tensor | None = None
    with suspended():
        for d, stride in enumerate(_strides(x.shape)):
            coords = torch.arange(x.shape[d], device=x.device)
            coords = coords.view([-1 if e == d else 1 for e in range(x.dim())]).expand(x.shape)
            part = coords[key] * stride
            places = part if places is None else places + part
    assert places is not None
    return places


def _agreeing_at(x: Tensor, key: Any, value: Any) -> Tensor | None:
    """``value`` broadcast to ``x[key]``'s shape with the values agreeing where ``key`` repeats a
    place, or None where nothing can repeat (or the call is torch's to refuse: a shape that does
    not broadcast)."""
    if not isinstance(value, Tensor) or value.numel() <= 1 or x.dim() == 0 or not _may_repeat(key):
        return None
    try:
        places = _indexed_places(x, key)
        while value.dim() > places.dim() and value.shape[0] == 1:  # torch drops leading unit dims
            value = value[0]
        spread = value.expand(places.shape).reshape(-1)
    except (IndexError, RuntimeError, TypeError, ValueError):
        return None
    return _agreeing(spread, last_of_each_place(places)).view(places.shape)


@serves(torch.Tensor.__setitem__)
def _setitem(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, key, value = args
    agreed = _agreeing_at(x, key, value)
    return func(x, key, value if agreed is None else agreed)


@serves(torch.index_put, getattr(torch, "index_put_", None), torch.Tensor.index_put, torch.Tensor.index_put_)
def _index_put(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = named_args(("self", "indices", "values", "accumulate"), args, kwargs)
    if given.keys() - {"self", "indices", "values", "accumulate"} or given.get("accumulate", False):
        return func(*args, **kwargs)
    key = tuple(slice(None) if i is None else i for i in given["indices"])
    agreed = _agreeing_at(given["self"], key, given["values"])
    if agreed is None:
        return func(*args, **kwargs)
    return func(given["self"], given["indices"], agreed)


@serves(torch.scatter, torch.Tensor.scatter, torch.Tensor.scatter_)
def _scatter(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _write_call(("self", "dim", "index", "src"), "src", args, kwargs)
    if call is None or "dim" not in call[0] or not call[1].dim() == call[2].dim() == call[3].dim():
        return func(*args, **kwargs)
    given, x, index, src = call
    dim = int(given["dim"]) % index.dim()
    with suspended():
        places = torch.zeros_like(index)
        for e, stride in enumerate(_strides(x.shape)):  # an element's own coordinates, but along dim
            coords = torch.arange(index.shape[e], device=index.device)
            coords = index if e == dim else coords.view([-1 if f == e else 1 for f in range(index.dim())])
            places = places + coords * stride
    used = src[tuple(slice(0, size) for size in index.shape)].reshape(-1)
    agreed = _agreeing(used, last_of_each_place(places)).view(index.shape)
    return func(x, given["dim"], index, agreed)


@serves(torch.index_copy, torch.Tensor.index_copy, torch.Tensor.index_copy_)
def _index_copy(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _write_call(("self", "dim", "index", "source"), "source", args, kwargs)
    if call is None or "dim" not in call[0] or call[3].dim() == 0:
        return func(*args, **kwargs)
    given, x, index, source = call
    dim = int(given["dim"]) % source.dim()
    agreed = _agreeing(source, last_of_each_place(index), dim)
    return func(x, given["dim"], index, agreed)


@serves(torch.put, torch.Tensor.put, torch.Tensor.put_)
def _put(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _write_call(("self", "index", "source", "accumulate"), "source", args, kwargs)
    if call is None or call[2].numel() != call[3].numel() or call[1].numel() == 0:
        return func(*args, **kwargs)
    _, x, index, source = call
    with suspended():
        places = torch.remainder(index, x.numel())  # put_ takes negative indices from the end
    agreed = _agreeing(source.reshape(-1), last_of_each_place(places)).view(source.shape)
    return func(x, index, agreed)


__all__ = ["last_of_each_place"]
