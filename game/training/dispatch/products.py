"""``prod`` and ``cumprod`` with a gradient, by one formula on every interceptor.

Why: PyTorch computes these two ops' gradients by one formula where a Python dispatch mode is on
(cumulative products: ``areAnyTensorSubclassLike``) and by another where none is (a division of
the result by the input), so a trainer through the C++ front and an auditor or a judge through the
Python mode would run, round and log different ops; the interceptors refuse them where they are
differentiated (``optable.GRADIENT_REFUSED``). A model that multiplies probabilities (``(1 -
p).prod(-1)``, a stick-breaking ``cumprod``, a geometric mean) could not train. In a step they now
run as autograd functions of vgame's own: the forward is torch's op, the backward written out with
ordinary ops (cumulative products and sums, a division), which every interceptor sees alike, so
the trainer's log fits every replay. The formulas handle zeros exactly (no division by one):

* ``prod``: each input's gradient is the product of the others, the exclusive cumulative products
  from the left and from the right multiplied;
* ``cumprod``: before a row's first zero, the reversed cumulative sum of ``grad * out`` divided by
  the input; at the first zero, the product before it times the sum over the later outputs of
  ``grad`` times the product of the inputs after it; after it, zero (every later output holds it).

The values are torch's to the last bit where the forward is (the same op); the gradients agree with
torch's to rounding (``gradcheck``), not bit for bit. A call with ``dtype=`` or ``out=``, on
integers, or with no gradient asked for is torch's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.training.dispatch.draws import Draws, named_args, serves


def _differentiated(x: Any) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point() and x.requires_grad and torch.is_grad_enabled()


def _exclusive_products(x: Tensor, dim: int) -> Tensor:
    """For each element along ``dim``, the product of the others there."""
    n = x.shape[dim]
    ones = torch.ones_like(x.narrow(dim, 0, 1))
    left = torch.cat([ones, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    right = torch.cat([x.narrow(dim, 1, n - 1), ones], dim).flip(dim).cumprod(dim).flip(dim)
    return left * right


class _Prod(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int | None, keepdim: bool) -> Tensor:
        ctx.save_for_backward(x)
        ctx.dim, ctx.keepdim = dim, keepdim
        return torch.prod(x) if dim is None else torch.prod(x, dim, keepdim=keepdim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (x,) = ctx.saved_tensors
        if ctx.dim is None:
            flat = x.reshape(-1)
            return (grad * _exclusive_products(flat, 0)).reshape(x.shape), None, None
        if x.dim() == 0:
            return grad.clone(), None, None
        dim = ctx.dim % x.dim()
        if not ctx.keepdim:
            grad = grad.unsqueeze(dim)
        return grad * _exclusive_products(x, dim), None, None


class _Cumprod(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> Tensor:
        out = torch.cumprod(x, dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        x, out = ctx.saved_tensors
        if x.dim() == 0:
            return grad.clone(), None
        dim = ctx.dim % x.dim()
        n = x.shape[dim]
        shape = [1] * x.dim()
        shape[dim] = n
        at = torch.arange(n, device=x.device).reshape(shape)
        zero = x == 0
        # the first zero's index in each row (n where there is none)
        first = torch.where(zero, at, torch.full_like(at, n)).amin(dim, keepdim=True)
        before, at_first, after_first = at < first, at == first, at > first
        # before it: sum over k >= i of grad_k out_k, over x_i
        tail = (grad * out).flip(dim).cumsum(dim).flip(dim)
        grad_in = torch.where(before, tail / torch.where(before, x, torch.ones_like(x)), torch.zeros_like(x))
        # at it: (the product before it) times the sum over k >= it of grad_k prod_{it < j <= k} x_j
        later = torch.where(after_first, x, torch.ones_like(x)).cumprod(dim)
        reach = torch.where(at >= first, grad * later, torch.zeros_like(x)).sum(dim, keepdim=True)
        prev = torch.cat([torch.ones_like(x.narrow(dim, 0, 1)), out.narrow(dim, 0, n - 1)], dim)
        return torch.where(at_first, prev * reach, grad_in), None


@serves(torch.prod, torch.Tensor.prod)
def _prod(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = named_args(("self", "dim", "keepdim"), args, kwargs)
    if not _differentiated(given.get("self")) or given.keys() - {"self", "dim", "keepdim"}:
        return func(*args, **kwargs)
    dim = given.get("dim")
    if dim is not None and not isinstance(dim, int):  # a dimension's name: torch's own
        return func(*args, **kwargs)
    return _Prod.apply(given["self"], dim, bool(given.get("keepdim", False)))


@serves(torch.cumprod, torch.Tensor.cumprod)
def _cumprod(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = named_args(("self", "dim"), args, kwargs)
    if (
        not _differentiated(given.get("self"))
        or given.keys() != {"self", "dim"}
        or not isinstance(given["dim"], int)
    ):
        return func(*args, **kwargs)
    return _Cumprod.apply(given["self"], given["dim"])
