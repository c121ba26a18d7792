"""Band kernels: which values can round differently on two machines, and the checks on a log.

A value's *distance* ``d`` is how far its float64 result lies from the nearest rounding midpoint of
the grid; its *band* ``B`` (:class:`~game.training.numerics.bandfile.Band`) bounds how far two machines' results
of the same op can lie apart. Both are counted in float64 ulps of the value (``2**(e(x) - 52)``),
which makes the band independent of the grid width: ``B = 2**(52 + rel) + 2**(52 + abs + e(S) - e(x))``,
capped at an eighth of a grid step (so no zone below reaches a grid point: a value on the grid for
one party and just off it for the other must round to that grid point on both sides).

The sparse log's rule, for an off-grid value (both parties use their own ``d`` and ``B``):

* ``d <= B``: round to the **even** neighbour of the bracketing pair, unless the log lists the value;
* listed in the log: round to the **odd** neighbour (accepted only where ``d <= 16 B``, by the
  judge's rule; an auditor and a rebuild accept a little further: :mod:`.reach`);
* otherwise: round to nearest (ties to even: the plain rounding).

So an honest trainer (round to nearest, ties to even) lists exactly the values with ``d <= 4 B`` that
it rounded to the odd neighbour. Exact ties, which a machine that adds noise meets by the thousand,
go to the even neighbour and cost nothing; only about half of the non-tie values near a midpoint do.

Why it replays everywhere, with a band at least 16x the real divergence ``delta`` (the calibration's
margin): the two parties' ``B`` differ by at most 2x (``e(S)`` may differ by one binade when the
tensor's largest value sits on a power of two) and their ``d`` by ``delta <= B / 16``. A value the
auditor puts in its even zone has ``d_T <= 2.25 B_T``, so the trainer listed it if it went odd; a value
outside that zone has ``d_A > B_A >= 8 delta``, so both values lie on the same side of the midpoint
and round to the same nearest neighbour; a listed value has ``d_A <= 4.25 B_T + delta <= 16 B_A``.

What a trainer can still choose: the side of values within ``16 B`` of a midpoint, and nothing else
(out to some ``33 B`` undisputed: no auditor disputes an entry a judge elsewhere could accept,
:mod:`.reach`).
An entry further out is log tampering (:class:`LogTamperingError`); an odd rounding without an
entry is not a log error but a wrong state, which every honest replay (and the judge) disagrees with.

The common lanes (``2**-126 <= |x| <= max finite``) are integer work on the int64 view; the rare ones
(float32-subnormal range, past the range) go through a float path on the few lanes concerned.
"""

from __future__ import annotations

import math
import struct
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from game.errors import RoundingLogError
from game.training.native import bindings, library
from game.training.numerics import logtrits, rounding
from game.training.numerics.bandfile import Band
from game.training.numerics.reach import Checks, reach

_MANT = 52
_ABS_MASK = (1 << 63) - 1
_BIG = 1 << 62  # "infinitely far": a distance no band reaches
_MIN_NORMAL_BIASED = 1023 - 126


class LogTamperingError(RoundingLogError):
    """A log entry the band rules forbid: out of band, out of range, or missing where needed.

    The message names the step, the op and the value's index within the op's output; the attributes
    keep them for tools (``kind`` is ``"outside"``, ``"position"`` or ``"missing"``).
    """

    def __init__(self, message: str, *, kind: str, index: int, step: int | None = None, op: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.index = index
        self.step = step
        self.op = op


class BandViolation(Exception):
    """Raised by the kernels (which know neither step nor op); the interceptor rewraps it."""

    def __init__(self, kind: str, index: int, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.index = index
        self.detail = detail

    def at(self, step: int | None, op_index: int, op: str) -> LogTamperingError:
        where = f"step {step}" if step is not None else "step ?"
        return LogTamperingError(
            f"log tampering at {where}, op #{op_index} {op}, value {self.index}: {self.detail}",
            kind=self.kind,
            index=self.index,
            step=step,
            op=op,
        )


class Geometry(NamedTuple):
    """Per flat lane: distance to the nearest midpoint and the band, in float64 ulps of the value
    (the rare lanes scaled to the same units as the lowest normal binade), and off-grid."""

    distance: Tensor  # int64
    band: Tensor  # int64, capped at an eighth of a grid step
    off: Tensor  # bool: not on the grid (needs rounding at all)


def top_binade(xf: Tensor) -> int:
    """Biased exponent of the largest finite magnitude (``e(S)`` of the band), at least float32's
    smallest normal. An inf (which passes the rounding as it is) does not widen the bands of the
    values beside it."""
    if xf.numel() == 0:
        return _MIN_NORMAL_BIASED
    a = xf & _ABS_MASK
    top = int(a.max())
    if top >= rounding._INF_BITS:
        finite = a[a < rounding._INF_BITS]
        top = int(finite.max()) if finite.numel() else 0
    return max(top >> _MANT, _MIN_NORMAL_BIASED)


def top_binade_of(top: float) -> int:
    """:func:`top_binade` from the largest finite ``|x|`` as a float (what :func:`rounding.check_values`
    returns)."""
    biased = (struct.unpack("<q", struct.pack("<d", top))[0] & _ABS_MASK) >> _MANT
    return max(biased, _MIN_NORMAL_BIASED)


def geometry(xf: Tensor, bits: int, band: Band, top_biased: int | None = None) -> Geometry:
    """Distance, band and off-grid flag of every lane of a flat int64 view of float64 values.

    ``top_biased`` is the tensor's :func:`top_binade`; pass it when ``xf`` is a gathered subset.
    """
    g = rounding._grid(bits)
    a = xf & _ABS_MASK
    if a.numel() == 0:
        empty = torch.empty_like(a)
        return Geometry(empty, empty, empty.bool())
    if top_biased is None:
        top_biased = top_binade(xf)
    r = xf & (g.step - 1)  # the sign bit is above the mask: same low bits as |x|
    off = r != 0
    dist = r.sub_(g.half).abs_()
    biased = a >> _MANT
    rel_units = 1 << (_MANT + band.rel) if _MANT + band.rel >= 0 else 0
    shift = biased.neg_().add_(_MANT + band.abs + top_biased)  # 52 + abs + e(S) - e(x)
    floor = torch.where(shift >= 0, torch.ones_like(shift) << shift.clamp_(0, 62), torch.zeros_like(shift))
    limit = floor.add_(rel_units).clamp_(max=g.half >> 2)
    rare_mask = ((a < (_MIN_NORMAL_BIASED << _MANT)) & (a != 0)) | (a > g.max_finite)
    if bool(rare_mask.any()):
        rare = rare_mask.nonzero().squeeze(1)
        d, lim, o = _rare_geometry(xf.index_select(0, rare), bits, band, top_biased)
        dist.index_copy_(0, rare, d)
        limit.index_copy_(0, rare, lim)
        off.index_copy_(0, rare, o)
    return Geometry(dist, limit, off)


def _rare_geometry(xf: Tensor, bits: int, band: Band, top_biased: int) -> tuple[Tensor, Tensor, Tensor]:
    """The float32-subnormal range and past the range, as fractions of the grid step scaled to the
    units of the lowest normal binade (``2**k0`` per step). Past the range (rounding to infinity,
    which fails the step anyway) nothing is in band."""
    g = rounding._grid(bits)
    x = xf.view(torch.float64)
    md = rounding.midpoint_distance(x, bits)  # fraction of the grid ulp; NaN past the range
    biased = torch.clamp((xf & _ABS_MASK) >> _MANT, min=1)
    f64_ulp = ((biased - _MANT) << _MANT).view(torch.float64)  # 2**(e(x) - 52), exact
    grid_ulp = rounding.ulp(x, bits)
    shift = ((_MANT + band.abs + top_biased) - biased).clamp(max=1100).to(torch.float64)
    floor = torch.where(shift >= 0, torch.exp2(shift) * f64_ulp, 0.0)  # 2**abs * 2**e(S), absolute
    limit = (floor + 2.0 ** (_MANT + band.rel) * f64_ulp) / grid_ulp  # fraction of the grid step
    scale = float(g.step)
    past = (xf & _ABS_MASK) > g.max_finite
    dist = torch.nan_to_num(md, nan=0.5) * scale
    lim = torch.where(past, 0.0, torch.clamp(limit * scale, max=float(g.half >> 2)))
    off = (md != 0.5) & ~past  # midpoint_distance is exactly 0.5 on the grid
    return dist.floor().to(torch.int64), lim.floor().to(torch.int64), off


def within(
    xf: Tensor, bits: int, band: Band, widen: int, top_biased: int, *, in_range: bool = False
) -> tuple[Tensor, Geometry]:
    """Indices of the off-grid lanes with ``d <= B << widen``, and their geometry.

    Decided in two passes so that the exact band is computed only where it can matter: where a value
    lies at most 8 binades (``rel - abs``) below the tensor's top, the floor is at most the relative
    part, so ``B <= 2 * 2**(52 + rel)`` and one test of the dropped bits rules the lane out; smaller
    values (and the rare lanes) are kept for the exact test, with everything near a midpoint.
    ``in_range``: the caller knows no value lies past the grid's largest finite value (one test less).
    """
    g = rounding._grid(bits)
    a = xf & _ABS_MASK
    rel_units = 1 << (_MANT + band.rel) if _MANT + band.rel >= 0 else 0
    reach = rel_units << (widen + 1)
    if reach < g.half:
        # |r - half| <= reach  <=>  (r - (half - reach)) mod step <= 2 reach: three passes, no abs.
        maybe = (xf - (g.half - reach)).bitwise_and_(g.step - 1) <= 2 * reach
    else:
        maybe = torch.ones_like(xf, dtype=torch.bool)
    small = max(min(top_biased + band.abs - band.rel, 2047), _MIN_NORMAL_BIASED) << _MANT
    tiny = (a < small).logical_and_(a != 0)  # exact zeros are on the grid: never a candidate
    maybe.logical_or_(tiny)
    if not in_range:
        maybe.logical_or_(a > g.max_finite)
    idx = maybe.nonzero().squeeze(1)
    geo = geometry(xf.index_select(0, idx), bits, band, top_biased)
    keep = (geo.band << widen).ge_(geo.distance).logical_and_(geo.off).nonzero().squeeze(1)
    return idx.index_select(0, keep), Geometry(
        geo.distance.index_select(0, keep), geo.band.index_select(0, keep), geo.off.index_select(0, keep)
    )


def _top(x: Tensor, bits: int, top: float | None, where: str | None = None) -> tuple[float, int]:
    """``max |x|`` (scanned when None: by :func:`rounding.check_values` when ``where`` names the op,
    which raises on NaN and overflow and gives the largest finite ``|x|``) and its :func:`top_binade`."""
    if top is None:
        top = rounding.magnitude(x) if where is None else rounding.check_values(x, bits, where)
    if math.isfinite(top):
        return top, top_binade_of(top)
    return top, top_binade(rounding._int_view(x).reshape(-1))


def _fused_buffer(x: Tensor, in_place: bool, *, cuda: bool = False) -> Tensor | None:
    """The float64 tensor the fused kernels round in place: ``x`` itself when asked and contiguous,
    else a contiguous copy; None when they cannot run here (not float64, empty, no kernels for its
    device: the C ones on CPU, the Triton ones on CUDA where ``cuda`` says the caller has them). No
    views: each costs microseconds, on some 400 tensors a step."""
    if x.dtype != torch.float64 or x.numel() == 0:
        return None
    if x.is_cpu:
        if not library.available():
            return None
    elif not (cuda and x.is_cuda and _cuda_kernels() is not None):
        return None
    if in_place and x.is_contiguous():
        return x
    return x.detach().clone(memory_format=torch.contiguous_format)


def _cuda_kernels() -> ModuleType | None:
    """:mod:`game.training.numerics.cuda_kernels` when Triton is there (imported on the first CUDA tensor)."""
    from game.training.numerics import cuda_kernels

    return cuda_kernels if cuda_kernels.available() else None


def _kernels_for(buf: Tensor) -> ModuleType:
    """The module whose kernels take ``buf`` (one :func:`_fused_buffer` returned)."""
    if buf.is_cpu:
        return bindings
    kernels = _cuda_kernels()
    assert kernels is not None  # _fused_buffer returned a CUDA tensor only with them
    return kernels


def _neighbours(xf: Tensor, positions: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """The even and the odd grid neighbour (float64) of the values at ``positions``.

    Normal lanes: the pattern with the dropped bits cleared is the lower neighbour in magnitude; its
    last kept bit says which of it and the next one up (carries run into the exponent) is even.
    Rare lanes: the grid index ``|x| / ulp`` directly (exact: a power-of-two division).
    """
    g = rounding._grid(bits)
    sub = xf.index_select(0, positions)
    lo = sub - (sub & (g.step - 1))
    lo_odd = (lo >> g.k0) & 1
    even = (lo + (lo_odd << g.k0)).view(torch.float64)
    odd = (lo + ((1 - lo_odd) << g.k0)).view(torch.float64)
    a = sub & _ABS_MASK
    rare = (a < (_MIN_NORMAL_BIASED << _MANT)) | (a > g.max_finite)
    if bool(rare.any()):
        x = sub.view(torch.float64)
        u = rounding.ulp(x, bits)
        q = torch.floor(x.abs() / u)
        q_odd = torch.remainder(q, 2) == 1
        sign = torch.sign(x)
        r_even = torch.where(q_odd, q + 1, q) * u * sign
        r_odd = torch.where(q_odd, q, q + 1) * u * sign
        even = torch.where(rare, rounding.rnd(r_even, bits), even)
        odd = torch.where(rare, rounding.rnd(r_odd, bits), odd)
    return even, odd


# --------------------------------------------------------------------------------------------------
# The trainer: round, and list the in-band values it rounded to the odd neighbour
# --------------------------------------------------------------------------------------------------


def round_and_band(
    x: Tensor,
    bits: int,
    band: Band,
    *,
    top: float | None = None,
    in_place: bool = False,
    where: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Trainer kernel of the sparse log: ``(rnd(x), positions)``.

    ``positions`` (int64, ascending, flat row-major) are the off-grid values within ``4 B`` of a
    rounding midpoint that round to the odd neighbour; everything else the auditor rounds the same
    way without being told (see the module docstring). ``top``: ``max |x|`` when known;
    ``in_place``: the result may be ``x`` itself; ``where``: the op, for the non-finite error.
    On CPU the C kernel (:mod:`game.training.native`) does it in two passes, on CUDA the Triton ones
    (:mod:`game.training.numerics.cuda_kernels`).
    """
    g = rounding._grid(bits)
    buf = _fused_buffer(x, in_place, cuda=True)
    if buf is not None:
        params = bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs)
        positions = _kernels_for(buf).round_and_band(buf, params)
        if positions is not None:
            return buf, positions
    xf = rounding._int_view(x).reshape(-1)
    top, top_biased = _top(x, bits, top, where)
    rounded = rounding.rnd(x, bits, top=top)
    in_range = top <= rounding.grid_max(bits)
    cand, _ = within(xf, bits, band, 2, top_biased, in_range=in_range)
    if cand.numel() == 0:
        return rounded, cand
    picked = rounded.reshape(-1).view(torch.int64).index_select(0, cand)
    mag = picked & _ABS_MASK
    if in_range and not bool(((mag < (_MIN_NORMAL_BIASED << _MANT)) & (mag != 0)).any()):
        # A normal grid value (or zero) is odd when its last kept mantissa bit is set.
        went_odd = ((picked >> g.k0) & 1).bool()
    else:  # subnormal or past the range: the grid index's parity, from the neighbours
        _, odd = _neighbours(xf, cand, bits)
        went_odd = picked == odd.view(torch.int64)
    return rounded, cand[went_odd]


# --------------------------------------------------------------------------------------------------
# The auditor and the judge: check the entries, then apply them
# --------------------------------------------------------------------------------------------------


def check_entries(
    xf: Tensor, bits: int, band: Band, positions: Tensor, *, widen: int, top_biased: int,
    checks: Checks = "judge",
) -> None:  # fmt: skip
    """Raise :class:`BandViolation` when an entry is out of range or farther than ``B << widen`` from a
    midpoint (4 for the sparse log's 16 B, 2 for a packed log's corrections), or as far as
    :func:`~.reach.reach` lets ``checks`` accept."""
    n = xf.numel()
    if positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise BandViolation("position", bad, f"entry for value {bad}, but the op has {n} values")
    geo = geometry(xf.index_select(0, positions), bits, band, top_biased)
    wide = reach(geo.band, widen, checks)
    outside = geo.distance > wide
    if bool(outside.any()):
        i = int(outside.nonzero()[0, 0])
        raise BandViolation(
            "outside",
            int(positions[i]),
            f"a direction is logged {int(geo.distance[i])} float64 ulps from a rounding midpoint, "
            f"outside the op's band (accepted up to {int(wide[i])})",
        )


class Replayed(NamedTuple):
    """What :func:`round_with_entries` returns."""

    rounded: Tensor
    corrections: int  # values that end up elsewhere than plain rounding would put them
    free: int  # off-grid values within 16 B: where a trainer could have chosen (-1: not counted)


def round_with_entries(
    x: Tensor,
    bits: int,
    band: Band,
    positions: Tensor,
    *,
    count_free: bool = False,
    top: float | None = None,
    in_place: bool = False,
    where: str | None = None,
    checks: Checks = "judge",
) -> Replayed:
    """Auditor kernel of the sparse log: check the entries, then round by the rule of the module docstring.

    Raises :class:`BandViolation` on an entry out of range, out of order or outside ``16 B`` (as far
    as :func:`~.reach.reach` lets ``checks`` accept: the fused kernels refuse at ``16 B``, and the
    torch path takes what they refused). ``count_free`` also counts the values a dishonest trainer
    could have sent either way (for the docs' "bits of freedom"; one more pass). ``top``,
    ``in_place``, ``where``: as :func:`round_and_band`; on CPU the C kernel does it in two passes,
    on CUDA the Triton ones.
    """
    g = rounding._grid(bits)
    buf = _fused_buffer(x, in_place, cuda=True)
    if buf is not None:  # the fused kernels check the entries before they write; the torch path words errors
        params = bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs)
        listed = positions.to(dtype=torch.int64).contiguous()  # where the log was decoded: the host
        fused = _kernels_for(buf).round_with_entries(buf, params, listed, count_free)
        if fused is not None:
            return Replayed(buf, fused.corrections, fused.free)
    pos = positions.to(device=x.device, dtype=torch.int64)
    if pos.numel() > 1 and not bool((pos[1:] > pos[:-1]).all()):
        i = int((pos[1:] <= pos[:-1]).nonzero()[0, 0]) + 1
        raise BandViolation("position", int(pos[i]), "entries are not in strictly increasing order")
    xf = rounding._int_view(x).reshape(-1)
    top_mag, top = _top(x, bits, top, where)
    in_range = top_mag <= rounding.grid_max(bits)
    check_entries(xf, bits, band, pos, widen=4, top_biased=top, checks=checks)
    free = int(within(xf, bits, band, 4, top, in_range=in_range)[0].numel()) if count_free else -1
    out = rounding.rnd(x, bits, top=top_mag)
    flat = out.view(-1)
    zone, _ = within(xf, bits, band, 0, top, in_range=in_range)
    touched = torch.cat([zone, pos]).unique() if pos.numel() else zone
    if touched.numel() == 0:
        return Replayed(out, 0, free)
    nearest = flat.index_select(0, touched).view(torch.int64)
    for lanes, pick in ((zone, 0), (pos, 1)):  # the listed (odd) values are written last: they win
        if lanes.numel():
            flat.index_copy_(0, lanes, _neighbours(xf, lanes, bits)[pick])
    corrections = int((flat.index_select(0, touched).view(torch.int64) != nearest).count_nonzero())
    return Replayed(out, corrections, free)


def round_and_trits(
    x: Tensor, bits: int, tau: float, *, in_place: bool = False, where: str | None = None
) -> tuple[Tensor, Tensor]:
    """Trainer kernel of the packed log: ``(rnd(x), trits)``, :func:`logtrits.round_and_log`; on CPU
    the C kernel does it in place (``in_place``: the result may be ``x`` itself). Trits are flat.
    ``where``: the op; the kernel then raises on NaN and overflow, naming it."""
    g = rounding._grid(bits)
    buf = _fused_buffer(x, in_place)
    if buf is not None:
        trits = bindings.round_and_trits(buf, g.k0, g.max_finite, logtrits.log_threshold(bits, tau))
        if trits is not None:
            return buf, trits
    if where is not None:
        rounding.check_values(x, bits, where)
    rounded, trits = logtrits.round_and_log(x, bits, tau)
    return rounded, trits.reshape(-1)


def round_with_trits(
    x: Tensor, bits: int, band: Band, trits: Tensor, *, in_place: bool = False, where: str | None = None,
    checks: Checks = "judge",
) -> tuple[Tensor, int]:  # fmt: skip
    """Auditor kernel of the packed log: ``(rev(x, bits, trits), values moved)`` after
    :func:`check_corrections`; on CPU the C kernel does both (the torch kernels word every error,
    and take what the C kernel refused within ``checks``' reach). ``where``: the op; the kernel then
    raises on NaN and overflow, naming it."""
    g = rounding._grid(bits)
    buf = _fused_buffer(x, in_place)
    if buf is not None:
        moved = bindings.round_with_trits(
            buf, bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs), trits
        )
        if moved is not None:
            return buf, moved
    if where is not None:
        rounding.check_values(x, bits, where)
    rounded, changed = logtrits.round_with_log_changes(x, bits, trits.reshape(x.shape))
    check_corrections(x, bits, band, changed, checks=checks)
    return rounded, int(changed.count_nonzero())


def check_corrections(x: Tensor, bits: int, band: Band, changed: Tensor, *, checks: Checks = "judge") -> None:
    """Packed log: every value the log moved must lie within ``4 B`` of a midpoint (``changed``: flat
    mask; further for an auditor and a rebuild: :mod:`.reach`).

    A packed log gives a trit for every value; only the ones that override the checker's own rounding
    are checked (an honest packed log also holds directions far outside the band, which agree).
    """
    if not bool(changed.any()):
        return
    xf = rounding._int_view(x).reshape(-1)
    positions = changed.nonzero().squeeze(1)
    check_entries(xf, bits, band, positions, widen=2, top_biased=top_binade(xf), checks=checks)


__all__ = [
    "BandViolation",
    "Geometry",
    "LogTamperingError",
    "Replayed",
    "check_corrections",
    "check_entries",
    "geometry",
    "round_and_band",
    "round_and_trits",
    "round_with_entries",
    "round_with_trits",
    "top_binade",
    "top_binade_of",
    "within",
]
