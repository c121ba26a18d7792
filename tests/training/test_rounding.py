"""Rounding primitives against a slow, exact reference built on ``fractions.Fraction``.

The reference enumerates the two bracketing grid points of ``|x|`` as exact rationals (binary exponent
found from the integer bit lengths, spacing ``2**(max(e, -126) - p)``), picks the nearer one with ties to
the even multiple, and maps anything at or past ``2**128`` to infinity. Every fast primitive is compared
with it element by element on random float64s (Hypothesis floats and raw int64 bit patterns) and on a
table of edge cases for every ``bits`` in 16..32.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import ConfigError, NonFiniteError, TrainingError
from game.training.numerics import rounding
from game.training.numerics.logtrits import rev, round_and_log, round_with_log
from game.training.numerics.rounding import (
    MAX_BITS,
    MIN_BITS,
    check_values,
    is_on_grid,
    midpoint_distance,
    rnd,
    round_,
    ulp,
)

ALL_BITS = list(range(MIN_BITS, MAX_BITS + 1))
TWO_128 = Fraction(2) ** 128


# ---------------------------------------------------------------------------------------------------
# Reference (slow and obvious)
# ---------------------------------------------------------------------------------------------------


def _binade(v: Fraction) -> int:
    """floor(log2 v) for v > 0, exactly."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


def ref_spacing(v: Fraction, bits: int, *, clamp_top: bool) -> Fraction:
    e = max(_binade(v), -126) if v > 0 else -126
    if clamp_top:
        e = min(e, 127)
    return Fraction(2) ** (e - (bits - 9))


def ref_brackets(v: Fraction, bits: int) -> tuple[Fraction, Fraction, Fraction]:
    """(lo, hi, spacing) on the unbounded-exponent grid for v >= 0; lo <= v < hi."""
    s = ref_spacing(v, bits, clamp_top=False)
    lo = (v // s) * s
    return lo, lo + s, s


def _to_float(mag: Fraction, negative: bool) -> float:
    f = math.inf if mag >= TWO_128 else float(mag)
    assert f == math.inf or Fraction(f) == mag, "grid values must be exact float64s"
    return -f if negative else f


def ref_rnd(x: float, bits: int) -> float:
    if math.isnan(x) or math.isinf(x):
        return x
    v = abs(Fraction(x))
    lo, hi, s = ref_brackets(v, bits)
    if v - lo < hi - v:
        mag = lo
    elif v - lo > hi - v:
        mag = hi
    else:
        mag = lo if (lo / s) % 2 == 0 else hi
    return _to_float(mag, math.copysign(1.0, x) < 0)


def ref_ulp(x: float, bits: int) -> float:
    if math.isnan(x) or math.isinf(x):
        return abs(x)
    return float(ref_spacing(abs(Fraction(x)), bits, clamp_top=True))


def ref_trit(x: float, bits: int, tau: float) -> int:
    if math.isnan(x) or math.isinf(x):
        return 1
    r = ref_rnd(x, bits)
    if r == x:
        return 1
    if math.isinf(r):
        return 2 if r > x else 0
    if abs(Fraction(x) - Fraction(r)) > Fraction(tau) * Fraction(ref_ulp(x, bits)):
        return 2 if r > x else 0
    return 1


def ref_rev(x: float, bits: int, trit: int) -> float:
    r = ref_rnd(x, bits)
    if math.isnan(x) or math.isinf(x) or r == x:
        return r
    negative = x < 0
    lo, hi, _ = ref_brackets(abs(Fraction(x)), bits)
    max_finite = (2 - Fraction(2) ** -(bits - 9)) * Fraction(2) ** 127
    lo_f = _to_float(min(lo, max_finite), negative)
    hi_f = _to_float(hi, negative)
    below, above = (hi_f, lo_f) if negative else (lo_f, hi_f)
    if trit == 0 and r > x:
        return below
    if trit == 2 and r < x:
        return above
    return r


def ref_midpoint_distance(x: float, bits: int) -> float:
    if math.isnan(x) or math.isinf(x):
        return math.nan
    v = abs(Fraction(x))
    lo, hi, s = ref_brackets(v, bits)
    return float(Fraction(1, 2) - min(v - lo, hi - v) / s)


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def _assert_values(
    got: torch.Tensor, want: list[float], xs: list[float], what: str, *, any_nan: bool = False
) -> None:
    """Bit-for-bit equality (sign of zero, NaN payload); ``any_nan`` accepts any NaN for a NaN."""
    for x, g, w in zip(xs, got.tolist(), want, strict=True):
        ok = _same_bits(g, w) or (any_nan and math.isnan(g) and math.isnan(w))
        assert ok, f"{what}({x!r} = {x.hex()}): got {g!r}, want {w!r}"


def _from_bits(patterns: list[int]) -> list[float]:
    return [struct.unpack("<d", struct.pack("<q", b))[0] for b in patterns]


def edge_cases(bits: int) -> list[float]:
    """Values where grids get interesting, with their float64 neighbours and negatives."""
    p = bits - 9
    sub = 2.0 ** (-126 - p)
    f32max = float((2 - Fraction(2) ** -p) * Fraction(2) ** 127)
    base = [
        0.0,
        5e-324,
        2.2250738585072014e-308,
        sub,
        sub / 2,  # tie to zero (even)
        sub * 1.5,  # tie to 2 * sub (even)
        sub * 2.5,  # tie to 2 * sub (even)
        sub * 3.5,  # tie to 4 * sub
        sub / 4,
        2.0**-126,
        2.0**-126 - sub / 2,  # tie at the top of the subnormal range: carries into the normal range
        2.0**-127,
        1.0,
        1.0 + 2.0**-p / 2,  # tie, even below
        1.0 + 3 * 2.0**-p / 2,  # tie, even above
        2.0 - 2.0 ** -(p + 1),  # tie just below 2: carries up to 2
        2.0**20 - 2.0 ** (19 - p) / 2,
        f32max,
        f32max + 2.0 ** (127 - p) / 2,  # tie past the range: inf
        2.0**128,
        1e300,
        math.inf,
        1.0 / 3,
        math.pi,
        1e-40,
    ]
    out: list[float] = []
    for v in base:
        for w in (v, math.nextafter(v, math.inf), math.nextafter(v, 0.0)):
            out.extend((w, -w))
    return out


tau_values = st.one_of(
    st.sampled_from([0.0, 0.25, 0.1, 0.3, 0.4999, 2.0**-10, 2.0**-62]),
    st.builds(
        lambda i, e: float(i) * 2.0**-e,
        st.integers(min_value=0, max_value=2**52 - 1),
        st.integers(min_value=53, max_value=62),
    ),
)
float_lists = st.lists(st.floats(allow_nan=False), min_size=1, max_size=40)
pattern_lists = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=40).map(
    _from_bits
)
any_float_lists = st.one_of(float_lists, pattern_lists)
bits_values = st.integers(min_value=MIN_BITS, max_value=MAX_BITS)


# ---------------------------------------------------------------------------------------------------
# Against the reference
# ---------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(xs=any_float_lists, bits=bits_values, tau=tau_values)
def test_fused_kernels_matchReference_onRandomFloats(xs: list[float], bits: int, tau: float) -> None:
    x = _t(xs)
    rounded, trits = round_and_log(x, bits, tau)
    _assert_values(rounded, [ref_rnd(v, bits) for v in xs], xs, "rnd")
    assert trits.dtype == torch.uint8
    assert trits.tolist() == [ref_trit(v, bits, tau) for v in xs]
    _assert_values(rnd(x, bits), [ref_rnd(v, bits) for v in xs], xs, "rnd")
    assert torch.equal(round_and_log(x, bits, tau)[1], trits)  # deterministic


@settings(max_examples=300, deadline=None)
@given(xs=any_float_lists, bits=bits_values, data=st.data())
def test_roundWithLog_matchesReferenceRev_forEveryTrit(
    xs: list[float], bits: int, data: st.DataObject
) -> None:
    trit_list = data.draw(st.lists(st.integers(0, 2), min_size=len(xs), max_size=len(xs)))
    x = _t(xs)
    trits = torch.tensor(trit_list, dtype=torch.uint8)
    got, corrections = round_with_log(x, bits, trits)
    want = [ref_rev(v, bits, t) for v, t in zip(xs, trit_list, strict=True)]
    _assert_values(got, want, xs, "rev")
    own = [ref_rnd(v, bits) for v in xs]
    assert corrections == sum(not _same_bits(w, o) for w, o in zip(want, own, strict=True))
    assert torch.equal(rev(x, bits, trits).view(torch.int64), got.view(torch.int64))


@settings(max_examples=200, deadline=None)
@given(xs=any_float_lists, bits=bits_values)
def test_ulp_and_midpointDistance_matchReference(xs: list[float], bits: int) -> None:
    x = _t(xs)
    _assert_values(ulp(x, bits), [ref_ulp(v, bits) for v in xs], xs, "ulp", any_nan=True)
    md = midpoint_distance(x, bits)
    _assert_values(md, [ref_midpoint_distance(v, bits) for v in xs], xs, "midpoint_distance", any_nan=True)
    finite = md[torch.isfinite(x)]
    assert bool(((finite >= 0) & (finite <= 0.5)).all())


@pytest.mark.parametrize("bits", ALL_BITS)
def test_edgeCases_matchReference_everyBits(bits: int) -> None:
    xs = edge_cases(bits)
    x = _t(xs)
    for tau in (0.0, 0.25, 0.4999):
        rounded, trits = round_and_log(x, bits, tau)
        _assert_values(rounded, [ref_rnd(v, bits) for v in xs], xs, "rnd")
        assert trits.tolist() == [ref_trit(v, bits, tau) for v in xs]
    _assert_values(ulp(x, bits), [ref_ulp(v, bits) for v in xs], xs, "ulp", any_nan=True)
    _assert_values(
        midpoint_distance(x, bits), [ref_midpoint_distance(v, bits) for v in xs], xs, "md", any_nan=True
    )
    for t in (0, 1, 2):
        trits = torch.full_like(x, t, dtype=torch.uint8)
        _assert_values(rev(x, bits, trits), [ref_rev(v, bits, t) for v in xs], xs, f"rev[{t}]")


def test_reference_knowsTheEdges() -> None:
    """Pins the reference itself on hand-checked values, so a shared mistake cannot pass unseen."""
    assert ref_rnd(2.0**-150, 32) == 0.0
    assert ref_rnd(3 * 2.0**-150, 32) == 2 * 2.0**-149
    assert math.copysign(1.0, ref_rnd(-(2.0**-151), 32)) == -1.0
    assert ref_rnd(1.0 + 2.0**-24, 32) == 1.0
    assert ref_rnd(1.0 + 3 * 2.0**-24, 32) == 1.0 + 2.0**-22
    assert ref_rnd(1.0 + 2.0**-8, 16) == 1.0  # p = 7: tie, even below
    assert ref_rnd(2.0 - 2.0**-9, 16) == 2.0  # tie just below 2: carries up
    f32max = 3.4028234663852886e38
    assert ref_rnd(f32max, 32) == f32max
    assert ref_rnd(math.nextafter(f32max + 2.0**103, 0.0), 32) == f32max
    assert ref_rnd(f32max + 2.0**103, 32) == math.inf  # tie past the range: inf (max is odd)
    assert ref_trit(1.0 + 2.0**-24, 32, 0.25) == 0  # tie rounded down: logged
    assert ref_trit(1.0 + 2.0**-30, 32, 0.25) == 1  # near the grid point: ignored


# ---------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=60))
def test_bits32_equalsFloat32Cast(xs: list[float]) -> None:
    x = _t(xs)
    assert torch.equal(rnd(x, 32).view(torch.int64), x.to(torch.float32).to(torch.float64).view(torch.int64))


def test_bits32_equalsFloat32Cast_onManyRandomPatterns() -> None:
    gen = torch.Generator().manual_seed(7)
    patterns = torch.randint(-(2**63), 2**63 - 1, (200_000,), generator=gen, dtype=torch.int64)
    x = patterns.view(torch.float64)
    x = x[~torch.isnan(x)]
    assert torch.equal(rnd(x, 32).view(torch.int64), x.to(torch.float32).to(torch.float64).view(torch.int64))


@settings(max_examples=150, deadline=None)
@given(xs=any_float_lists, bits=bits_values)
def test_rnd_isIdempotent_andOnGrid(xs: list[float], bits: int) -> None:
    r = rnd(_t(xs), bits)
    assert torch.equal(rnd(r, bits).view(torch.int64), r.view(torch.int64))
    in_place = _t(xs)
    round_(in_place, bits)
    assert torch.equal(in_place.view(torch.int64), r.view(torch.int64))
    assert is_on_grid(r, bits) == (not bool(torch.isnan(r).any()))
    coarser = rnd(r, max(MIN_BITS, bits - 1))
    assert is_on_grid(coarser, bits) or bool(torch.isnan(coarser).any())


def _f32_magnitude_pattern(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).view(torch.int32).to(torch.int64) & 0x7FFFFFFF


@settings(max_examples=200, deadline=None)
@given(xs=float_lists, bits=bits_values, data=st.data())
def test_rev_movesOneGridStep_onlyWhenDirectionsDisagree(
    xs: list[float], bits: int, data: st.DataObject
) -> None:
    trit_list = data.draw(st.lists(st.integers(0, 2), min_size=len(xs), max_size=len(xs)))
    x = _t(xs)
    trits = torch.tensor(trit_list, dtype=torch.uint8)
    own = rnd(x, bits)
    got, corrections = round_with_log(x, bits, trits)
    moved = got.view(torch.int64) != own.view(torch.int64)
    own_up, own_down = own > x, own < x
    disagree = ((trits == 0) & own_up) | ((trits == 2) & own_down)
    assert torch.equal(moved, disagree)
    assert corrections == int(disagree.sum())
    step = _f32_magnitude_pattern(got) - _f32_magnitude_pattern(own)
    assert bool((step[moved].abs() == 1 << (32 - bits)).all())
    assert bool((torch.signbit(got) == torch.signbit(x)).all())
    # The corrected value lies on the trainer's side of x, and is on the grid.
    assert bool((got[moved & (trits == 0)] < x[moved & (trits == 0)]).all())
    assert bool((got[moved & (trits == 2)] > x[moved & (trits == 2)]).all())
    assert is_on_grid(got, bits)


@settings(max_examples=150, deadline=None)
@given(xs=float_lists, bits=bits_values, tau=tau_values)
def test_auditor_reproducesTrainer_fromItsOwnLog(xs: list[float], bits: int, tau: float) -> None:
    x = _t(xs)
    rounded, trits = round_and_log(x, bits, tau)
    replay, corrections = round_with_log(x, bits, trits)
    assert torch.equal(replay.view(torch.int64), rounded.view(torch.int64))
    assert corrections == 0


def test_auditor_followsTrainer_acrossAMidpoint() -> None:
    """Trainer's value just below a midpoint, auditor's just above: the log makes them agree."""
    bits = 24
    mid = 1.0 + 2.0 ** -(bits - 9) / 2
    trainer_x = _t([math.nextafter(mid, 0.0), -math.nextafter(mid, 0.0)])
    auditor_x = _t([math.nextafter(mid, 2.0), -math.nextafter(mid, 2.0)])
    trainer_r, trits = round_and_log(trainer_x, bits, 0.25)
    assert trits.tolist() == [0, 2]
    assert not torch.equal(rnd(auditor_x, bits), trainer_r)
    auditor_r, corrections = round_with_log(auditor_x, bits, trits)
    assert torch.equal(auditor_r, trainer_r)
    assert corrections == 2


def test_shapes_strides_andInPlace() -> None:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, dtype=torch.float64, generator=gen) * 1e-39  # straddles 2**-126
    x = base.t()  # non-contiguous
    r, trits = round_and_log(x, 20, 0.25)
    assert r.shape == x.shape and trits.shape == x.shape
    assert torch.equal(r, rnd(x.contiguous(), 20))
    y = x.clone()
    assert round_(y, 20) is y
    assert torch.equal(y, r)
    view = base[:, ::2]
    before = base.clone()
    round_(view, 18)
    assert torch.equal(base[:, ::2], rnd(before[:, ::2], 18))
    assert torch.equal(base[:, 1::2], before[:, 1::2])
    empty = torch.empty(0, 3, dtype=torch.float64)
    assert rnd(empty, 16).shape == (0, 3)
    assert round_with_log(empty, 16, torch.empty(0, 3, dtype=torch.uint8))[1] == 0


def test_requiresGrad_isAccepted() -> None:
    x = torch.tensor([1.0 + 2.0**-30], dtype=torch.float64, requires_grad=True)
    assert rnd(x, 32).item() == 1.0
    round_(x, 32)
    assert x.item() == 1.0 and x.requires_grad


@pytest.mark.parametrize("bits", [15, 33, 0, True, 24.0])
def test_badBits_isConfigError(bits: object) -> None:
    with pytest.raises(ConfigError):
        rnd(_t([1.0]), bits)  # type: ignore[arg-type]


@pytest.mark.parametrize("tau", [-0.1, 0.5, 0.7, math.nan, 1e-30])
def test_badTau_isConfigError(tau: float) -> None:
    with pytest.raises(ConfigError):
        round_and_log(_t([1.0]), 24, tau)


def test_nonFloat64_isRejected() -> None:
    with pytest.raises(TrainingError, match="float64"):
        rnd(torch.ones(3, dtype=torch.float32), 24)
    with pytest.raises(TrainingError, match="shaped like"):
        round_with_log(_t([1.0, 2.0]), 24, torch.ones(3, dtype=torch.uint8))
    with pytest.raises(TrainingError, match="got 3"):
        round_with_log(_t([1.0, 2.0]), 24, torch.tensor([0, 3], dtype=torch.uint8))


def test_checkValues_refusesNaN_andOverflow_namingWhere_andLetsInfinityPass() -> None:
    check_values(_t([1.0, -0.0, 3e38]), 32, "step 1, op aten.mm")
    check_values(torch.empty(0, dtype=torch.float64), 32, "empty")
    check_values(torch.arange(5), 32, "integers")
    with pytest.raises(NonFiniteError, match=r"step 12, op aten\.mm.*1 NaN, 2 inf"):
        check_values(_t([math.nan, math.inf, -math.inf, 1.0]), 32, "step 12, op aten.mm")
    with pytest.raises(NonFiniteError, match=r"1 NaN, 0 inf out of 3"):
        check_values(_t([1.0, math.nan, 2.0]), 32, "x")
    # an inf is exact (its own rounding): it passes, and the top is the largest finite magnitude
    assert check_values(torch.tensor([1.0, -math.inf], dtype=torch.float32), 32, "y") == 1.0
    assert check_values(_t([math.inf, -2.5, -math.inf]), 32, "y") == 2.5
    assert check_values(_t([math.inf, -math.inf]), 32, "y") == 0.0
    # a finite value that rounds to inf is an overflow, refused where it is made, on the 32-bit grid
    # and on a narrower one, inf beside it or not; just short of that it rounds to the largest
    below = 2.0**128 - 2.0**103 - 2.0**75  # float64's next value down from float32's overflow point
    assert check_values(_t([below, -1.0]), 32, "w") == below
    assert rnd(_t([below]), 32).item() == rounding.FLOAT32_MAX
    with pytest.raises(NonFiniteError, match=r"overflow at step 3, op aten\.exp.* 1 finite value"):
        check_values(_t([1.0, 2.0**128]), 32, "step 3, op aten.exp")
    assert check_values(_t([-math.inf, 3.4028e38, -3.4028e38]), 32, "z") == 3.4028e38
    with pytest.raises(NonFiniteError, match=r"overflow at z: 2 finite"):
        check_values(_t([-math.inf, 3.4028e38, -3.4028e38]), 24, "z")


def test_isOnGrid_rejectsNaN_andOffGridValues() -> None:
    assert is_on_grid(_t([0.0, -0.0, 1.0, math.inf, -math.inf]), 16)
    assert not is_on_grid(_t([1.0, math.nan]), 16)
    assert not is_on_grid(_t([1.0 + 2.0**-20]), 24)
    assert is_on_grid(_t([1.0 + 2.0**-20]), 32)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matchesCpu_bitForBit() -> None:
    gen = torch.Generator().manual_seed(11)
    patterns = torch.randint(-(2**63), 2**63 - 1, (1_000_000,), generator=gen, dtype=torch.int64)
    x = patterns.view(torch.float64)
    trits_in = torch.randint(0, 3, x.shape, generator=gen, dtype=torch.uint8)
    for bits in (16, 23, 32):
        r_cpu, t_cpu = round_and_log(x, bits, 0.25)
        r_gpu, t_gpu = round_and_log(x.cuda(), bits, 0.25)
        assert torch.equal(r_gpu.cpu().view(torch.int64), r_cpu.view(torch.int64))
        assert torch.equal(t_gpu.cpu(), t_cpu)
        v_cpu, n_cpu = round_with_log(x, bits, trits_in)
        v_gpu, n_gpu = round_with_log(x.cuda(), bits, trits_in.cuda())
        assert torch.equal(v_gpu.cpu().view(torch.int64), v_cpu.view(torch.int64))
        assert n_gpu == n_cpu


@pytest.mark.parametrize("bits", [16, 23, 32])
def test_kernels_agree_onManyRandomPatterns(bits: int) -> None:
    """200k raw bit patterns (half of them far below 2**-126): the fast and the exact lanes together."""
    gen = torch.Generator().manual_seed(bits)
    x = torch.randint(-(2**63), 2**63 - 1, (200_000,), generator=gen, dtype=torch.int64).view(torch.float64)
    x = torch.cat([x, x * 2.0**-100, x.to(torch.float32).to(torch.float64) * (1 + 2.0**-30)])
    rounded, trits = round_and_log(x, bits, 0.25)
    assert torch.equal(rounded.view(torch.int64), rnd(x, bits).view(torch.int64))
    assert torch.equal(trits, round_and_log(x, bits, 0.25)[1])
    # Asking every logged value for the other side moves exactly those, one grid step each.
    flipped = torch.where(trits == 1, trits, 2 - trits)
    moved, corrections = round_with_log(x, bits, flipped)
    changed = moved.view(torch.int64) != rounded.view(torch.int64)
    assert torch.equal(changed, trits != 1)
    assert corrections == int((trits != 1).sum())
    step = _f32_magnitude_pattern(moved) - _f32_magnitude_pattern(rounded)
    assert bool((step[changed].abs() == 1 << (32 - bits)).all())
    same, none = round_with_log(x, bits, trits)
    assert torch.equal(same.view(torch.int64), rounded.view(torch.int64)) and none == 0


# ---------------------------------------------------------------------------------------------------
# The float32 grid through the hardware conversion
# ---------------------------------------------------------------------------------------------------


def test_bits32_fastPath_equalsIntegerPath_onRandomPatterns() -> None:
    g = torch.Generator().manual_seed(11)
    raw = torch.randint(-(2**63), 2**63 - 1, (200_000,), dtype=torch.int64, generator=g)
    exps = torch.randint(1023 - 160, 1023 + 130, (200_000,), generator=g)  # around float32's range
    patterns = (raw & ((1 << 52) - 1) | (raw & (1 << 63))) | (exps << 52)
    x = patterns.view(torch.float64)
    x = x[torch.isfinite(x) & (x.abs() <= torch.finfo(torch.float32).max)]
    assert rounding.fast_float32(x, 32)
    fast = rnd(x, 32)
    integer = rnd(x, 32, top=math.inf)  # a top past the range forces the integer path
    assert torch.equal(fast.view(torch.int64), integer.view(torch.int64))
    y = x.clone()
    round_(y, 32)
    assert torch.equal(y.view(torch.int64), integer.view(torch.int64))


def test_conversionProbe_expectsIEEE_evenWhenFirstWorkedOutUnderFlushToZero() -> None:
    """The probe's expected bits are worked out once, by the first probe of the process: they must be
    IEEE's round-to-nearest-even with gradual underflow (the exact reference and Python's own
    float32 packing), whatever mode the thread was in then."""
    torch.set_flush_denormal(True)  # where the CPU has no such mode this is the plain case
    try:
        rounding._probe.cache_clear()
        probe, want = rounding._probe()
    finally:
        torch.set_flush_denormal(False)
        rounding._probe.cache_clear()
        rounding.recheck_conversion()
    values = probe.tolist()
    assert len(values) == 2 * len(rounding._PROBE_VALUES)
    assert any(0 < abs(v) < 2.0**-126 for v in values)  # subnormal float32 results are probed
    expected = [ref_rnd(v, 32) for v in values]
    assert want.tolist() == _t(expected).view(torch.int64).tolist()
    packed = [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]
    assert want.tolist() == _t(packed).view(torch.int64).tolist()


def test_bits32_flushToZero_isSeen_andTheIntegerPathUsed() -> None:
    subnormal = [2.0**-140 * 1.3, -(2.0**-149) * 1.5, 2.0**-127 * 3]
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        rounding.recheck_conversion()
        assert not rounding.conversion_exact(torch.device("cpu"))
        _assert_values(rnd(_t(subnormal), 32), [ref_rnd(v, 32) for v in subnormal], subnormal, "rnd")
    finally:
        torch.set_flush_denormal(False)
        rounding.recheck_conversion()
    assert rounding.conversion_exact(torch.device("cpu"))


def test_checkValues_returnsTheLargestMagnitude() -> None:
    assert check_values(_t([1.5, -3.25, 0.0]), 32, "here") == 3.25
    assert check_values(torch.empty(0, dtype=torch.float64), 32, "here") == 0.0


@pytest.mark.parametrize("bits", [32, 24])
def test_anExactResultsFloat64Max_goesToTheGridsLargest_andRndStaysIEEE(bits: int) -> None:
    """``torch.finfo(torch.float64).min`` is a model's "most negative finite number" (its attention
    masks): in an exact op's result (``round_(sentinel=True)``) it becomes the grid's largest, as a
    float32 model's ``finfo(torch.float32).min`` is, and not -inf. Anything else past the range, and
    :func:`rnd` itself, round as IEEE does."""
    big = float(torch.finfo(torch.float64).max)
    x = _t([big, -big, math.nextafter(big, 0.0), 1e300, -math.inf, 1.5, 0.1])
    plain = rnd(x, bits)
    sentinel = x.clone()
    round_(sentinel, bits, sentinel=True)
    largest = rounding.grid_max(bits)
    assert sentinel[:2].tolist() == [largest, -largest] and plain[:2].tolist() == [math.inf, -math.inf]
    assert torch.equal(sentinel[2:].view(torch.int64), plain[2:].view(torch.int64))
    assert is_on_grid(sentinel[:2], bits)
    strided = torch.stack([x, x], 1)[:, 0]  # a layout the in-place kernels do not take
    round_(strided, bits, sentinel=True)
    assert torch.equal(strided.view(torch.int64), sentinel.view(torch.int64))
