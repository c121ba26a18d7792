"""The inexact ops a model's construction serves by an exact rule of their own
(:mod:`~game.training.dispatch.initmode`; the others it rounds to nearest,
:mod:`~game.training.dispatch.nearest`).

At construction there is no log, so an inexact op's result may pass only where every machine gives
the same bits: ``torch.linspace`` (each value worked out exactly and rounded once), a 2-norm
(the sum of squares taken exactly, :func:`norm2`) with the weight norm built on it (Wav2Vec2's,
HuBERT's and WavLM's positional convolution), whose kernels sum in an order each machine's vector
code chooses, and matrix products (a spectral norm's power iteration) and a QR factorisation
(``nn.init.orthogonal_``'s), by :mod:`~game.training.dispatch.fixedorder`, where BLAS and LAPACK
sum in an order of their own, and running sums and products (a diffusion model's noise schedule)
taken one element after another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch import fixedorder

#: What to do instead of an inexact op at construction.
INIT_FIX = (
    "use an exact initialiser (nn.init's uniform_, normal_, kaiming_*, xavier_*, trunc_normal_ within "
    "+-2 std, orthogonal_, constant_, zeros_, ones_ are served exactly), or, where the model's own initialisation "
    "computes it, give the weights as init_weights and build the model without that initialisation "
    "(a transformers model: inside transformers.initialization.no_init_weights())"
)

#: The same for a complex tensor (FNO's ``scale * torch.rand(..., dtype=torch.cfloat)``: a product
#: with a complex tensor is inexact, as in a step).
COMPLEX_INIT_FIX = (
    "scale a complex parameter's parts as real tensors and pack them (torch.complex(s * torch.rand(n), "
    "s * torch.rand(n)) is exact: a product with a complex tensor is not); or " + INIT_FIX
)

WHERE = "model construction: "


def _linspace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``linspace(start, end, steps)`` from two real numbers, each value ``start + (end - start) * i /
    (steps - 1)`` worked out exactly and rounded once: torch's kernel rounds a step and then a
    product and a sum, in an order (and with fused multiply-adds) that its vector and scalar code
    and each machine choose. Vision models take their stochastic-depth rates from it at
    construction (``torch.linspace(0, config.drop_path_rate, sum(config.depths))``). None for
    anything else (tensor bounds, a complex or integer result), which runs as it is."""
    start, end, steps = (*args, None, None, None)[:3]
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    real = (int, float)
    if not (isinstance(start, real) and isinstance(end, real) and isinstance(steps, int) and steps >= 0):
        return None
    if isinstance(start, bool) or isinstance(end, bool) or not dtype.is_floating_point:
        return None
    a, b = Fraction(start), Fraction(end)
    exact = [a + (b - a) * i / (steps - 1) for i in range(steps)] if steps > 1 else [a] * steps
    if dtype == torch.float64:
        values: list[float | None] = [float(q) for q in exact]  # correctly rounded (Fraction's float)
    else:
        values = [exact_float32(q) for q in exact]
        if None in values:
            raise UnsupportedOpError(
                f"{WHERE}aten.linspace.default gives a value past float32's normal range: {INIT_FIX}",
                op="aten.linspace.default",
                fix=INIT_FIX,
            )
    return torch.tensor(values, dtype=torch.float64, device=kwargs.get("device")).to(dtype)


#: float32's least and largest normal magnitudes.
_FLOAT32_NORMAL = (2.0**-126, float(torch.finfo(torch.float32).max))


def exact_float32(q: Fraction) -> float | None:
    """The rational ``q`` rounded to 24 bits, half to even: float32's rounding to nearest, done
    exactly (by way of a float64 it could round twice). None where the result is neither 0 nor a
    normal float32 (past float32's range, or below its least normal magnitude)."""
    if q == 0:
        return 0.0
    n, d = abs(q.numerator), q.denominator
    e = n.bit_length() - d.bit_length() - 24  # n / d / 2**e lies in [2**23, 2**25)
    if n << max(0, -e) >= (d << max(0, e)) << 24:
        e += 1  # now in [2**23, 2**24): 24 bits before the point
    num, den = n << max(0, -e), d << max(0, e)
    m, rest = divmod(num, den)
    if 2 * rest > den or (2 * rest == den and m & 1):
        m += 1
    if not -300 < e < 300:  # far past float32's range (and 2.0**e's)
        return None
    r = float(m) * 2.0**e
    if not _FLOAT32_NORMAL[0] <= r <= _FLOAT32_NORMAL[1]:
        return None
    return r if q > 0 else -r


#: The magnitudes whose squares :func:`norm2` takes exactly: a value's two halves, and their
#: products, stay normal floats (a weight is nowhere near either end).
_NORM_RANGE = (2.0**-400, 2.0**400)

#: Veltkamp's splitter for float64: ``x`` = ``hi + lo`` with 26 significant bits in each.
_SPLIT = 2.0**27 + 1


def norm2(x: Tensor, dims: Sequence[int] | None, keepdim: bool) -> Tensor | None:
    """The 2-norm of float64 ``x`` over ``dims`` (all when None or empty): each square split into
    three floats that sum to it exactly (Veltkamp), their sum rounded once (``math.fsum``), and
    its IEEE square root. Every step is IEEE-exact or exactly rounded, so the result is the same
    on every machine; torch's own kernel sums in an order its vector code chooses. None for
    anything else (another dtype, values past :data:`_NORM_RANGE`), which the caller refuses."""
    if x.dtype != torch.float64 or x.is_complex() or x.is_meta:  # on "meta": no values to differ
        return None
    a = x.detach().abs().cpu()
    nonzero = a[a != 0]
    if nonzero.numel() and not (_NORM_RANGE[0] <= float(nonzero.min()) and float(a.max()) <= _NORM_RANGE[1]):
        return None
    t = a * _SPLIT
    hi = t - (t - a)
    lo = a - hi
    parts = torch.stack((hi * hi, hi * lo * 2.0, lo * lo))  # each product exact: 26 bits by 26
    ndim = x.dim()
    reduced = sorted({d % ndim for d in dims}) if dims and ndim else list(range(ndim))
    kept = [d for d in range(ndim) if d not in reduced]
    rows = parts.permute(0, *(d + 1 for d in kept), *(d + 1 for d in reduced)).reshape(
        3, -1, max(1, math.prod(x.shape[d] for d in reduced))
    )
    sums = [math.sqrt(math.fsum(rows[:, r].reshape(-1).tolist())) for r in range(rows.shape[1])]
    out = torch.tensor(sums, dtype=torch.float64).reshape([x.shape[d] for d in kept])
    if keepdim:
        for d in reduced:
            out = out.unsqueeze(d)
    return out.to(x.device)


def _norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``aten.norm.ScalarOpt_dim(x, p, dim, keepdim=False)`` with ``p`` 2: :func:`norm2`."""
    x, p, dims = (*args, None, None)[:3]
    keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    if p != 2 or kwargs.get("dtype") is not None:
        return None
    return norm2(x, dims, bool(keepdim))


def _vector_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``aten.linalg_vector_norm(x, ord=2, dim=None, keepdim=False)``: :func:`norm2`."""
    names = ("ord", "dim", "keepdim")
    given = {**dict(zip(names, args[1:], strict=False)), **kwargs}
    if given.get("ord", 2) != 2 or given.get("dtype") is not None:
        return None
    return norm2(args[0], given.get("dim"), bool(given.get("keepdim", False)))


def _weight_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
    """``aten._weight_norm_interface(v, g, dim)``: ``(v * (g / n), n)``, ``n`` the 2-norm of ``v``
    over every dim but ``dim`` (:func:`norm2`), shaped as ``g``; the rest is IEEE arithmetic."""
    v, g, dim = (*args, kwargs.get("dim", 0))[:3]
    if kwargs.keys() - {"dim"} or not isinstance(g, Tensor) or g.dtype != torch.float64:
        return None
    dim = dim % v.dim()
    n = norm2(v, [d for d in range(v.dim()) if d != dim], keepdim=True)
    if n is None:
        return None
    n = n.reshape(g.shape)
    return v * (g / n), n


def _qr(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
    """``aten.linalg_qr(a, mode="reduced")`` of a real 2-D float64 ``a`` (``nn.init.orthogonal_``'s):
    Householder's, the same on every machine (:mod:`~game.training.dispatch.fixedorder`)."""
    a = args[0]
    mode = args[1] if len(args) > 1 else kwargs.get("mode", "reduced")
    if mode != "reduced" or kwargs.keys() - {"mode"} or not isinstance(a, Tensor):
        return None
    if a.dtype != torch.float64 or a.dim() != 2 or a.is_meta:  # on "meta": no values to differ
        return None
    return fixedorder.qr(a)


def _real64(*xs: Any) -> bool:
    """Whether every one of ``xs`` is a real float64 tensor with values (not on "meta")."""
    return all(isinstance(x, Tensor) and x.dtype == torch.float64 and not x.is_meta for x in xs)


def _geqrf(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
    """``aten.geqrf`` of a real float64 matrix (or batch): ``nn.utils.parametrizations.orthogonal``
    makes its weight orthogonal with it, and with :func:`_householder_product`, as it is registered."""
    if kwargs or len(args) != 1 or not _real64(args[0]) or args[0].dim() < 2:
        return None
    return fixedorder.geqrf(args[0])


def _householder_product(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``aten.linalg_householder_product`` (and ``orgqr``) of real float64 reflections."""
    if kwargs or len(args) != 2 or not _real64(*args) or args[0].dim() < 2:
        return None
    if args[0].shape[-2] < args[0].shape[-1] or args[1].shape[-1] > args[0].shape[-1]:
        return None  # torch's own error
    return fixedorder.householder_product(args[0], args[1])


def _product(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``aten.mm``, ``mv``, ``dot`` and ``vdot`` of real float64 tensors: each value a sum in a fixed order
    (:func:`~game.training.dispatch.fixedorder.matmul`); a spectral norm's power iteration at
    construction runs on them."""
    if kwargs or len(args) != 2 or not all(isinstance(t, Tensor) for t in args):
        return None
    if any(t.dtype != torch.float64 or t.is_meta for t in args):
        return None
    return fixedorder.matmul(args[0], args[1])


def _scan(
    combine: Callable[[Tensor, Tensor], Tensor],
) -> Callable[[tuple[Any, ...], dict[str, Any]], Tensor | None]:
    """``aten.cumsum`` / ``aten.cumprod`` ``(x, dim, *, dtype=None)`` of a real float32 or float64
    ``x``: the running sum or product along ``dim`` taken one element after another in float64, each
    step one IEEE operation, and the result cast to the op's dtype. A diffusion model's noise
    schedule is one (``alphas_cumprod = torch.cumprod(1 - betas, 0)``, kept as a buffer); torch's
    kernels scan in an order of their own (a GPU's in parallel blocks). None for anything else
    (an integer scan, exact, never reaches here; half, complex), which runs as it is."""

    def rule(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
        x = args[0] if args else kwargs.get("self")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        dtype = kwargs.get("dtype") or (x.dtype if isinstance(x, Tensor) else None)
        if not isinstance(x, Tensor) or not isinstance(dim, int) or kwargs.keys() - {"self", "dim", "dtype"}:
            return None
        if (
            x.is_meta
            or x.dtype not in (torch.float32, torch.float64)
            or dtype not in (torch.float32, torch.float64)
        ):
            return None
        if x.dim() == 0 or x.numel() == 0:
            return x.detach().to(dtype, copy=True)
        lanes = x.detach().to(torch.float64).movedim(dim, -1)
        running = [lanes[..., 0].clone()]
        for i in range(1, lanes.shape[-1]):
            running.append(combine(running[-1], lanes[..., i]))
        return torch.stack(running, dim=-1).movedim(-1, dim).to(dtype).contiguous()

    return rule


#: Inexact ops served at construction by an exact rule of their own (ATen name -> the rule, which
#: returns None where it does not apply).
SERVED: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {
    "aten.linspace.default": _linspace,
    "aten.norm.ScalarOpt_dim": _norm,
    "aten.linalg_vector_norm.default": _vector_norm,
    "aten._weight_norm_interface.default": _weight_norm,
    "aten.linalg_qr.default": _qr,
    "aten.geqrf.default": _geqrf,
    "aten.linalg_householder_product.default": _householder_product,
    "aten.orgqr.default": _householder_product,
    "aten.mm.default": _product,
    "aten.mv.default": _product,
    "aten.dot.default": _product,
    "aten.vdot.default": _product,  # of real tensors, dot
    "aten.cumsum.default": _scan(torch.add),
    "aten.cumprod.default": _scan(torch.mul),
}


__all__ = ["COMPLEX_INIT_FIX", "INIT_FIX", "SERVED", "WHERE", "exact_float32", "norm2"]
