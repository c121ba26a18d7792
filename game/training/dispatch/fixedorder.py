"""Linear algebra with the same bits on every machine, for a model's construction: sums, products
and a QR factorisation (``nn.init.orthogonal_``'s), also in LAPACK's compact form with its
product (``nn.utils.parametrizations.orthogonal``'s ``geqrf`` and ``householder_product``).

A sum's order is the machine's: torch's reductions and BLAS and LAPACK kernels split and vectorise
by library, machine and thread count, so a matrix product, a power iteration
(``nn.utils.parametrizations.spectral_norm`` runs fifteen at construction) or LAPACK's QR differ
in their last bits, and so would a model's initial state. Here every value comes from elementwise
IEEE operations (each correctly rounded, the same in any vector code; a multiply and an add apart,
never fused) and sums taken in a fixed order, by adding halves (:func:`tree_sum`). Products cost a
few times torch's (:func:`matmul` works in blocks of rows), and the QR ``min(m, n)`` steps of
elementwise work on the trailing matrix, seconds at a few hundred rows where LAPACK takes
milliseconds; they run once, while the model is built.

The QR factors are those of any Householder QR: ``R``'s diagonal may be negative, which
``orthogonal_`` corrects by multiplying ``Q``'s columns by its signs, so that ``Q`` is the unique
factor with a positive diagonal in ``R``, drawn from the Haar measure as torch's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def tree_sum(x: Tensor, dim: int) -> Tensor:
    """The sum of ``x`` along ``dim``, by adding its first and second halves until one slice is
    left (an odd slice carried over): an order of its own, where torch's ``sum`` takes the order its
    vector code and thread count choose."""
    x = x.movedim(dim, 0)
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1:], dtype=x.dtype, device=x.device)
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        added = x[:half] + x[half : 2 * half]
        x = torch.cat((added, x[2 * half :])) if x.shape[0] % 2 else added
    return x[0]


#: Elements of a block of products :func:`matmul` forms at once (32 MB of float64).
_BLOCK = 1 << 22


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for a 1-D or 2-D ``a`` and ``b``: each value the sum, by :func:`tree_sum`, of the
    products of a row and a column."""
    if a.dim() == 1 and b.dim() == 1:
        return tree_sum(a * b, 0)
    if b.dim() == 1:
        return tree_sum(a * b, a.dim() - 1)
    if a.dim() == 1:
        return tree_sum(a[:, None] * b, 0)
    k, n = b.shape
    rows = max(1, _BLOCK // max(1, k * n))
    blocks = [tree_sum(a[i : i + rows, :, None] * b[None, :, :], 1) for i in range(0, a.shape[0], rows)]
    return torch.cat(blocks) if blocks else a.new_zeros(0, n)


def _reflect(block: Tensor, v: Tensor, scale: Tensor) -> Tensor:
    """``block - v (scale v^T block)``: the reflection ``I - scale v v^T`` applied to ``block``, with
    a multiply and a subtract apart (no fused multiply-add, which some machines' code would use)."""
    w = tree_sum(v[:, None] * block, 0)
    return block - (v * scale)[:, None] * w[None, :]


def qr(a: Tensor) -> tuple[Tensor, Tensor]:
    """The reduced QR factorisation of a real 2-D float64 ``a`` (``m x n``, ``k = min(m, n)``):
    ``Q`` (``m x k``, orthonormal columns) and ``R`` (``k x n``, upper triangular), as
    ``torch.linalg.qr(a)`` gives them, each bit the same on every machine."""
    m, n = a.shape
    k = min(m, n)
    r = a.clone()
    reflectors: list[tuple[Tensor, Tensor] | None] = []
    for j in range(k):
        x = r[j:, j]
        norm = torch.sqrt(tree_sum(x * x, 0))
        alpha = torch.where(x[0] < 0, norm, -norm)  # the sign that cancels nothing
        v = x.clone()
        v[0] = x[0] - alpha
        vv = tree_sum(v * v, 0)
        if bool(vv == 0):  # the column is 0 below the diagonal already
            reflectors.append(None)
            continue
        scale = 2.0 / vv
        r[j:, j:] = _reflect(r[j:, j:], v, scale)
        r[j, j] = alpha
        r[j + 1 :, j] = 0.0
        reflectors.append((v, scale))
    q = torch.eye(m, k, dtype=a.dtype, device=a.device)
    for j in reversed(range(k)):
        step = reflectors[j]
        if step is not None:
            q[j:, :] = _reflect(q[j:, :], *step)
    return q, r[:k, :]


def _batched(f: Callable[..., tuple[Tensor, ...]], *xs: Tensor, cores: tuple[int, ...]) -> tuple[Tensor, ...]:
    """``f`` on each matrix of a batch: ``xs`` share leading dims, ``cores`` gives each one's own
    trailing dims (2 for a matrix, 1 for a vector); its results stacked back into the batch's shape."""
    lead = xs[0].shape[: xs[0].dim() - cores[0]]
    own = [x.reshape(-1, *x.shape[x.dim() - c :]) for x, c in zip(xs, cores, strict=True)]
    outs = [f(*parts) for parts in zip(*own, strict=True)]
    if not outs:  # an empty batch: the shapes of f's results on zero matrices
        probe = f(*(x.new_zeros(x.shape[x.dim() - c :]) for x, c in zip(xs, cores, strict=True)))
        return tuple(t.new_zeros(*lead, *t.shape) for t in probe)
    return tuple(torch.stack(parts).reshape(*lead, *parts[0].shape) for parts in zip(*outs, strict=True))


def _geqrf(a: Tensor) -> tuple[Tensor, Tensor]:
    m, n = a.shape
    r, taus = a.clone(), a.new_zeros(min(m, n))
    for j in range(min(m, n)):
        alpha, below = r[j, j], r[j + 1 :, j]
        below_sq = tree_sum(below * below, 0)
        if bool(below_sq == 0):  # LAPACK leaves such a column as it is: H = I, tau = 0
            continue
        norm = torch.sqrt(alpha * alpha + below_sq)
        beta = torch.where(alpha >= 0, -norm, norm)  # LAPACK's dlarfg: -sign(alpha) * norm
        v = torch.cat((alpha.new_ones(1), below / (alpha - beta)))
        tau = (beta - alpha) / beta
        r[j:, j + 1 :] = _reflect(r[j:, j + 1 :], v, tau)
        r[j, j], taus[j] = beta, tau
        r[j + 1 :, j] = v[1:]
    return r, taus


def geqrf(a: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.geqrf(a)`` of a real float64 ``a`` (``... x m x n``), in LAPACK's format: ``R`` on and
    above the diagonal, the Householder vectors below it (their first entry, 1, left out) and
    their scales ``tau``, each bit the same on every machine. Reflections as LAPACK's ``dlarfg``
    makes them (``R``'s diagonal of the sign opposite to the column's first entry; a column
    already 0 below the diagonal left with ``tau`` 0, which ``orthogonal``'s parametrization reads)."""
    compact, tau = _batched(_geqrf, a, cores=(2,))
    return compact, tau


def _householder_product(a: Tensor, tau: Tensor) -> tuple[Tensor]:
    m, n = a.shape
    q = torch.eye(m, n, dtype=a.dtype, device=a.device)
    for j in reversed(range(tau.shape[0])):
        v = torch.cat((a.new_ones(1), a[j + 1 :, j]))
        q[j:, :] = _reflect(q[j:, :], v, tau[j])
    return (q,)


def householder_product(a: Tensor, tau: Tensor) -> Tensor:
    """``torch.linalg.householder_product(a, tau)``: the first ``n`` columns of the product of the
    reflections :func:`geqrf` leaves in ``a`` (``... x m x n``) and ``tau``, in a fixed order."""
    return _batched(_householder_product, a, tau, cores=(2, 1))[0]


__all__ = ["geqrf", "householder_product", "matmul", "qr", "tree_sum"]
