"""Rounding float64 tensors to a float32-shaped grid (the seed paper's ``rnd``).

The grid for ``bits`` in 16..32 keeps the top ``bits - 9`` of float32's 23 mantissa bits and float32's
exponent range (``bits = 32`` is float32 itself). :func:`rnd` rounds half to even on that grid; values
past the largest finite grid value go to ``±inf`` as IEEE round-to-nearest does, values below half the
smallest subnormal spacing go to a signed zero.

Everything is integer arithmetic on the float64's ``int64`` view, vectorised in torch (CPU or CUDA):

* normal range (``|x| >= 2**-126``): every float64 there drops the same ``k0 = 52 - p`` low mantissa bits
  (``p = bits - 9``), so rounding is done on the whole bit pattern and carries run into the exponent;
* float32-subnormal range (``0 < |x| < 2**-126``): the dropped-bit count grows as the exponent falls;
  those (rare) elements are patched in from a per-element path on the explicit significand.

From the dropped bits ``r`` follow the rounding (``r`` against half a step, ties to even) and, in
:mod:`~game.training.numerics.logtrits` (which shares this module's integer analysis), the log trit
and the two bracketing grid points that its ``rev`` chooses between.

``tau`` is a fraction of the ulp, ``0 <= tau < 0.5``, and must be a multiple of ``2**-62`` (true for every
``tau >= 2**-10`` and every short binary fraction) so that the threshold comparison is exact.
"""

from __future__ import annotations

import logging
import math
import struct
from fractions import Fraction
from functools import cache
from typing import Any, NamedTuple

import torch

from game.errors import ConfigError, NonFiniteError, TrainingError
from game.training.native import bindings

log = logging.getLogger(__name__)

MIN_BITS = 16
MAX_BITS = 32

_MANT = 52  # float64 stored mantissa bits
_MANT_MASK = (1 << _MANT) - 1
_ABS_MASK = (1 << 63) - 1
_INF_BITS = 0x7FF << _MANT  # float64 +inf
_MIN_NORMAL_BITS = (1023 - 126) << _MANT  # float64 bits of 2**-126, float32's smallest normal
_OVERFLOW_BITS = (1023 + 128) << _MANT  # float64 bits of 2**128: first value past float32's range
_TAU_SCALE = 62  # tau is held as the integer tau * 2**62
_SIGN_BIT = -(1 << 63)


class RoundingInputError(TrainingError, TypeError):
    """A rounding primitive got a tensor it cannot round (not float64) or trits of the wrong shape."""


class _Grid(NamedTuple):
    """Constants of the grid for one ``bits`` (all Python ints, shared by every call)."""

    p: int  # kept float32 mantissa bits
    k0: int  # dropped float64 mantissa bits in the normal range
    step: int  # 1 << k0
    half: int  # 1 << (k0 - 1)
    keep_mask: int  # ~(step - 1) within the magnitude
    max_finite: int  # float64 bits of the largest finite grid value
    sub_spacing: float  # 2 ** (-126 - p), the spacing below 2**-126


@cache
def _grid(bits: int) -> _Grid:
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ConfigError(f"rounding bits must be an int in {MIN_BITS}..{MAX_BITS}, got {bits!r}")
    p = bits - 9
    k0 = _MANT - p
    step = 1 << k0
    max_finite = ((1023 + 127) << _MANT) | (((1 << p) - 1) << k0)
    return _Grid(p, k0, step, step >> 1, _ABS_MASK & ~(step - 1), max_finite, 2.0 ** (-126 - p))


@cache
def _tau_fixed(tau: float) -> int:
    """``tau * 2**62`` as an exact integer; ConfigError when tau is out of range or not representable."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise ConfigError(f"tau must be a float in [0, 0.5), got {tau!r}")
    if not 0 <= tau < 0.5:
        raise ConfigError(f"tau must lie in [0, 0.5) (a fraction of the ulp), got {tau!r}")
    scaled = Fraction(tau) * (1 << _TAU_SCALE)
    if scaled.denominator != 1:
        raise ConfigError(f"tau must be a multiple of 2**-{_TAU_SCALE} (any tau >= 2**-10 is), got {tau!r}")
    return int(scaled)


def _int_view(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float64:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise RoundingInputError(f"rounding needs a float64 tensor, got {got}")
    return x.detach().view(torch.int64)


class _Parts(NamedTuple):
    """Per-element facts about |x| on the grid (magnitudes as float64 bit patterns, before the sign)."""

    rounded: torch.Tensor  # int64: RNE result, +inf bits past the range, NaN bits kept
    up: torch.Tensor  # bool: the rounded magnitude lies above |x| (incl. overflow to inf)
    off: torch.Tensor  # bool: x is not a grid value (finite, not on the grid, or past the range)
    far: torch.Tensor | None  # bool: |x - rnd(x)| > tau * ulp(x)   (only when tau was given)
    lo: torch.Tensor | None  # int64: grid magnitude just below |x| (<= |x|), max finite past the range
    hi: torch.Tensor | None  # int64: lo plus one grid step, +inf past the range
    frac: torch.Tensor | None  # float64: |x - rnd(x)| / ulp(x) on the unbounded-exponent grid


def _exact_parts(raw: torch.Tensor, g: _Grid, *, tau_fixed: int | None, brackets: bool, frac: bool) -> _Parts:
    """Every case, from flat magnitude bits ``raw``: the slow path for the lanes the fast path skips.

    The kernels run it only on "rare" lanes (float32-subnormal range, past the largest finite grid
    value, ±inf, NaN); :func:`midpoint_distance` runs it on everything.
    """
    a = torch.clamp(raw, max=_INF_BITS)
    r = a & (g.step - 1)
    lo = a - r
    # r + (odd last kept bit) > half  <=>  r > half, or a tie that must go to the even neighbour.
    up = (r + ((a >> g.k0) & 1)) > g.half
    rounded = torch.where(up, lo + g.step, lo)
    finite = a < _INF_BITS
    overflow = (rounded >= _OVERFLOW_BITS) & finite
    off = (r != 0) | overflow
    far = dist = None
    if tau_fixed is not None or frac:
        dist = torch.where(up, g.step - r, r)  # to the nearest point of the unbounded-exponent grid
    up = up | overflow
    if tau_fixed is not None:
        assert dist is not None
        far = (dist > (tau_fixed >> (_TAU_SCALE - g.k0))) | overflow
    ratio = None
    if frac:
        assert dist is not None
        ratio = dist.to(torch.float64) * (2.0**-g.k0)
    lo_out = hi_out = None
    if brackets:
        hi_out = lo + g.step
        hi_out = torch.where(hi_out >= _OVERFLOW_BITS, _INF_BITS, hi_out)
        lo_out = torch.where(lo >= _OVERFLOW_BITS, g.max_finite, lo)
    rounded = torch.where(rounded >= _OVERFLOW_BITS, _INF_BITS, rounded)
    rounded = torch.where(raw > _INF_BITS, raw, rounded)  # NaN passes through, payload and all

    sub = (a < _MIN_NORMAL_BITS) & (a != 0)
    if bool(sub.any()):
        idx = sub.nonzero().squeeze(1)
        s = _sub_parts(a.index_select(0, idx), g, tau_fixed=tau_fixed, frac=frac)
        rounded = rounded.index_copy(0, idx, s.rounded)
        up = up.index_copy(0, idx, s.up)
        off = off.index_copy(0, idx, s.off)
        if far is not None:
            assert s.far is not None
            far = far.index_copy(0, idx, s.far)
        if ratio is not None:
            assert s.frac is not None
            ratio = ratio.index_copy(0, idx, s.frac)
        if lo_out is not None and hi_out is not None:
            assert s.lo is not None and s.hi is not None
            lo_out = lo_out.index_copy(0, idx, s.lo)
            hi_out = hi_out.index_copy(0, idx, s.hi)
    return _Parts(rounded, up, off, far, lo_out, hi_out, ratio)


def _sub_parts(a: torch.Tensor, g: _Grid, *, tau_fixed: int | None, frac: bool) -> _Parts:
    """The same facts for ``0 < |x| < 2**-126``, where the dropped-bit count ``kt`` varies per element.

    ``|x| = S * 2**(e - 52)`` with the explicit significand ``S``; the grid spacing there is
    ``2**(-126 - p) = 2**(e - 52 + kt)``. Shifts are capped at 62 (``S < 2**53``, so a larger ``kt`` rounds
    to zero anyway); the tau comparison for ``kt > 62`` shifts the distance down with a sticky bit, which
    is exact because ``tau * 2**62`` is an integer.
    """
    biased = a >> _MANT
    significand = (a & _MANT_MASK) | ((biased > 0).to(torch.int64) << _MANT)
    kt = (949 - g.p) - torch.clamp(biased, min=1)  # 52 - p + (-126 - e), e = max(biased, 1) - 1023
    k = torch.clamp(kt, max=62)
    one = torch.ones_like(k)
    step = one << k
    q = significand >> k
    r = significand & (step - 1)
    up = (r + (q & 1)) > (step >> 1)
    q_round = q + up.to(torch.int64)
    rounded = (q_round.to(torch.float64) * g.sub_spacing).view(torch.int64)
    dist = torch.where(up, step - r, r)
    far = None
    if tau_fixed is not None:
        sh = torch.clamp(kt - 62, min=0, max=62)
        scaled = (dist << (62 - k)) >> sh
        sticky = (dist & ((one << sh) - 1)) != 0
        far = (scaled > tau_fixed) | ((scaled == tau_fixed) & sticky)
    ratio = None
    if frac:
        pow2 = ((1023 - kt) << _MANT).view(torch.float64)  # 2**-kt, exact (kt <= 941)
        ratio = dist.to(torch.float64) * pow2
    lo = (q.to(torch.float64) * g.sub_spacing).view(torch.int64)
    hi = ((q + 1).to(torch.float64) * g.sub_spacing).view(torch.int64)
    return _Parts(rounded, up, r != 0, far, lo, hi, ratio)


def _rare_lanes(xf: torch.Tensor, g: _Grid, scratch: torch.Tensor) -> torch.Tensor | None:
    """Indices of the lanes the fast path must not decide, or None; ``scratch`` is overwritten.

    The fast path works on the signed bit pattern and is exact for ±0 and for
    ``2**-126 <= |x| <= max finite grid value``. Everything else (float32-subnormal range, past the
    range, ±inf, NaN) is rare in training and goes through :func:`_exact_parts`. The common case costs
    two in-place passes and two reductions (no mask is written) and one device sync on CUDA.
    """
    if xf.numel() == 0:
        return None
    a = torch.bitwise_and(xf, _ABS_MASK, out=scratch)
    top = a.max()  # > max finite: something past the range, ±inf or NaN
    # (|x| - 1) & ABS wraps 0 to the top, so the minimum is below 2**-126 - 1 only for 0 < |x| < 2**-126.
    bottom = a.sub_(1).bitwise_and_(_ABS_MASK).min()
    big, small = torch.stack([top, bottom]).tolist()
    if big <= g.max_finite and small >= _MIN_NORMAL_BITS - 1:
        return None
    rare = (scratch < (_MIN_NORMAL_BITS - 1)) | ((scratch >= g.max_finite) & (scratch != _ABS_MASK))
    return rare.nonzero().squeeze(1)


def _slow(xf: torch.Tensor, rare: torch.Tensor, g: _Grid, **kw: Any) -> tuple[_Parts, torch.Tensor]:
    """Exact parts of the rare lanes, and their sign bits (int64, 0 or the sign bit)."""
    sub = xf.index_select(0, rare)
    return _exact_parts(sub & _ABS_MASK, g, **kw), sub & _SIGN_BIT


def _flat(x: torch.Tensor) -> torch.Tensor:
    return _int_view(x).reshape(-1)


def _odd(xf: torch.Tensor, g: _Grid) -> torch.Tensor:
    """New int64 tensor: the last kept mantissa bit (1 where the grid value below is odd)."""
    return (xf >> g.k0).bitwise_and_(1)


def _round_fast_(odd: torch.Tensor, xf: torch.Tensor, g: _Grid) -> torch.Tensor:
    """RNE on the signed bit pattern, into ``odd``: add half a step minus one plus the last kept bit and
    drop the low bits. The sign bit is untouched (a magnitude carry never reaches it below +inf); NaN
    lanes may wrap, but they are rare lanes and get overwritten by the exact path."""
    return odd.add_(xf).add_(g.half - 1).bitwise_and_(-g.step)


# --------------------------------------------------------------------------------------------------
# The float32 grid through the hardware's conversion
# --------------------------------------------------------------------------------------------------

#: The largest finite float32: at or below it, converting to float32 never overflows.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

#: Values whose float32 conversion tells whether a device converts by IEEE round-to-nearest-even
#: down to the subnormals (a flush-to-zero mode, ``torch.set_flush_denormal(True)`` on x86, does not).
_PROBE_VALUES: tuple[float, ...] = (
    2.0**-140 * 1.3, 2.0**-149 * 0.5, 2.0**-149 * 0.75, 2.0**-149 * 1.5, 2.0**-149 * 2.5, 2.0**-150 * 0.99,
    2.0**-126 * (1 - 2.0**-30), 2.0**-126 * (1 - 2.0**-24), 2.0**-127 * 3, 1 + 2.0**-24, 1 + 3 * 2.0**-24,
    1 + 2.0**-24 + 2.0**-50, FLOAT32_MAX, 1e-300, 0.0,
)  # fmt: skip

_conversion_ok: dict[str, bool] = {}


@cache
def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    """The probe values (and their negations) and their bits rounded by the integer path, worked out
    once: that path is integer arithmetic, the same in any floating-point mode, and at about half a
    millisecond it cost a small model's step a tenth of its time when run at every probe."""
    values = torch.tensor(_PROBE_VALUES, dtype=torch.float64)
    probe = torch.cat([values, -values])
    want = rnd(probe, MAX_BITS, top=math.inf).view(torch.int64)  # top=inf: the integer path
    return probe, want


def recheck_conversion() -> None:
    """Forget the conversion probes: the next fast-path call on each device probes again.

    The step engine calls it before every step, so a flush-to-zero mode switched on between steps
    is seen (the probe runs in the calling thread, whose mode the conversion kernels use).
    """
    _conversion_ok.clear()


def conversion_exact(device: torch.device) -> bool:
    """True when ``float64 -> float32`` on ``device`` rounds exactly as :func:`rnd` does for 32 bits.

    IEEE 754 fixes that conversion (round to nearest, ties to even, gradual underflow, overflow to
    inf), on CPUs and on CUDA alike; only a flush-to-zero mode breaks it, and the probe sees that.
    """
    key = str(device)
    ok = _conversion_ok.get(key)
    if ok is None:
        probe, want = _probe()
        got = probe.to(device).to(torch.float32).to(torch.float64).cpu()
        ok = torch.equal(got.view(torch.int64), want)
        if not ok:
            log.warning("float32 conversion on %s is not IEEE (flush to zero?): using the integer path", key)
        _conversion_ok[key] = ok
    return ok


def magnitude(x: torch.Tensor) -> float:
    """``max |x|`` in one read-only pass; ``inf`` when ``x`` holds an inf or a NaN, 0 when empty."""
    if x.numel() == 0:
        return 0.0
    low, high = torch.stack(list(torch.aminmax(x.detach()))).tolist()
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.inf
    return float(max(-low, high))


def fast_float32(x: torch.Tensor, bits: int, top: float | None = None) -> bool:
    """Whether :func:`rnd` of ``x`` may be the hardware's float32 conversion (two cheap passes instead
    of the integer path's nine): the 32-bit grid *is* float32, every value is finite and in float32's
    range (``top``: ``max |x|``, scanned when None), and the device converts exactly."""
    if bits != MAX_BITS or not isinstance(x, torch.Tensor) or x.dtype != torch.float64 or x.numel() == 0:
        return False
    if top is None:
        top = magnitude(x)
    return top <= FLOAT32_MAX and conversion_exact(x.device)


def rnd(x: torch.Tensor, bits: int, *, top: float | None = None) -> torch.Tensor:
    """Round a float64 tensor half-to-even onto the ``bits`` grid; returns a new float64 tensor.

    ``top``: ``max |x|`` when the caller already knows it (:func:`check_values` returns it), so the
    float32 fast path (:func:`fast_float32`) needs no scan of its own.
    """
    g = _grid(bits)
    if isinstance(x, torch.Tensor) and (copy := bindings.rounded_copy(x, g.k0, g.max_finite)) is not None:
        return copy
    if fast_float32(x, bits, top):
        return x.detach().to(torch.float32, memory_format=torch.contiguous_format).to(torch.float64)
    xf = _flat(x)
    out = _odd(xf, g)
    rare = _rare_lanes(xf, g, torch.empty_like(xf))
    _round_fast_(out, xf, g)
    if rare is not None:
        slow, sign = _slow(xf, rare, g, tau_fixed=None, brackets=False, frac=False)
        out.index_copy_(0, rare, slow.rounded | sign)
    return out.view(torch.float64).view(x.shape)


def round_(x: torch.Tensor, bits: int, *, top: float | None = None, sentinel: bool = False) -> torch.Tensor:
    """In-place :func:`rnd` (optimizer state, mutated op arguments); returns ``x``.

    A contiguous ``x`` is rounded in its own storage through the ``int64`` view (no result tensor, no
    copy back); other layouts go through :func:`rnd` and ``copy_``. On CPU the C kernel
    (:mod:`game.training.native`) does it in one pass, on CUDA a Triton kernel
    (:mod:`game.training.numerics.cuda_kernels`); elsewhere, on the float32 grid, the hardware conversion
    (:func:`fast_float32`).

    ``sentinel`` (an exact op's result): float64's largest value, ``torch.finfo(torch.float64).min``
    or ``max``, goes to the grid's largest rather than to inf (:func:`largest_to_grid_`).
    """
    g = _grid(bits)
    if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
        if bindings.round_inplace(x, g.k0, g.max_finite):
            return x  # one pass in C (CPU, contiguous, no rare lanes)
        if x.is_cuda and _cuda_round_inplace(x, g):
            return x  # one Triton kernel (CUDA, contiguous, no rare lanes)
        if sentinel:  # the kernels leave a tensor holding one to this path (it is past the range)
            largest_to_grid_(x, bits)
    xi = _int_view(x)
    if fast_float32(x, bits, top):
        xd = x.detach()
        xd.copy_(xd.to(torch.float32))
        return x
    if not xi.is_contiguous():
        rounded = rnd(x, bits)
        with torch.no_grad():
            x.copy_(rounded)
        return x
    xf = xi.view(-1)
    rare = _rare_lanes(xf, g, torch.empty_like(xf))
    fix = None
    if rare is not None:  # decided from the original values, written after the fast pass
        slow, sign = _slow(xf, rare, g, tau_fixed=None, brackets=False, frac=False)
        fix = slow.rounded | sign
    odd = _odd(xf, g)
    xf.add_(odd).add_(g.half - 1).bitwise_and_(-g.step)
    if rare is not None and fix is not None:
        xf.index_copy_(0, rare, fix)
    return x


#: float64's largest finite value: ``torch.finfo(torch.float64).max``.
FLOAT64_MAX = float(torch.finfo(torch.float64).max)


def largest_to_grid_(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Write the ``bits`` grid's largest value over float64's own (``±FLOAT64_MAX``) in ``x``.

    A model masks attention scores with ``torch.finfo(dtype).min``, meaning "the most negative
    finite number". On float32 hardware that is float32's, and a row masked on every key (a padded
    query) stays finite, its softmax uniform. In float64 it is ``-FLOAT64_MAX``, which :func:`rnd`
    takes to ``-inf`` (IEEE), and the row would be NaN. So an exact op's result (a fill, a
    ``where``) reads it as the grid's largest; a value an op computes that large is an overflow.
    """
    found = (_int_view(x) & _ABS_MASK) == _INF_BITS - 1
    if bool(found.any()):
        with torch.no_grad():
            x.copy_(torch.where(found, torch.copysign(torch.full_like(x, grid_max(bits)), x), x))
    return x


def _float_of(pattern: int) -> float:
    """The float64 whose bit pattern is ``pattern``."""
    return float(struct.unpack("<d", struct.pack("<q", pattern))[0])


@cache
def grid_max(bits: int) -> float:
    """The ``bits`` grid's largest finite value, as a float."""
    return _float_of(_grid(bits).max_finite)


def _cuda_round_inplace(x: torch.Tensor, g: _Grid) -> bool:
    """:func:`game.training.numerics.cuda_kernels.round_inplace` when Triton is there (imported on first use)."""
    from game.training.numerics import cuda_kernels

    return cuda_kernels.round_inplace(x, g.k0, g.max_finite)


def ulp(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Grid spacing at ``x``'s binary exponent (``hi - lo`` of the bracketing grid points), float64.

    The exponent is clamped to float32's range: below ``2**-126`` (and for ±0) the spacing is the
    subnormal one, ``2**(-149 + 32 - bits)``; at and past ``2**127`` it is the last binade's. ±inf gives
    inf and NaN gives NaN.
    """
    g = _grid(bits)
    xi = _int_view(x)
    biased = (xi & _ABS_MASK) >> _MANT
    out = ((torch.clamp(biased, min=1023 - 126, max=1023 + 127) - g.p) << _MANT).view(torch.float64)
    return torch.where(torch.isfinite(x), out, x.detach().abs())


def midpoint_distance(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``|x - nearest rounding midpoint| / ulp(x)`` in ``[0, 0.5]``; 0 means a tie, 0.5 a grid value.

    Measured on the unbounded-exponent grid (past float32's range it continues the last binade);
    ±inf and NaN give NaN. Float results: meant for threshold calibration, not for consensus.
    """
    g = _grid(bits)
    xi = _int_view(x)
    p = _exact_parts((xi & _ABS_MASK).reshape(-1), g, tau_fixed=None, brackets=False, frac=True)
    assert p.frac is not None
    out = 0.5 - p.frac.view(xi.shape)
    return torch.where(torch.isfinite(x), out, torch.full_like(out, float("nan")))


def is_on_grid(x: torch.Tensor, bits: int) -> bool:
    """True when every value equals its rounding bit for bit (±0 and ±inf count; NaN does not)."""
    xi = _int_view(x)
    same = torch.equal(rnd(x, bits).view(torch.int64), xi)
    return same and not bool(torch.isnan(x).any())


def check_values(x: torch.Tensor, bits: int, where: str) -> float:
    """Raise :class:`NonFiniteError` naming ``where`` (e.g. ``"step 12, op aten.mm"``) on NaN, or on
    a finite value that rounds to inf on the ``bits`` grid (an overflow); return the largest finite
    ``|x|`` (the kernels' ``top``, so they need no scan of their own).

    ``±inf`` passes: a float64 op makes it exactly (a log of 0, a division by 0), the same on every
    IEEE machine, and it is its own rounding, so no log entry concerns it (T5's relative-position
    buckets take the log of 0 on lanes a ``torch.where`` then drops). NaN has no such rule (its bits
    differ by device). A finite value that would round to inf is refused where it is made: the
    training has left float32's range. The common case is one read-only pass: min and max
    propagate NaN and show ``±inf``.
    """
    if x.numel() == 0:
        return 0.0
    if not x.is_floating_point():
        return magnitude(x)
    top = magnitude(x)
    if not math.isfinite(top):
        nan = int(torch.isnan(x).sum())
        if nan:
            inf = int(torch.isinf(x).sum())
            raise NonFiniteError(f"non-finite values at {where}: {nan} NaN, {inf} inf out of {x.numel()}")
        finite = x.detach()[torch.isfinite(x)]
        top = magnitude(finite) if finite.numel() else 0.0
    limit = _overflow_at(bits)
    if top >= limit:
        over = int((x.detach().abs() >= limit).logical_and_(torch.isfinite(x)).sum())
        raise NonFiniteError(
            f"overflow at {where}: {over} finite value(s) round to inf on the {bits}-bit grid "
            f"(at or past {limit:g}), up to {top:g}"
        )
    return top


@cache
def _overflow_at(bits: int) -> float:
    """The least float64 that rounds to inf on the ``bits`` grid: its largest finite value plus half
    a step (the largest value's last kept bit is odd, so the tie goes up)."""
    g = _grid(bits)
    return _float_of(g.max_finite + g.half)
