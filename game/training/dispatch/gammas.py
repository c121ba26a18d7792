"""Gamma, Beta and Dirichlet samples in a step: a rejection sampler written with ordinary ops.

Why: mixup draws its mixing weight from ``torch.distributions.Beta(a, a).sample()``, and a Beta
sample is a Dirichlet's, which is gammas normalised (``torch._sample_dirichlet``,
``torch._standard_gamma``). Torch's kernels draw from its generator and take logarithms in the
machine's libm, so they were refused. Here the sampler is Marsaglia and Tsang's (2000), its draws
served (Irwin-Hall normals, open uniforms: :class:`~game.training.dispatch.draws.Draws`) and its
``sqrt``, ``log`` and ``pow`` ordinary ops, each rounded with the log in a step as any. The accept
test then compares values on the grid that the trainer logged and the auditor replays, so both take
the same candidate for every element, and the number of rounds is the same on both.

    for concentration a < 1 the sample is G(a + 1) * u ** (1 / a)       (the usual boost)
    d = a - 1/3, c = 1 / sqrt(9 d); repeat, each element until it is accepted:
        x normal, u open uniform, v = (1 + c x) ** 3
        accept d v where v > 0 and (u < 1 - 0.0331 x**4 or log u < x**2 / 2 + d (1 - v + log v))

A Dirichlet sample is its gammas over their sum (each at least the float32 ``tiny``, as torch
keeps them). The reparameterised gradients (``rsample`` of a concentration that is learned) are
torch's own formulas of the concentration and the sample (``_standard_gamma_grad``,
``_dirichlet_grad``), ops of the step as any. At a model's construction these ops are inexact, and refused as any.
The normals are Irwin-Hall's, whose tails stop at 6 standard deviations: the samples' own tails are
cut where such a normal's are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.training.dispatch.draws import Draws, name_of, serves

#: Rounds of the sampler before it gives up (each accepts at least 95% of the elements left).
MAX_ROUNDS = 64


def standard_gamma(d: Draws, name: str, alpha: Tensor) -> Tensor:
    """Gamma(``alpha``, 1) samples of ``alpha``'s shape (float64), from ``d``'s draws."""
    a = alpha.to(torch.float64)
    boost = a < 1.0
    a1 = torch.where(boost, a + 1.0, a)
    dd = a1 - 1.0 / 3.0
    c = torch.rsqrt(dd * 9.0)
    out = torch.zeros_like(a1)
    done = torch.zeros_like(a1, dtype=torch.bool)
    for _ in range(MAX_ROUNDS):
        x = d.normal(name, a.shape, a.device, torch.float64)
        u = d.open_uniform(name, a.shape, a.device, torch.float64)
        v = (c * x + 1.0) ** 3
        positive = v > 0.0
        safe = torch.where(positive, v, torch.ones_like(v))  # no log of a non-positive value
        squeeze = u < 1.0 - 0.0331 * x**4
        exact = torch.log(u) < 0.5 * x * x + dd * (1.0 - safe + torch.log(safe))
        accept = positive & (squeeze | exact) & ~done
        out = torch.where(accept, dd * safe, out)
        done = done | accept
        if bool(done.all()):
            break
    else:  # pragma: no cover - P(an element unaccepted) < 0.05 ** 64
        raise RuntimeError("the gamma sampler did not accept every element in 64 rounds")
    if bool(boost.any()):
        u = d.open_uniform(name, a.shape, a.device, torch.float64)
        out = torch.where(boost, out * u ** (1.0 / torch.where(boost, a, torch.ones_like(a))), out)
    return out


def _concentration(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The concentration of a ``_standard_gamma`` or ``_sample_dirichlet`` call, or None where it
    is not served (an unknown keyword, a meta or non-float tensor: torch's own call)."""
    given = dict(zip(("self",), args, strict=False)) | kwargs
    alpha = given["self"]
    if given.keys() - {"self", "generator"} or alpha.is_meta or not alpha.is_floating_point():
        return None
    return alpha


class _Reparameterised(torch.autograd.Function):
    """A gamma sample whose gradient to its concentration is torch's (``_standard_gamma``'s own
    derivative: ``_standard_gamma_grad`` of the concentration and the sample)."""

    @staticmethod
    def forward(ctx: Any, alpha: Tensor, sample: Tensor) -> Tensor:
        ctx.save_for_backward(alpha, sample)
        return sample.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        alpha, sample = ctx.saved_tensors
        return grad * torch._standard_gamma_grad(alpha, sample), None


@serves(torch._standard_gamma)
def _gamma(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    alpha = _concentration(args, kwargs)
    if alpha is None:
        return func(*args, **kwargs)
    sample = standard_gamma(d, name_of(func), alpha.detach()).to(alpha.dtype)
    if torch.is_grad_enabled() and alpha.requires_grad:  # Gamma.rsample of a learned concentration
        return _Reparameterised.apply(alpha, sample)
    return sample


@serves(torch._sample_dirichlet)
def _dirichlet(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    alpha = _concentration(args, kwargs)
    if alpha is None:
        return func(*args, **kwargs)
    g = standard_gamma(d, name_of(func), alpha.detach()).clamp(min=torch.finfo(torch.float32).tiny)
    return (g / g.sum(-1, keepdim=True)).to(alpha.dtype)


__all__ = ["MAX_ROUNDS", "standard_gamma"]
