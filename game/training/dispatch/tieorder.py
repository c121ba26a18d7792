"""Ties in ``sort``, ``argsort`` and ``topk``, broken the same way on every device.

Why: a sort's values are the same everywhere, but the order of equal values is its algorithm's:
torch's CPU ``topk`` (a selection) and its unstable sort return tied elements in an order of their
own, and CUDA's kernels in another. Values on the grid tie often (a ReLU's zeros, a TopK sparse
autoencoder whose row has fewer than k positive pre-activations, integer keys), and a step that
uses the indices (gathering a decoder's rows, routing tokens to experts) then computed otherwise
on a GPU than on a CPU, which the rounding log cannot correct. Each of these calls now runs as a
stable sort (``stable=True``: equal values in index order, which torch guarantees on every
device), ``topk`` taking its first ``k``: the lowest indices among ties at the cut. ``topk`` with
``sorted=False`` gives them sorted too (any order is its answer). Calls with ``out=`` are left
as they are.
"""

from __future__ import annotations

from typing import Any

import torch

from game.training.dispatch.draws import Draws, serves


def _given(names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by name (the first, ``self`` or ``input``, as ``self``)."""
    given = dict(zip(names, args, strict=False)) | kwargs
    if "input" in given:
        given["self"] = given.pop("input")
    return given


def _stable(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``sort``'s or ``argsort``'s call as a stable sort: the sort's (values, indices), or None for
    a call with keywords not served (``out=``)."""
    given = _given(("self", "dim", "descending"), args, kwargs)
    if given.keys() - {"self", "dim", "descending", "stable"}:
        return None
    dim, descending = given.get("dim", -1), bool(given.get("descending", False))
    return torch.sort(given["self"], dim=dim, descending=descending, stable=True)


@serves(torch.sort, torch.Tensor.sort)
def _sort(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    done = _stable(func, args, kwargs)
    return func(*args, **kwargs) if done is None else done


@serves(torch.argsort, torch.Tensor.argsort)
def _argsort(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    done = _stable(func, args, kwargs)
    return func(*args, **kwargs) if done is None else done.indices


@serves(torch.topk, torch.Tensor.topk)
def _topk(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = _given(("self", "k", "dim", "largest", "sorted"), args, kwargs)
    if given.keys() - {"self", "k", "dim", "largest", "sorted"}:
        return func(*args, **kwargs)
    x, k, dim = given["self"], int(given["k"]), given.get("dim", -1)
    if x.dim() == 0:  # a scalar: torch's own answer (k is 0 or 1)
        return func(*args, **kwargs)
    values, indices = torch.sort(x, dim=dim, descending=bool(given.get("largest", True)), stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


__all__: list[str] = []
