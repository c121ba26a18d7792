"""Eigenvectors' and singular vectors' signs, the same on every machine.

Why: an eigenvector, or a pair of singular vectors, is unique only up to its sign, and LAPACK's
builds (MKL's, OpenBLAS's) and cuSOLVER may return either. The rounding log corrects a value's
last bits, not its sign, so a model or a loss that takes ``torch.linalg.eigh`` or ``svd`` in a step
(whitening, a preconditioner, an orthogonality penalty) computed another step on another machine,
and the honest trainer failed its audit. Each vector is now turned so that its entry of largest
magnitude (the first such) is positive. The turn is taken on the results as rounded, which two
machines agree on up to each vector's sign (rounding works on magnitudes), and it is a negation,
exact, so every later op of the step, the backward's included, sees one sign. The ``noisy``
profile emulates another LAPACK by negating every other vector (dispatch/profiles.py).

Served: ``torch.linalg.eigh``, ``torch.linalg.svd``, ``torch.svd`` and ``Tensor.svd``; a
singular pair turns with its left vector. Left as the machine gives them: vectors of a repeated
eigenvalue or singular value (any rotation within their space is an answer, and machines differ
by more than a sign), ``U``'s columns past ``min(m, n)`` with ``full_matrices`` beyond their
sign, complex input (a phase, not a sign), and calls with ``out=``. Values only
(``eigvalsh``, ``svdvals``, ``pinv``, norms) need nothing: they do not depend on the signs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.training.dispatch.draws import Draws, serves


def negative(vectors: Tensor, dim: int) -> Tensor:
    """Which vectors (laid along ``dim``) have their first entry of largest magnitude negative: a
    bool tensor of size 1 along ``dim``."""
    lead = vectors.gather(dim, vectors.abs().argmax(dim=dim, keepdim=True))
    return lead < 0


def _turned(t: Tensor, flip: Tensor) -> Tensor:
    return torch.where(flip, -t, t)


def _plain(t: Tensor, kwargs: dict[str, Any]) -> bool:
    """Whether a call's vectors can be turned: real, not meta, no ``out=``."""
    return kwargs.get("out") is None and not (t.is_complex() or t.is_meta) and t.numel() > 0


@serves(torch.linalg.eigh)
def _eigh(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = func(*args, **kwargs)
    values, vectors = out
    if not _plain(vectors, kwargs):
        return out
    return type(out)((values, _turned(vectors, negative(vectors, -2))))


def _pairs(u: Tensor, v: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``u``'s and ``v``'s columns turned, the first ``k`` of ``v`` with ``u``'s (a singular pair),
    the rest each by its own lead."""
    fu, fv = negative(u, -2), negative(v, -2)
    fv = torch.cat([fu[..., :, :k], fv[..., :, k:]], dim=-1)
    return _turned(u, fu), _turned(v, fv)


@serves(torch.linalg.svd)
def _svd(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = func(*args, **kwargs)
    u, s, vh = out
    if not (_plain(u, kwargs) and vh.numel() > 0):
        return out
    u, v = _pairs(u, vh.mT, s.shape[-1])
    return type(out)((u, s, v.mT))


@serves(torch.svd, torch.Tensor.svd)
def _svd_old(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``torch.svd``: (U, S, V), V's columns the right vectors; zeros without ``compute_uv``."""
    out = func(*args, **kwargs)
    u, s, v = out
    computed = args[2] if len(args) > 2 else kwargs.get("compute_uv", True)  # (input, some, compute_uv)
    if not (computed and _plain(u, kwargs) and v.numel() > 0):
        return out
    u, v = _pairs(u, v, s.shape[-1])
    return type(out)((u, s, v))


__all__ = ["negative"]
