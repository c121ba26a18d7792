"""Poisson samples in a step: torch's CPU algorithms, written with ordinary ops.

Why: ``torch.poisson`` (and ``torch.distributions.Poisson(rate).sample()``, which calls it) draws
from torch's generator and takes logarithms in the machine's libm, so it was refused; counts are
drawn in steps that model them (shot noise on an image, a count decoder, spike trains). Here the
algorithms are those torch's CPU kernel and numpy use, their uniforms served (open uniforms on the
grid: :class:`~game.training.dispatch.draws.Draws`) and their ``exp``, ``log`` and ``lgamma``
ordinary ops, each rounded with the log in a step as any. Every comparison that decides a sample
is then between grid values the trainer logged and the auditor replays, so both take the same
count for every element in the same number of rounds.

    rate < 10: multiply uniforms until the product is at most exp(-rate); the count is the
        number of factors before that one (Knuth)
    rate >= 10: transformed rejection with squeeze (Hormann 1993, PTRS), per round
        u, v uniform; us = 0.5 - |u - 0.5|; k = floor((2a / us + b)(u - 0.5) + rate + 0.43)
        accept k where us >= 0.07 and v <= v_r, or where k >= 0 and not (us < 0.013 and v > us)
        and log(v) + log(1/alpha) - log(a / us**2 + b) <= -rate + k log(rate) - lgamma(k + 1)

``torch.binomial`` stays refused (:mod:`~game.training.dispatch.torchrandom`). A sample has no
gradient (torch's is zero). At a model's construction ``exp`` and the products are rounded to
nearest (:mod:`~game.training.dispatch.initmode`), so counts below rate 10 are drawn from the
seed; ``lgamma`` is inexact there, and a larger rate refused where its count reaches the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.training.dispatch.draws import Draws, name_of, serves

#: Rounds of either method before it gives up: the multiplication method takes one round more
#: than the count (P(count > 127 | rate < 10) < 1e-80); PTRS accepts at least 85% a round.
MAX_ROUNDS = 128

#: Where torch's kernel (and numpy) switch from multiplying uniforms to transformed rejection.
PTRS_FROM = 10.0


def _multiplied(d: Draws, name: str, rate: Tensor, todo: Tensor) -> Tensor:
    """Counts for the elements of ``todo`` (rate below :data:`PTRS_FROM`) by Knuth's method."""
    floor = torch.exp(-rate)
    product = torch.ones_like(rate)
    count = torch.zeros_like(rate)
    done = ~todo
    for _ in range(MAX_ROUNDS):
        product = product * d.open_uniform(name, rate.shape, rate.device, torch.float64)
        going = ~done & (product > floor)
        count = torch.where(going, count + 1.0, count)
        done = done | ~going
        if bool(done.all()):
            return count
    raise RuntimeError(f"the Poisson sampler did not stop in {MAX_ROUNDS} rounds")  # pragma: no cover


def _transformed_rejection(d: Draws, name: str, rate: Tensor, todo: Tensor) -> Tensor:
    """Counts for the elements of ``todo`` (rate at least :data:`PTRS_FROM`) by PTRS."""
    lam = torch.where(todo, rate, PTRS_FROM)  # the others' constants stay finite
    log_lam = torch.log(lam)
    b = torch.sqrt(lam) * 2.53 + 0.931
    a = b * 0.02483 - 0.059
    log_inv_alpha = torch.log(1.1328 / (b - 3.4) + 1.1239)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    out = torch.zeros_like(rate)
    done = ~todo
    for _ in range(MAX_ROUNDS):
        u = d.open_uniform(name, rate.shape, rate.device, torch.float64) - 0.5
        v = d.open_uniform(name, rate.shape, rate.device, torch.float64)
        us = 0.5 - u.abs()
        k = torch.floor((a * 2.0 / us + b) * u + lam + 0.43)
        squeezed = (us >= 0.07) & (v <= v_r)
        possible = (k >= 0.0) & ~((us < 0.013) & (v > us))
        safe_k = k.clamp(min=0.0)  # no lgamma of a negative count
        bound = safe_k * log_lam - lam - torch.lgamma(safe_k + 1.0)
        exact = torch.log(v) + log_inv_alpha - torch.log(a / (us * us) + b) <= bound
        accept = ~done & (squeezed | possible & exact)
        out = torch.where(accept, k, out)
        done = done | accept
        if bool(done.all()):
            return out
    raise RuntimeError(
        f"the Poisson sampler did not accept every element in {MAX_ROUNDS} rounds"
    )  # pragma: no cover


def poisson(d: Draws, name: str, rate: Tensor) -> Tensor:
    """Poisson(``rate``) counts of ``rate``'s shape (float64), from ``d``'s draws."""
    lam = rate.to(torch.float64)
    small = lam < PTRS_FROM
    out = torch.zeros_like(lam)
    if bool(small.any()):
        out = torch.where(small, _multiplied(d, name, torch.where(small, lam, 0.0), small), out)
    if not bool(small.all()):
        out = torch.where(small, out, _transformed_rejection(d, name, lam, ~small))
    return out


@serves(torch.poisson)
def _poisson(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = dict(zip(("self",), args, strict=False)) | kwargs
    rate = given.get("self", given.get("input"))
    if given.keys() - {"self", "input", "generator"} or not isinstance(rate, Tensor):
        return func(*args, **kwargs)
    if rate.is_meta or not rate.is_floating_point() or rate.numel() == 0:
        return func(*args, **kwargs)
    if bool((rate < 0).any()) or not bool(rate.isfinite().all()):  # torch's error, or refused
        return func(*args, **kwargs)
    return poisson(d, name_of(func), rate.detach()).to(rate.dtype)


__all__ = ["MAX_ROUNDS", "PTRS_FROM", "poisson"]
