"""A QR factorisation with the same bits on every machine, for ``nn.init.orthogonal_`` at construction.

torch's ``linalg.qr`` calls LAPACK, whose blocking and vector code differ by library, machine and
thread count, so the orthogonal matrix it gives differs in its last bits, and a model initialised
with ``orthogonal_`` (RWKV, recurrent and reinforcement-learning models) would start from another
state on another machine. Here the factorisation is Householder's, written with elementwise IEEE
operations only (each correctly rounded, the same in any vector code) and sums taken in a fixed
order by adding halves (:func:`tree_sum`): every value is the same everywhere. It costs some
``min(m, n)`` steps of elementwise work on the trailing matrix, seconds at a few hundred rows,
where LAPACK takes milliseconds; it runs once, while the model is built.

The factors are those of any Householder QR: ``R``'s diagonal may be negative, which
``orthogonal_`` corrects by multiplying ``Q``'s columns by its signs, so that ``Q`` is the unique
factor with a positive diagonal in ``R``, drawn from the Haar measure as torch's.
"""

from __future__ import annotations

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


__all__ = ["qr", "tree_sum"]
