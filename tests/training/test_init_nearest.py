"""Inexact ops at a model's construction that every machine can agree on: IEEE arithmetic and libm's
functions rounded to nearest float32 in float64 as in float32 (a sinusoid table: GPT-J, CodeGen),
values near a rounding boundary worked out again exactly; a 2-norm, and the weight norm built on it,
served by an exact sum (Wav2Vec2). Each was refused before."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction

import mpmath
import pytest
import torch
from torch import Tensor, nn

from game.errors import UnsupportedOpError
from game.training.dispatch import nearest
from game.training.dispatch.initmode import InitMode, init_module
from game.training.dispatch.initrules import exact_float32
from game.training.numerics import rounding


def r24(v: object) -> float:
    """``v`` (an mpmath number, or anything it takes) rounded to float32, half to even."""
    with mpmath.workprec(24):
        return float(+mpmath.mpf(v))  # type: ignore[arg-type]


def test_aFloat64SinusoidTable_isEachOpRoundedToNearestFloat32() -> None:
    """GPT-J's and CodeGen's ``create_sinusoidal_positions``, under construction's float64 default
    dtype: a division, a power, a reciprocal, a sine and a cosine, each rounded to nearest float32
    as it is made, the same as working each out exactly (the product with a float32 tensor between
    them is exact, and passes as it is)."""
    dim, positions = 8, 40
    with InitMode(0):
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
        angles = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq
        table = torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)
    assert table.dtype == torch.float64 and table.shape == (positions, dim)
    with mpmath.workprec(320):
        inv = [r24(1 / mpmath.mpf(r24(mpmath.power(10000, r24(mpmath.mpf(i) / dim))))) for i in range(0, dim, 2)]  # fmt: skip
        want = []
        for p in range(positions):
            a = [p * f for f in inv]  # exact (30 bits): passes as it is
            want.append([r24(mpmath.sin(x)) for x in a] + [r24(mpmath.cos(x)) for x in a])
    assert table.tolist() == want


def _near_boundary_sines(count: int) -> torch.Tensor:
    """Inputs whose float64 sine torch puts within :data:`nearest.MARGIN` of a float32 ulp of a
    rounding boundary (found among random ones: some one in half a million is)."""
    g = torch.Generator().manual_seed(5)
    found = []
    while sum(len(f) for f in found) < count:
        x = torch.rand(1 << 22, dtype=torch.float64, generator=g) * 8 - 4
        near = rounding.midpoint_distance(x.sin(), rounding.MAX_BITS) <= nearest.MARGIN
        found.append(x[near])
    return torch.cat(found)[:count]


def test_aValueNearABoundary_isWorkedOutAgain_toTheCorrectlyRoundedFloat32() -> None:
    """Where torch's float64 value is too near a boundary for every machine to round it alike, the
    value is worked out again in 320-bit arithmetic: the float32 of the true sine, not a refusal
    (some one value in half a million lies that near: a table of 65,536 values holds one about one
    time in eight)."""
    near = _near_boundary_sines(3)
    x = torch.cat((near, torch.tensor([0.5, -1.25, 3.0], dtype=torch.float64)))
    with InitMode(0):
        got = x.sin()
        inplace = x.clone().sin_()
    with mpmath.workprec(320):
        want = [r24(mpmath.sin(mpmath.mpf(v))) for v in x.tolist()]
    assert got.tolist() == want and inplace.tolist() == want


def test_aTieOfTheTrueValue_roundsHalfToEven() -> None:
    """``pow(x, 0.5)`` of ``x = (1 + 2**-24)**2`` is exactly halfway between two float32 values:
    it was refused as a tie; the true value rounds half to even (to 1)."""
    x = torch.tensor([(1 + 2**-24) ** 2, (1 + 3 * 2**-24) ** 2], dtype=torch.float64)
    with InitMode(0):
        got = x.pow(0.5)
    assert got.tolist() == [1.0, 1 + 2**-22]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_aHalfPrecisionOp_atConstruction_isTheNearestFloat32Converted(dtype: torch.dtype) -> None:
    """Apertus builds its activation's parameters in bfloat16 (``log(expm1(0.8))``): such an op was
    refused at construction. It is run on its float64 twin, rounded to nearest float32 as a float32
    op's, and converted (IEEE, the same everywhere), as torch computes it: in float32, then
    converted. In place too."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(4096, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)
    with InitMode(0):
        got = x.exp()
        inplace = x.clone().sin_()
        chained = torch.log(torch.expm1(torch.tensor(0.8, dtype=dtype)))
    wide = x.to(torch.float64)
    assert got.dtype == inplace.dtype == chained.dtype == dtype
    assert torch.equal(got, rounding.rnd(wide.exp(), rounding.MAX_BITS).to(dtype))
    assert torch.equal(inplace, rounding.rnd(wide.sin(), rounding.MAX_BITS).to(dtype))
    first = rounding.rnd(torch.tensor(0.8, dtype=dtype).double().expm1(), rounding.MAX_BITS).to(dtype)
    assert chained == rounding.rnd(first.double().log(), rounding.MAX_BITS).to(dtype)


def test_theArgumentsKeptBeforeAnOp_areCopiedOnlyWhereTheOpWritesOne() -> None:
    """What a value near a boundary is worked out again from: an in-place op's arguments as they
    were before it overwrote them (copies), an out-of-place op's as they are (no copy)."""
    x = torch.tensor([0.5, 1.5], dtype=torch.float32)
    (kept,), _ = nearest.before(torch.ops.aten.sin.default, (x,), {})
    assert kept is x
    (copied,), _ = nearest.before(torch.ops.aten.sin_.default, (x,), {})
    x.sin_()
    assert copied.dtype == torch.float64 and copied.tolist() == [0.5, 1.5]


def test_linspaceInFloat32_atATie_roundsHalfToEven_whereItWasRefused() -> None:
    """``torch.linspace`` in float32 at construction: each exact value rounded once to float32. A
    value halfway between two float32 values (``1 + 2**-24``), or within the margin of one, was
    refused as one another machine could round otherwise; it is a rational, and rounds exactly."""
    tie, tie_up = 1 + 2**-24, 1 + 3 * 2**-24
    with InitMode(0):
        got = torch.linspace(0.0, tie, 2, dtype=torch.float32)
        up = torch.linspace(-tie_up, tie_up, 3, dtype=torch.float32)
        thirds = torch.linspace(0.0, 1.0, 4, dtype=torch.float32)
    assert got.tolist() == [0.0, 1.0]
    assert up.tolist() == [-(1 + 2**-22), 0.0, 1 + 2**-22]
    assert thirds.tolist() == [0.0, *(float(torch.tensor(k / 3, dtype=torch.float32)) for k in (1, 2)), 1.0]


@pytest.mark.parametrize("seed", range(4))
def test_exactFloat32_isTheNearestFloat32_halfToEven(seed: int) -> None:
    """Rationals of every size rounded to float32 exactly: no float32 lies nearer, and of two as near
    the one with an even significand is taken."""
    rng = random.Random(seed)
    for _ in range(2_000):
        q = Fraction(rng.randint(-(10**15), 10**15), rng.randint(1, 10**15)) * Fraction(2) ** rng.randint(
            -80, 80
        )
        r = exact_float32(q)
        assert r is not None and float(torch.tensor(r, dtype=torch.float32)) == r
        err = abs(Fraction(r) - q)
        for side in (math.inf, -math.inf):
            other = float(torch.nextafter(torch.tensor(r, dtype=torch.float32), torch.tensor(side)))
            assert err < abs(Fraction(other) - q) or (err == abs(Fraction(other) - q) and _even(r))
    for m in range(1 << 23, (1 << 23) + 64):  # every tie between two neighbours: to the even one
        assert exact_float32(Fraction(2 * m + 1, 1 << 24)) == (m + (m & 1)) / (1 << 23)
    assert exact_float32(Fraction(0)) == 0.0
    assert exact_float32(Fraction(2) ** 128) is None and exact_float32(Fraction(1, 2**130)) is None


def _even(r: float) -> bool:
    return int(torch.tensor(r, dtype=torch.float32).view(torch.int32)) % 2 == 0


def test_anOpNotAmongTheLibmGradeOnes_isStillRefused() -> None:
    """``erfinv`` is Newton steps on ``erf``: a last-ulp difference there moves it by more than
    any margin, so it is refused, naming it."""
    with pytest.raises(UnsupportedOpError, match=r"erfinv.*reached table"):
        init_module(lambda: _Holding(lambda: torch.full((3,), 0.999999).erfinv()), seed=0)


class _Holding(nn.Module):
    """A module that keeps what ``make`` computes at construction as a buffer."""

    def __init__(self, make: Callable[[], Tensor]) -> None:
        super().__init__()
        self.register_buffer("table", make())


def _exact_norm(values: list[float]) -> float:
    """The 2-norm as the rule defines it: the sum of squares exactly, rounded once, then its IEEE
    square root."""
    return math.sqrt(float(sum(Fraction(v) ** 2 for v in values)))


@pytest.mark.parametrize("threads", [1, 2])
def test_aWeightNorm_atConstruction_isTheExactNorm(threads: int) -> None:
    """Wav2Vec2's positional convolution takes a weight norm over every dim but the kernel's: its
    norm is the exact sum's, the same whatever the thread count, and the weight it gives back is
    ``v * (g / n)`` in IEEE arithmetic."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        conv = init_module(lambda: nn.utils.parametrizations.weight_norm(nn.Conv1d(6, 4, 5), dim=2), seed=3)
    finally:
        torch.set_num_threads(before)
    g = conv.parametrizations.weight.original0.detach()
    v = conv.parametrizations.weight.original1.detach()
    assert g.shape == (1, 1, 5)
    want = [_exact_norm(v[:, :, k].reshape(-1).tolist()) for k in range(5)]
    assert g.reshape(-1).tolist() == want
    with InitMode(3):
        w, n = torch._weight_norm_interface(v, g, 2)
    assert n.reshape(-1).tolist() == want and torch.equal(w, v * (g / n))


def test_aVectorNorm_isServed_andAnotherOrderRefused() -> None:
    x = torch.linspace(-3, 5, 24, dtype=torch.float64).reshape(4, 6) * 0.37
    with InitMode(0):
        got = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        whole = x.norm()
    assert got.shape == (4, 1)
    assert got.reshape(-1).tolist() == [_exact_norm(row) for row in x.tolist()]
    assert whole.item() == _exact_norm(x.reshape(-1).tolist())
    with pytest.raises(UnsupportedOpError, match=r"norm.*reached table"):
        init_module(lambda: _Holding(lambda: torch.linalg.vector_norm(x, ord=3)), seed=0)
