"""Torch's random functions, served from the counter RNG (keying and values: :mod:`~game.training.dispatch.draws`).

Served: ``torch.rand``, ``randn``, ``randint``, ``randperm``, ``rand_like``, ``randn_like`` (real
or complex),
``randint_like``, ``bernoulli``, ``normal``, ``multinomial``; ``Tensor.bernoulli(_)``,
``uniform_``, ``normal_``, ``random_`` (a range below ``2**31``), ``multinomial``; and the
``nn.init`` functions that hide their draw inside a torch function (``uniform_``, ``normal_``,
``kaiming_uniform_``: the function mode sees the outer call only, so it serves it whole). Normal
draws are Irwin-Hall: exact integer arithmetic on every device, no transcendental function (their
tails stop at 6 standard deviations). ``multinomial`` inverts the cumulative weights with ordinary
ops (``cumsum`` is rounded with the log in a step, and refused at a construction like any inexact op).

``Tensor.exponential_`` and ``F.gumbel_softmax`` (mixture-of-experts routers draw Gumbel noise
with them) are served too: an exponential is ``-log(v) / lambd``, ``v`` uniform in ``(0, 1)``
(:meth:`~game.training.dispatch.draws.Draws.open_uniform`), its logarithm an ordinary op, rounded
with the log in a step (and to nearest at construction) as any, so the machine's libm does not
decide it.

``Tensor.log_normal_`` (``exp`` of a served normal), ``cauchy_`` (``tan`` of a served uniform) and
``geometric_`` (``ceil`` of a ratio of logarithms) are written out the same way, their
transcendental function an ordinary op.

Gamma, Beta and Dirichlet samples are served by a rejection sampler written out so
(:mod:`~game.training.dispatch.gammas`), Poisson and binomial counts by torch's own methods
written out so (:mod:`~game.training.dispatch.counts`).

Anything a handler does not recognise (an unusual keyword, a meta tensor, an integer dtype where a
float is drawn) goes to torch as called: if it draws, the interceptor refuses it at the ATen level.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.errors import UnsupportedOpError
from game.training.dispatch.draws import Draws, name_of, serves, suspended

#: Keywords a served factory understands (others: torch's own call, refused below if it draws).
_FACTORY_KEYS = frozenset(
    {"size", "generator", "out", "dtype", "layout", "device", "pin_memory", "requires_grad"}
)
_LIKE_KEYS = frozenset(
    {"generator", "dtype", "layout", "device", "requires_grad", "memory_format", "pin_memory"}
)


def _size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    """A factory's size: ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])``, ``f(size=...)``."""
    if "size" in kwargs:
        return tuple(int(s) for s in kwargs["size"])
    if len(args) == 1 and isinstance(args[0], tuple | list | torch.Size):
        return tuple(int(s) for s in args[0])
    return tuple(int(s) for s in args)


def _plain(kwargs: dict[str, Any], known: frozenset[str]) -> bool:
    """Whether the call has only keywords a handler serves, a strided layout and no meta device."""
    if any(k not in known for k in kwargs):
        return False
    layout = kwargs.get("layout")
    device = kwargs.get("device")
    return (layout is None or layout == torch.strided) and not (
        device is not None and torch.device(device).type == "meta"
    )


def _made(t: Tensor, kwargs: dict[str, Any]) -> Tensor:
    """A factory's result: into ``out`` when given; ``requires_grad`` as asked."""
    out = kwargs.get("out")
    if out is not None:
        with torch.no_grad():
            out.resize_(t.shape).copy_(t)
        t = out
    if kwargs.get("requires_grad"):
        t.requires_grad_(True)
    return t


def _target(kwargs: dict[str, Any], dtype: torch.dtype | None) -> tuple[torch.device, torch.dtype]:
    out = kwargs.get("out")
    if out is not None:
        return out.device, out.dtype
    device = kwargs.get("device")
    return (
        torch.device(device) if device is not None else torch.get_default_device(),
        kwargs.get("dtype") or dtype or torch.get_default_dtype(),
    )


# --------------------------------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------------------------------


#: A complex dtype's parts' dtype.
_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _drawn(
    d: Draws, name: str, normal: bool, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> Tensor | None:
    """A uniform (or normal) draw of ``shape``, or None where ``dtype`` is neither real floating nor
    complex. A complex one draws its (real, imaginary) parts as one real draw of ``(*shape, 2)``, as
    torch defines them: each part uniform in [0, 1); for a normal, each part normal with variance
    1/2, so that the complex value's is 1 (FNO's spectral weights are ``torch.rand(..., dtype=cfloat)``)."""
    draw = d.normal if normal else d.uniform
    if dtype.is_floating_point:
        return draw(name, shape, device, dtype)
    part = _PARTS.get(dtype)
    if part is None:
        return None
    parts = draw(name, (*shape, 2), device, part)
    if normal:
        parts = parts * math.sqrt(0.5)  # one IEEE product by a correctly rounded constant
    return torch.view_as_complex(parts)


@serves(torch.rand, torch.randn)
def _rand(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    device, dtype = _target(kwargs, None)
    drawn = None
    if _plain(kwargs, _FACTORY_KEYS):
        drawn = _drawn(d, name_of(func), func is torch.randn, _size(args, kwargs), device, dtype)
    return func(*args, **kwargs) if drawn is None else _made(drawn, kwargs)


@serves(torch.rand_like, torch.randn_like)
def _rand_like(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0] if args else kwargs["input"]
    kw = {k: v for k, v in kwargs.items() if k != "input"}
    dtype = kw.get("dtype") or x.dtype
    device = torch.device(kw["device"]) if kw.get("device") is not None else x.device
    drawn = None
    if _plain(kw, _LIKE_KEYS) and device.type != "meta":
        drawn = _drawn(d, name_of(func), func is torch.randn_like, tuple(x.shape), device, dtype)
    return func(*args, **kwargs) if drawn is None else _made(drawn, kw)


def _bounds(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    """(low, high) of ``randint(high, ...)`` / ``randint(low, high, ...)`` after the leading args."""
    if "high" in kwargs:
        return int(kwargs.get("low", args[0] if args else 0)), int(kwargs["high"])
    if len(args) >= 2:
        return int(args[0]), int(args[1])
    return 0, int(args[0])


@serves(torch.randint)
def _randint(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    device, dtype = _target(kwargs, torch.int64)
    kw = {k: v for k, v in kwargs.items() if k not in ("low", "high")}
    if not _plain(kw, _FACTORY_KEYS):
        return func(*args, **kwargs)
    if "size" in kwargs:
        bounds, size = args, tuple(kwargs["size"])
    else:
        bounds, size = args[:-1], tuple(args[-1])
    low, high = _bounds(tuple(bounds), kwargs)
    drawn = d.below(name_of(func), size, high - low, device).add_(low)
    return _made(drawn.to(dtype), kw)


@serves(torch.randint_like)
def _randint_like(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, rest = args[0], args[1:]
    kw = {k: v for k, v in kwargs.items() if k not in ("low", "high")}
    if not (_plain(kw, _LIKE_KEYS) and all(isinstance(a, int) for a in rest) and x.device.type != "meta"):
        return func(*args, **kwargs)
    low, high = _bounds(tuple(rest), kwargs)
    device = torch.device(kw["device"]) if kw.get("device") is not None else x.device
    drawn = d.below(name_of(func), x.shape, high - low, device).add_(low)
    return _made(drawn.to(kw.get("dtype") or x.dtype), kw)


@serves(torch.randperm)
def _randperm(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    device, dtype = _target(kwargs, torch.int64)
    if not _plain({k: v for k, v in kwargs.items() if k != "n"}, _FACTORY_KEYS):
        return func(*args, **kwargs)
    n = int(args[0] if args else kwargs["n"])
    return _made(d.permutation(name_of(func), n, device).to(dtype), kwargs)


# --------------------------------------------------------------------------------------------------
# Bernoulli and normal draws shaped by tensors
# --------------------------------------------------------------------------------------------------


def _bernoulli(
    d: Draws, name: str, shape: torch.Size, p: Any, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """0/1 of ``dtype``: one word per element, kept when ``word < p * 2**32`` (exact: the word scaled
    by a power of two is exact in float64), with ``p`` a number or a tensor broadcast to ``shape``."""
    if not isinstance(p, Tensor):
        return d.mask(name, shape, float(p), device).to(dtype)
    words = d.words(name, shape, device)
    with suspended():
        keep = words.to(torch.float64) * 2.0**-32 < p.detach().to(device=device, dtype=torch.float64)
    return keep.to(dtype)


@serves(torch.bernoulli, torch.Tensor.bernoulli)
def _bernoulli_fn(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0] if args else kwargs["input"]
    p = args[1] if len(args) > 1 else kwargs.get("p", x)
    kw = {k: v for k, v in kwargs.items() if k not in ("input", "p")}
    if not _plain(kw, frozenset({"generator", "out"})) or x.device.type == "meta":
        return func(*args, **kwargs)
    return _made(_bernoulli(d, name_of(func), x.shape, p, x.device, x.dtype), kw)


@serves(torch.Tensor.bernoulli_)
def _bernoulli_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    if x.is_meta:
        return x
    return x.copy_(_bernoulli(d, name_of(func), x.shape, p, x.device, x.dtype))


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape) if isinstance(v, Tensor) else ()


@serves(torch.normal)
def _normal(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    names = ("mean", "std", "size")
    given = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    kw = {k: v for k, v in kwargs.items() if k not in names}
    mean, std = given.get("mean", 0.0), given.get("std", 1.0)
    tensors = [v for v in (mean, std) if isinstance(v, Tensor)]
    if tensors:
        shape = torch.broadcast_shapes(_shape(mean), _shape(std))
        device, dtype = tensors[0].device, torch.result_type(mean, std)
    elif "size" in given:
        shape = torch.Size(int(s) for s in given["size"])
        device, dtype = _target(kw, None)
    else:  # torch's own error
        return func(*args, **kwargs)
    if not (_plain(kw, _FACTORY_KEYS) and dtype.is_floating_point and device.type != "meta"):
        return func(*args, **kwargs)
    z = d.normal(name_of(func), shape, device, dtype)
    return _made(z * std + mean, kw)


@serves(torch.Tensor.normal_)
def _normal_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    mean = args[1] if len(args) > 1 else kwargs.get("mean", 0.0)
    std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
    return fill_normal(d, name_of(func), x, float(mean), float(std))


@serves(torch.Tensor.uniform_)
def _uniform_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
    high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
    return fill_uniform(d, name_of(func), x, float(low), float(high))


def fill_uniform(d: Draws, name: str, x: Tensor, low: float, high: float) -> Tensor:
    """``x`` in place: ``u * (high - low) + low`` (two IEEE operations, the same everywhere)."""
    if x.is_meta:
        return x
    u = d.uniform(name, x.shape, x.device, x.dtype)
    return x.copy_(u.mul_(high - low).add_(low))


def fill_normal(d: Draws, name: str, x: Tensor, mean: float, std: float) -> Tensor:
    """``x`` in place: ``z * std + mean``, ``z`` Irwin-Hall."""
    if x.is_meta:
        return x
    z = d.normal(name, x.shape, x.device, x.dtype)
    return x.copy_(z.mul_(std).add_(mean))


@serves(torch.Tensor.random_)
def _random_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, rest = args[0], args[1:]
    bounds = [*rest, *(kwargs[k] for k in ("from", "to") if k in kwargs)]
    if x.is_meta:
        return x
    if not bounds or bounds[-1] is None:
        raise UnsupportedOpError(
            "Tensor.random_ without an upper bound draws from torch's generator over the whole dtype: "
            "give random_(low, high) with high - low below 2**31, which vgame serves",
            op="Tensor.random_",
            fix="random_(low, high)",
        )
    low, high = (0, int(bounds[0])) if len(bounds) == 1 else (int(bounds[0]), int(bounds[1]))
    drawn = d.below(name_of(func), x.shape, high - low, x.device).add_(low)
    return x.copy_(drawn)


@serves(torch.multinomial, torch.Tensor.multinomial)
def _multinomial(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    names = ("input", "num_samples", "replacement")
    given = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    kw = {k: v for k, v in kwargs.items() if k not in names}
    probs, k, replace = given["input"], int(given["num_samples"]), bool(given.get("replacement", False))
    if not _plain(kw, frozenset({"generator", "out"})) or probs.is_meta or probs.dim() not in (1, 2):
        return func(*args, **kwargs)
    w = probs.detach().to(torch.float64)
    w = w.unsqueeze(0) if probs.dim() == 1 else w
    n = w.shape[-1]
    with suspended():  # torch's own checks, on the host
        if not bool((w >= 0).all()) or not bool((w.sum(-1) > 0).all()):
            raise RuntimeError(
                "multinomial: invalid distribution (negative weights, or a row that sums to 0)"
            )
        if not replace and int((w > 0).sum(-1).min()) < k:
            raise RuntimeError(
                "multinomial: fewer categories with a positive weight than samples without replacement"
            )
    shape = (w.shape[0], k) if probs.dim() == 2 else (k,)
    u = d.uniform(name_of(func), shape, w.device, torch.float64).reshape(w.shape[0], k)
    picks = []
    for j in range(1 if replace else k):  # without replacement: one column at a time, picks zeroed
        cdf = w.cumsum(-1)  # an inexact op: rounded with the log in a step
        cut = u if replace else u[:, j : j + 1]
        idx = torch.searchsorted(cdf, cut * cdf[:, -1:], right=True).clamp_(max=n - 1)
        picks.append(idx)
        if not replace:
            w = w.scatter(-1, idx, 0.0)
    out = torch.cat(picks, -1).reshape(shape)
    return _made(out, kw)


# --------------------------------------------------------------------------------------------------
# nn.init functions that draw inside a torch function (their inner Tensor.uniform_ is not seen)
# --------------------------------------------------------------------------------------------------


def _init_args(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], defaults: tuple[Any, ...]
) -> list[Any]:
    given = dict(zip(("tensor", *names), args, strict=False)) | kwargs
    return [given["tensor"], *(given.get(n, v) for n, v in zip(names, defaults, strict=True))]


@serves(nn.init.uniform_)
def _init_uniform(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    t, a, b = _init_args(args, kwargs, ("a", "b"), (0.0, 1.0))
    with torch.no_grad():
        return fill_uniform(d, name_of(func), t, float(a), float(b))


@serves(nn.init.normal_)
def _init_normal(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    t, mean, std = _init_args(args, kwargs, ("mean", "std"), (0.0, 1.0))
    with torch.no_grad():
        return fill_normal(d, name_of(func), t, float(mean), float(std))


@serves(nn.init.kaiming_uniform_)
def _init_kaiming_uniform(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's bound, in Python floats: ``sqrt(3) * gain / sqrt(fan)``."""
    t, a, mode, nonlinearity = _init_args(
        args, kwargs, ("a", "mode", "nonlinearity"), (0, "fan_in", "leaky_relu")
    )
    if 0 in t.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=4)
        return t
    fan = nn.init._calculate_correct_fan(t, mode)
    bound = math.sqrt(3.0) * (nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan))
    with torch.no_grad():
        return fill_uniform(d, name_of(func), t, -bound, bound)


# --------------------------------------------------------------------------------------------------
# Exponential and Gumbel draws: a served uniform, and a logarithm rounded as any op
# --------------------------------------------------------------------------------------------------


def fill_exponential(d: Draws, name: str, x: Tensor, lambd: float) -> Tensor:
    """``x`` in place: ``-log(v) / lambd``, ``v`` uniform in ``(0, 1)``: positive and finite (its
    tail stops where ``v`` does, at ``(k + 1) * log(2) / lambd`` for ``k`` bits)."""
    if x.is_meta:
        return x
    v = d.open_uniform(name, x.shape, x.device, x.dtype)
    return x.copy_(torch.log(v).neg_().div_(lambd))


@serves(torch.Tensor.exponential_)
def _exponential_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lambd = args[1] if len(args) > 1 else kwargs.get("lambd", 1.0)
    if not _plain({k: v for k, v in kwargs.items() if k != "lambd"}, frozenset({"generator"})):
        return func(*args, **kwargs)
    return fill_exponential(d, name_of(func), args[0], float(lambd))


@serves(F.gumbel_softmax)
def _gumbel_softmax(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's own ``F.gumbel_softmax``, its exponential draw served (the function mode does not
    see the draw inside the function)."""
    names = ("logits", "tau", "hard", "eps", "dim")
    given = dict(zip(names, args, strict=False)) | kwargs
    logits: Tensor = given["logits"]
    if given.keys() - set(names) or logits.is_meta:
        return func(*args, **kwargs)
    tau, hard, dim = given.get("tau", 1), given.get("hard", False), given.get("dim", -1)
    drawn = fill_exponential(d, name_of(func), torch.empty_like(logits), 1.0)
    y_soft = ((logits - drawn.log()) / tau).softmax(dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = torch.zeros_like(logits).scatter_(dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft


@serves(torch.Tensor.log_normal_)
def _log_normal_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``exp(mean + std * z)``, ``z`` the served Irwin-Hall normal; the exponential an ordinary op."""
    given = dict(zip(("self", "mean", "std"), args, strict=False)) | kwargs
    x = given["self"]
    if given.keys() - {"self", "mean", "std", "generator"} or x.is_meta:
        return func(*args, **kwargs)
    fill_normal(d, name_of(func), x, float(given.get("mean", 1.0)), float(given.get("std", 2.0)))
    return x.exp_()


@serves(torch.Tensor.cauchy_)
def _cauchy_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``median + sigma * tan(pi * (v - 1/2))``, ``v`` uniform in ``(0, 1)`` (never a pole), as
    torch's; the tangent an ordinary op."""
    given = dict(zip(("self", "median", "sigma"), args, strict=False)) | kwargs
    x = given["self"]
    if given.keys() - {"self", "median", "sigma", "generator"} or x.is_meta:
        return func(*args, **kwargs)
    v = d.open_uniform(name_of(func), x.shape, x.device, x.dtype)
    angle = v.sub_(0.5).mul_(math.pi)
    return x.copy_(
        torch.tan(angle).mul_(float(given.get("sigma", 1.0))).add_(float(given.get("median", 0.0)))
    )


@serves(torch.Tensor.geometric_)
def _geometric_(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The trials to the first success, ``ceil(log(v) / log1p(-p))``, ``v`` uniform in ``(0, 1)``,
    as torch's; the logarithms ordinary ops."""
    given = dict(zip(("self", "p"), args, strict=False)) | kwargs
    x, p = given["self"], float(given["p"])
    if given.keys() - {"self", "p", "generator"} or x.is_meta or not 0.0 < p < 1.0:
        return func(*args, **kwargs)
    v = d.open_uniform(name_of(func), x.shape, x.device, torch.float64)
    trials = torch.log(v).div_(math.log1p(-p)).ceil_().clamp_(min=1.0)
    return x.copy_(trials)


__all__ = ["fill_exponential", "fill_normal", "fill_uniform"]
