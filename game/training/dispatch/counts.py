"""Poisson and binomial counts in a step: torch's CPU algorithms, written with ordinary ops.

Why: ``torch.poisson`` and ``torch.binomial`` (and ``torch.distributions``' ``Poisson`` and
``Binomial`` samples, which call them) draw from torch's generator and take logarithms in the
machine's libm, so they were refused; counts are drawn in steps that model them (shot noise on an
image, a count decoder, spike trains, a binomial mask or thinning). Here the algorithms are those
torch's CPU kernels use, their uniforms served (open uniforms on the grid:
:class:`~game.training.dispatch.draws.Draws`) and their ``exp``, ``log``, ``log1p`` and
``lgamma`` ordinary ops, each rounded with the log in a step as any. Every comparison that decides
a count is then between grid values the trainer logged and the auditor replays, so both take the
same count for every element in the same number of rounds.

Poisson(rate):

    rate < 10: multiply uniforms until the product is at most exp(-rate); the count is the
        number of factors before that one (Knuth)
    rate >= 10: transformed rejection with squeeze (Hormann 1993, PTRS), per round
        u, v uniform; us = 0.5 - |u - 0.5|; k = floor((2a / us + b)(u - 0.5) + rate + 0.43)
        accept k where us >= 0.07 and v <= v_r, or where k >= 0 and not (us < 0.013 and v > us)
        and log(v) + log(1/alpha) - log(a / us**2 + b) <= -rate + k log(rate) - lgamma(k + 1)

Binomial(n, p), with q = min(p, 1 - p) and the count taken from n where p > 1/2:

    n q < 10: add geometric waiting times ceil(log u / log1p(-q)) until they pass n; the count
        is how many did not (inversion)
    n q >= 10: transformed rejection (Hormann 1993, BTRS), its bound with Stirling's tails

A sample has no gradient (torch's is zero). At a model's construction ``exp``, ``log``,
``log1p``, ``sqrt`` and the products are rounded to nearest
(:mod:`~game.training.dispatch.initmode`), so binomial counts and Poisson counts below rate 10
are drawn from the seed; PTRS's ``lgamma`` is inexact there, and a larger rate refused where its
count decides the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch.draws import Draws, name_of, serves

#: Rounds of any method before it gives up: the direct methods take one round more than the count
#: (P(count > 127 | mean < 10) < 1e-80); the rejections accept at least 75% a round.
MAX_ROUNDS = 128

#: Where torch's kernels switch from a direct method to transformed rejection (the mean).
REJECTION_FROM = 10.0

#: Stirling's series tail ``lgamma(k + 1) - (k + 1/2) log(k + 1) + k + 1 - log(2 pi) / 2`` for
#: k = 0..9, BTRS's table (torch's and numpy's): constants, the same on every machine.
_STIRLING_TAIL = (
    0.08106146679532726, 0.04134069595540929, 0.02767792568499834, 0.02079067210376509,
    0.01664469118982119, 0.01387612882307075, 0.01189670994589177, 0.01041126526197209,
    0.009255462182712733, 0.008330563433362871,
)  # fmt: skip


def _unfinished(law: str) -> RuntimeError:  # pragma: no cover - far below 1e-15 a call
    return RuntimeError(f"the {law} sampler did not give every element a count in {MAX_ROUNDS} rounds")


def _rejection_draws(d: Draws, name: str, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A transformed rejection's round of draws, of ``like``'s shape: ``u`` uniform in
    (-1/2, 1/2), ``v`` uniform in (0, 1), and ``us = 1/2 - |u|`` (never 0: open uniforms)."""
    u = d.open_uniform(name, like.shape, like.device, torch.float64) - 0.5
    v = d.open_uniform(name, like.shape, like.device, torch.float64)
    return u, v, 0.5 - u.abs()


def _multiplied(d: Draws, name: str, rate: Tensor, todo: Tensor) -> Tensor:
    """Poisson counts for the elements of ``todo`` (rate below :data:`REJECTION_FROM`), Knuth's."""
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
    raise _unfinished("Poisson")  # pragma: no cover


def _transformed_rejection(d: Draws, name: str, rate: Tensor, todo: Tensor) -> Tensor:
    """Poisson counts for the elements of ``todo`` (rate at least :data:`REJECTION_FROM`), PTRS."""
    lam = torch.where(todo, rate, REJECTION_FROM)  # the others' constants stay finite
    log_lam = torch.log(lam)
    b = torch.sqrt(lam) * 2.53 + 0.931
    a = b * 0.02483 - 0.059
    log_inv_alpha = torch.log(1.1328 / (b - 3.4) + 1.1239)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    out = torch.zeros_like(rate)
    done = ~todo
    for _ in range(MAX_ROUNDS):
        u, v, us = _rejection_draws(d, name, rate)
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
    small = lam < REJECTION_FROM
    out = torch.zeros_like(lam)
    if bool(small.any()):
        out = torch.where(small, _multiplied(d, name, torch.where(small, lam, 0.0), small), out)
    if not bool(small.all()):
        out = torch.where(small, out, _transformed_rejection(d, name, lam, ~small))
    return out


def _inverted(d: Draws, name: str, n: Tensor, q: Tensor, todo: Tensor) -> Tensor:
    """Binomial counts for the elements of ``todo`` (``n q`` below :data:`REJECTION_FROM`, ``q`` in
    (0, 1/2]) by inversion: geometric waiting times added until they pass ``n``."""
    log_q = torch.log1p(-torch.where(todo, q, 0.5))
    waited = torch.zeros_like(n)
    count = torch.zeros_like(n)
    done = ~todo
    for _ in range(MAX_ROUNDS):
        u = d.open_uniform(name, n.shape, n.device, torch.float64)
        waited = waited + torch.ceil(torch.log(u) / log_q)
        going = ~done & (waited <= n)
        count = torch.where(going, count + 1.0, count)
        done = done | ~going
        if bool(done.all()):
            return count
    raise _unfinished("binomial")  # pragma: no cover


def _stirling_tail(k: Tensor) -> Tensor:
    """Stirling's series tail at ``k`` (whole numbers >= 0): the table below 10, its series above."""
    table = torch.tensor(_STIRLING_TAIL, dtype=torch.float64, device=k.device)
    listed = table[k.clamp(max=9.0).long()]
    sq = (k + 1.0) * (k + 1.0)
    series = (1.0 / 12.0 - (1.0 / 360.0 - 1.0 / 1260.0 / sq) / sq) / (k + 1.0)
    return torch.where(k <= 9.0, listed, series)


def _btrs(d: Draws, name: str, n: Tensor, q: Tensor, todo: Tensor) -> Tensor:
    """Binomial counts for the elements of ``todo`` (``n q`` at least :data:`REJECTION_FROM`)."""
    n = torch.where(todo, n, 40.0)  # the others' constants stay finite
    q = torch.where(todo, q, 0.5)
    spread = torch.sqrt(n * q * (1.0 - q))
    b = spread * 2.53 + 1.15
    a = b * 0.0248 + q * 0.01 - 0.0873
    c = n * q + 0.5
    v_r = 0.92 - 4.2 / b
    r = q / (1.0 - q)
    alpha = (5.1 / b + 2.83) * spread
    m = torch.floor((n + 1.0) * q)
    at_mode = (
        (m + 0.5) * torch.log((m + 1.0) / (r * (n - m + 1.0))) + _stirling_tail(m) + _stirling_tail(n - m)
    )
    out = torch.zeros_like(n)
    done = ~todo
    for _ in range(MAX_ROUNDS):
        u, v, us = _rejection_draws(d, name, n)
        k = torch.floor((a * 2.0 / us + b) * u + c)
        inside = (k >= 0.0) & (k <= n)
        squeezed = inside & (us >= 0.07) & (v <= v_r)
        kk = torch.where(inside, k, m)  # no log of a count outside 0..n
        bound = (
            at_mode
            + (n + 1.0) * torch.log((n - m + 1.0) / (n - kk + 1.0))
            + (kk + 0.5) * torch.log(r * (n - kk + 1.0) / (kk + 1.0))
            - _stirling_tail(kk)
            - _stirling_tail(n - kk)
        )
        exact = inside & (torch.log(v * alpha / (a / (us * us) + b)) <= bound)
        accept = ~done & (squeezed | exact)
        out = torch.where(accept, k, out)
        done = done | accept
        if bool(done.all()):
            return out
    raise _unfinished("binomial")  # pragma: no cover


def binomial(d: Draws, name: str, count: Tensor, prob: Tensor) -> Tensor:
    """Binomial(``count``, ``prob``) counts of their broadcast shape (float64), from ``d``'s draws;
    ``count`` whole numbers >= 0, ``prob`` in [0, 1]."""
    n, p = (t.to(torch.float64) for t in torch.broadcast_tensors(count, prob))
    flipped = p > 0.5
    q = torch.where(flipped, 1.0 - p, p)  # exact (Sterbenz) on the upper half
    some = (n > 0.0) & (q > 0.0)
    mean = n * q
    direct = some & (mean < REJECTION_FROM)
    k = torch.zeros_like(n)
    if bool(direct.any()):
        k = torch.where(direct, _inverted(d, name, n, q, direct), k)
    rejected = some & ~direct
    if bool(rejected.any()):
        k = torch.where(rejected, _btrs(d, name, n, q, rejected), k)
    return torch.where(flipped, n - k, k)


def _tensor_args(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]
) -> list[Tensor] | None:
    """A draw's tensor arguments by ``names``, or None where it is not served (an unknown keyword,
    a meta, empty or non-float tensor, a non-finite value: torch's own call, which refuses it)."""
    given = dict(zip(names, args, strict=False)) | kwargs
    if "input" in given:
        given["self"] = given.pop("input")
    if given.keys() - {*names, "generator"}:
        return None
    tensors = [given.get(name) for name in names]
    for t in tensors:
        if not isinstance(t, Tensor) or t.is_meta or not t.is_floating_point() or t.numel() == 0:
            return None
        if not bool(t.isfinite().all()):
            return None
    return [t.detach() for t in tensors]  # type: ignore[union-attr]


@serves(torch.poisson)
def _poisson(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = _tensor_args(args, kwargs, ("self",))
    if given is None or bool((given[0] < 0).any()):  # torch's own error for a negative rate
        return func(*args, **kwargs)
    return poisson(d, name_of(func), given[0]).to(given[0].dtype)


@serves(torch.binomial)
def _binomial(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = _tensor_args(args, kwargs, ("count", "prob"))
    if given is None:
        return func(*args, **kwargs)
    count, prob = given
    bad = (count < 0) | (count != count.floor())
    if bool(bad.any()) or bool(((prob < 0) | (prob > 1)).any()):
        what = f"a count of {float(count[bad][0])}" if bool(bad.any()) else "a probability outside [0, 1]"
        fix = "give whole counts >= 0 and probabilities in [0, 1]"
        raise UnsupportedOpError(f"torch.binomial: {what} has no binomial law: {fix}", op="binomial", fix=fix)
    return binomial(d, name_of(func), count, prob).to(count.dtype)


__all__ = ["MAX_ROUNDS", "REJECTION_FROM", "binomial", "poisson"]
