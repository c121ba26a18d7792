"""Ties in ``sort``, ``argsort``, ``topk``, the selections (``kthvalue``, ``median``,
``nanmedian``, ``mode``), ``msort`` and ``quantile``, broken the same way on every device.

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

The selections return one element's index along a dim, and their backward puts the gradient
there: with ties, which element is the algorithm's (torch's documentation says so of ``median``:
"device-specific"; this CPU's ``kthvalue`` picks a tied element far from the first). Each now
reads its element off the same stable sort: ``kthvalue`` the ``k``-th, ``median`` the lower
median (or the first NaN, whose value torch returns when a row has one), ``nanmedian`` the lower
median of the row's numbers, ``mode`` the smallest of the most frequent values at its last
index (NaN counted as one value, as torch counts it). Values are torch's; the gradient reaches the
element through the sort's own backward. Their forms without a dim are left to torch (a value
alone). ``msort`` and ``quantile`` (``nanquantile``) sort inside ATen, where this mode cannot
reach, and their backward puts each place's gradient on the element the sort put there: they
run here as a stable sort, ``quantile`` as ATen's own steps after it (the same ops, so torch's
values bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch

from game.training.dispatch.draws import Draws, name_of, named_args, serves


def _stable(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``sort``'s or ``argsort``'s call as a stable sort: the sort's (values, indices), or None for
    a call with keywords not served (``out=``)."""
    given = named_args(("self", "dim", "descending"), args, kwargs)
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
    given = named_args(("self", "k", "dim", "largest", "sorted"), args, kwargs)
    if given.keys() - {"self", "k", "dim", "largest", "sorted"}:
        return func(*args, **kwargs)
    x, k, dim = given["self"], int(given["k"]), given.get("dim", -1)
    if x.dim() == 0:  # a scalar: torch's own answer (k is 0 or 1)
        return func(*args, **kwargs)
    values, indices = torch.sort(x, dim=dim, descending=bool(given.get("largest", True)), stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


def _pick(x: torch.Tensor, dim: int, keepdim: bool, where: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The element of each row along ``dim`` that ``where(values, indices)`` (the row's stable
    ascending sort, ``dim`` moved last) places, as (values, indices) shaped as torch's."""
    values, indices = torch.sort(x.movedim(dim, -1), dim=-1, stable=True)
    at = where(values, indices).unsqueeze(-1)
    chosen = values.gather(-1, at), indices.gather(-1, at)
    if keepdim:
        return chosen[0].movedim(-1, dim), chosen[1].movedim(-1, dim)
    return chosen[0].squeeze(-1), chosen[1].squeeze(-1)


def _selection(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], dim_optional: bool = True
) -> tuple[torch.Tensor, int, bool, dict[str, Any]] | None:
    """A selection's (input, dim, keepdim, arguments), or None for a call left to torch: no dim
    where that means a value alone (``median``'s), ``out=``, a scalar or an empty row."""
    given = named_args(names, args, kwargs)
    x = given.get("self")
    if given.keys() - set(names) or ("dim" not in given and not dim_optional):
        return None
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0 or x.is_complex():
        return None
    dim = given.get("dim", -1)
    if not isinstance(dim, int):  # a named dimension: torch's own answer
        return None
    return x, dim, bool(given.get("keepdim", False)), given


@serves(torch.kthvalue, torch.Tensor.kthvalue)
def _kthvalue(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _selection(args, kwargs, ("self", "k", "dim", "keepdim"))
    if call is None:
        return func(*args, **kwargs)
    x, dim, keepdim, given = call
    k = int(given["k"])
    if not 1 <= k <= x.shape[dim]:  # torch's own error
        return func(*args, **kwargs)
    return torch.return_types.kthvalue(
        _pick(
            x, dim, keepdim, lambda v, i: torch.full(v.shape[:-1], k - 1, dtype=torch.long, device=v.device)
        )
    )


def _numbers(values: torch.Tensor) -> torch.Tensor:
    """How many of each sorted row's values are not NaN (a sort puts NaN last)."""
    return (~values.isnan()).sum(-1)


@serves(torch.median, torch.Tensor.median)
def _median(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _selection(args, kwargs, ("self", "dim", "keepdim"), dim_optional=False)
    if call is None:
        return func(*args, **kwargs)
    x, dim, keepdim, _ = call
    n = x.shape[dim]

    def lower_median_or_first_nan(values: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        numbers = _numbers(values)
        return torch.where(numbers < n, numbers, (n - 1) // 2)

    return torch.return_types.median(_pick(x, dim, keepdim, lower_median_or_first_nan))


@serves(torch.nanmedian, torch.Tensor.nanmedian)
def _nanmedian(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _selection(args, kwargs, ("self", "dim", "keepdim"), dim_optional=False)
    if call is None:
        return func(*args, **kwargs)
    x, dim, keepdim, _ = call
    return torch.return_types.nanmedian(
        _pick(x, dim, keepdim, lambda v, i: (_numbers(v).clamp(min=1) - 1) // 2)
    )


def _last_of_commonest(values: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    """The sorted position ending the longest run of equal values (the first such run: the
    smallest value; NaNs one run), found with comparisons and integer ops only."""
    n = values.shape[-1]
    at = torch.arange(n, device=values.device).expand(values.shape)
    starts = torch.ones(values.shape, dtype=torch.bool, device=values.device)
    nan = values.isnan()
    starts[..., 1:] = (values[..., 1:] != values[..., :-1]) & ~(nan[..., 1:] & nan[..., :-1])
    ends = torch.ones(values.shape, dtype=torch.bool, device=values.device)
    ends[..., :-1] = starts[..., 1:]
    run_start = torch.where(starts, at, 0).cummax(-1).values
    lengths = torch.where(ends, at - run_start + 1, 0)
    return lengths.argmax(-1)  # the first maximal one: torch documents it


@serves(torch.mode, torch.Tensor.mode)
def _mode(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _selection(args, kwargs, ("self", "dim", "keepdim"))
    if call is None:
        return func(*args, **kwargs)
    x, dim, keepdim, _ = call
    return torch.return_types.mode(_pick(x, dim, keepdim, _last_of_commonest))


@serves(torch.msort, torch.Tensor.msort)
def _msort(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = named_args(("self",), args, kwargs)
    if given.keys() != {"self"} or not isinstance(given["self"], torch.Tensor):
        return func(*args, **kwargs)
    return torch.sort(given["self"], dim=0, stable=True).values


_INTERPOLATIONS = ("linear", "lower", "higher", "nearest", "midpoint")


@serves(torch.quantile, torch.Tensor.quantile, torch.nanquantile, torch.Tensor.nanquantile)
def _quantile(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """ATen's ``quantile_compute`` step by step (the same ops, so the same values), on a stable
    sort: the gradient reaches the same elements among ties on every device."""
    names = ("self", "q", "dim", "keepdim")
    given = named_args(names, args, kwargs)
    x, q, dim = given.get("self"), given.get("q"), given.get("dim")
    how = given.get("interpolation", "linear")
    if (
        given.keys() - {*names, "interpolation"}
        or not isinstance(x, torch.Tensor)
        or x.dtype not in (torch.float32, torch.float64)
        or x.numel() == 0
        or how not in _INTERPOLATIONS
        or not (dim is None or isinstance(dim, int))
        or not (
            isinstance(q, float | int)
            or (isinstance(q, torch.Tensor) and q.dtype == x.dtype and q.dim() <= 1)
        )
    ):
        return func(*args, **kwargs)  # torch's own answer, or its own error
    q = q if isinstance(q, torch.Tensor) else torch.tensor(float(q), dtype=x.dtype, device=x.device)
    if q.device.type == "cpu" and not bool(((q >= 0) & (q <= 1)).all()):
        return func(*args, **kwargs)  # its error
    keepdim = bool(given.get("keepdim", False))
    if dim is None:
        rows = x.flatten()
        kept = [1] * x.dim() if keepdim else []
    else:
        dim = dim % max(x.dim(), 1)
        rows = x.unsqueeze(-1).transpose(dim, -1)
        kept = list(x.shape)
        kept[dim : dim + 1] = [1] if keepdim else []
    ordered = torch.sort(rows, dim=-1, stable=True).values.reshape(*kept, rows.shape[-1])
    if name_of(func) == "nanquantile":
        ranks = q * ((~ordered.isnan()).sum(-1, keepdim=True) - 1)
        ranks = ranks.masked_fill(ranks < 0, 0)
    else:
        last = ordered.shape[-1] - 1
        scaled, nan = torch.broadcast_tensors(q * last, ordered.isnan().any(-1, keepdim=True))
        ranks = scaled.masked_fill(nan, last)
    ranks = {"lower": torch.floor, "higher": torch.ceil, "nearest": torch.round}.get(how, lambda r: r)(ranks)
    below = ranks.to(torch.long)
    values = ordered.gather(-1, below)
    if how in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if how == "midpoint" else ranks - below
        values = values.lerp(ordered.gather(-1, ranks.ceil().to(torch.long)), weights)
    return values.squeeze(-1) if q.dim() == 0 else values.unsqueeze(0).transpose(0, -1).squeeze(-1)


__all__: list[str] = []
