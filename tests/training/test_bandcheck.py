"""Band kernels: honest sparse logs replay on other hardware; entries outside the band are caught.

The reference for "distance to a midpoint" is exact rational arithmetic (``fractions.Fraction``), and
the other machine is simulated by a bounded relative perturbation of every value, well inside the
band (the calibration's margin is 16x the measured divergence).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.numerics import bandcheck, logtrits, rounding
from game.training.numerics.bandfile import Band

BAND = Band(-35, -46)  # the shipped bands' typical entry: 2**-35 of the value's binade, 2**-46 of the top


def _ulp64(x: float) -> Fraction:
    return Fraction(2) ** (math.frexp(x)[1] - 1 - 52)


def _reference_distance(x: float, bits: int) -> Fraction:
    """|x - nearest midpoint| in float64 ulps of x, exactly (normal range only)."""
    u = Fraction(rounding.ulp(torch.tensor([x], dtype=torch.float64), bits).item())
    fx = Fraction(x)
    lo = (abs(fx) // u) * u
    mid = lo + u / 2
    return abs(abs(fx) - mid) / _ulp64(x)


def _mixed_values(n: int, seed: int, bits: int = 32) -> torch.Tensor:
    """Grid values, exact midpoints (ties), values near midpoints, random values, tiny values."""
    g = torch.Generator().manual_seed(seed)
    base = rounding.rnd(torch.randn(n, dtype=torch.float64, generator=g), bits)
    u = rounding.ulp(base, bits)
    kind = torch.randint(0, 5, (n,), generator=g)
    near = (torch.rand(n, dtype=torch.float64, generator=g) - 0.5) * 2.0**-20
    x = torch.where(kind == 0, base, base + u / 2)  # on the grid / exactly on a midpoint
    x = torch.where(kind == 2, base + u * (0.5 + near), x)  # within ~2**-20 ulp of a midpoint
    x = torch.where(kind == 3, base + u * torch.rand(n, dtype=torch.float64, generator=g), x)
    x = torch.where(kind == 4, (base + u / 2) * 2.0**-30, x)  # 30 binades below the top: the floor
    return x


def _perturb(x: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(x.shape, dtype=torch.float64, generator=g) * 2 - 1
    return x * (1 + u * rel)


# --------------------------------------------------------------------------------------------------
# geometry against the exact reference
# --------------------------------------------------------------------------------------------------


def test_geometry_distance_matchesExactReference() -> None:
    x = _mixed_values(400, seed=1)
    geo = bandcheck.geometry(x.view(torch.int64), 32, BAND)
    for i in range(x.numel()):
        v = float(x[i])
        if v == 0.0 or abs(v) < 2.0**-126:
            continue
        assert int(geo.distance[i]) == _reference_distance(v, 32), v
        assert bool(geo.off[i]) == (rounding.rnd(x[i : i + 1], 32).item() != v)


def test_geometry_band_isRelativePlusFloor_cappedAtAnEighthStep() -> None:
    x = torch.tensor([1.5, 1.5 * 2.0**-10, 1.5 * 2.0**-40], dtype=torch.float64)
    geo = bandcheck.geometry(x.view(torch.int64), 32, BAND)
    half = 1 << (52 - 23 - 1)
    # top binade e(S) = 0: rel 2**(52-35) plus a floor of 2**(52-46+0-e(x)) ulps of x
    assert int(geo.band[0]) == 2**17 + 2**6
    assert int(geo.band[1]) == 2**17 + 2**16
    assert int(geo.band[2]) == half >> 2  # the floor would exceed the cap


# --------------------------------------------------------------------------------------------------
# honest logs replay on another machine
# --------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([32, 28, 26]), sign=st.sampled_from([1.0, -1.0]))
def test_honestLog_replaysBitExact_underDivergenceInsideTheBand(seed: int, bits: int, sign: float) -> None:
    x_t = _mixed_values(2000, seed, bits) * sign
    # the other machine: relative 2**-40 (the band is 2**-35 of the binade: 32x that)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    rounded_t, positions = bandcheck.round_and_band(x_t, bits, BAND)
    assert torch.equal(rounded_t.view(torch.int64), rounding.rnd(x_t, bits).view(torch.int64))
    replayed, corrections, _ = bandcheck.round_with_entries(x_a, bits, BAND, positions)
    assert torch.equal(replayed.view(torch.int64), rounded_t.view(torch.int64))
    plain = rounding.rnd(x_a, bits)
    assert corrections == int((plain.view(torch.int64) != rounded_t.view(torch.int64)).sum())


def test_exactTies_costNoEntry_andDefaultToEven() -> None:
    base = rounding.rnd(torch.linspace(1.0, 2.0, 1001, dtype=torch.float64), 32)
    ties = base + rounding.ulp(base, 32) / 2
    _, positions = bandcheck.round_and_band(ties, 32, BAND)
    assert positions.numel() == 0  # RNE sends every tie to the even neighbour: nothing to list
    pushed = _perturb(ties, 2.0**-40, 7)  # the auditor's noisy copies land on both sides
    replayed, corrections, _ = bandcheck.round_with_entries(pushed, 32, BAND, positions)
    assert torch.equal(replayed, rounding.rnd(ties, 32)) and corrections > 0


def test_onGridForTrainer_justOffForAuditor_roundsToThatGridPoint() -> None:
    # tiny values in a tensor with a large top: the floor band is capped, so the zone stays away
    # from grid points (a trainer's exact grid value is never pulled to its even neighbour)
    grid = rounding.rnd(torch.randn(500, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), 32)
    x_t = torch.cat([torch.tensor([1e6], dtype=torch.float64), grid * 2.0**-35])
    x_a = _perturb(x_t, 2.0**-40, 4)
    _, positions = bandcheck.round_and_band(x_t, 32, BAND)
    replayed, _, _ = bandcheck.round_with_entries(x_a, 32, BAND, positions)
    assert torch.equal(replayed.view(torch.int64), x_t.view(torch.int64))


# --------------------------------------------------------------------------------------------------
# tampering: entries inside the band move one value one step; entries outside are caught
# --------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 8))
def test_tamperInsideBand_noError_movesOnlyThoseValuesOneStep(seed: int, k: int) -> None:
    x_t = _mixed_values(3000, seed)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    honest_r, honest_pos = bandcheck.round_and_band(x_t, 32, BAND)
    geo = bandcheck.geometry(x_a.view(torch.int64), 32, BAND)
    inside = (geo.off & (geo.distance <= (geo.band << 4))).nonzero().squeeze(1)
    inside = inside[~torch.isin(inside, honest_pos)]
    pick = inside[torch.randperm(inside.numel(), generator=torch.Generator().manual_seed(seed))[:k]]
    tampered = torch.cat([honest_pos, pick]).unique()
    out, _, _ = bandcheck.round_with_entries(x_a, 32, BAND, tampered)
    changed = (out.view(torch.int64) != honest_r.view(torch.int64)).nonzero().squeeze(1)
    assert set(changed.tolist()) <= set(pick.tolist())
    # each changed value moved exactly one grid step (to the odd neighbour), nothing else changed
    step = rounding.ulp(honest_r[changed], 32)
    assert torch.equal((out[changed] - honest_r[changed]).abs(), step)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_tamperOutsideBand_isDetected_withTheIndex(seed: int) -> None:
    x_t = _mixed_values(3000, seed)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    _, honest_pos = bandcheck.round_and_band(x_t, 32, BAND)
    geo = bandcheck.geometry(x_a.view(torch.int64), 32, BAND)
    outside = (geo.distance > (geo.band << 4)).nonzero().squeeze(1)
    bad = int(outside[torch.randint(0, outside.numel(), (1,), generator=torch.Generator().manual_seed(seed))])
    with pytest.raises(bandcheck.BandViolation) as info:
        bandcheck.round_with_entries(x_a, 32, BAND, torch.cat([honest_pos, torch.tensor([bad])]).unique())
    assert info.value.kind == "outside" and info.value.index == bad


@pytest.mark.parametrize("bad", [-1, 3000, 10**9])
def test_positionOutOfRange_isDetected(bad: int) -> None:
    x = _mixed_values(3000, 5)
    with pytest.raises(bandcheck.BandViolation) as info:
        bandcheck.round_with_entries(x, 32, BAND, torch.tensor(sorted([0, bad])))
    assert info.value.kind == "position"


def test_unorderedPositions_areRefused() -> None:
    x = _mixed_values(100, 6)
    with pytest.raises(bandcheck.BandViolation, match="increasing"):
        bandcheck.round_with_entries(x, 32, BAND, torch.tensor([5, 3]))


def test_packedCorrection_farFromMidpoint_isDetected() -> None:
    x = torch.tensor([1.0 + 2.0**-30], dtype=torch.float64)  # a hair above a grid point: far from a midpoint
    trits = torch.tensor([logtrits.TRIT_UP], dtype=torch.uint8)  # "it went up": a lie
    moved, changed = logtrits.round_with_log_changes(x, 32, trits)
    assert bool(changed.all()) and moved.item() > 1.0
    with pytest.raises(bandcheck.BandViolation) as info:
        bandcheck.check_corrections(x, 32, BAND, changed)
    assert info.value.kind == "outside" and info.value.index == 0


def test_violation_isReportedWithStepOpAndIndex() -> None:
    err = bandcheck.BandViolation("outside", 17, "far").at(4, 12, "aten.mm.default")
    assert isinstance(err, bandcheck.LogTamperingError)
    assert (err.step, err.op, err.index, err.kind) == (4, "aten.mm.default", 17, "outside")
    assert "step 4" in str(err) and "op #12 aten.mm.default" in str(err) and "value 17" in str(err)


def test_rareLanes_subnormalRange_replayConsistently() -> None:
    x_t = torch.tensor([3e-39, -7e-40, 1e-45, 2.0**-126, 1.0], dtype=torch.float64)
    x_a = _perturb(x_t, 2.0**-40, 9)
    r_t, pos = bandcheck.round_and_band(x_t, 32, BAND)
    r_a, _, _ = bandcheck.round_with_entries(x_a, 32, BAND, pos)
    assert torch.equal(r_t.view(torch.int64), r_a.view(torch.int64))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([32, 26]), where=st.sampled_from([None, "op"]))
def test_anInf_isItsOwnRounding_widensNoBand_andNoEntryCanMoveIt(
    seed: int, bits: int, where: str | None
) -> None:
    # ±inf beside finite values (a log of 0): the finite lanes round and list exactly as without
    # them (the band's top is the largest finite value), the infs stay as they are, the auditor's
    # replay gives the same bits, and a log that lists an inf lane, or corrects one, is refused
    x = _mixed_values(2000, seed, bits)
    infs = torch.tensor([math.inf, -math.inf, math.inf], dtype=torch.float64)
    x_t = torch.cat([x, infs])
    r, pos = bandcheck.round_and_band(x, bits, BAND)
    r_t, pos_t = bandcheck.round_and_band(x_t, bits, BAND, where=where)
    assert torch.equal(pos_t, pos)
    assert torch.equal(r_t.view(torch.int64), torch.cat([r, infs]).view(torch.int64))
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    replayed, _, _ = bandcheck.round_with_entries(x_a, bits, BAND, pos_t, where=where)
    assert torch.equal(replayed.view(torch.int64), r_t.view(torch.int64))
    with pytest.raises(bandcheck.BandViolation) as info:
        bandcheck.round_with_entries(x_a, bits, BAND, torch.cat([pos_t, torch.tensor([x.numel() + 1])]))
    assert info.value.kind == "outside" and info.value.index == x.numel() + 1
    trits = torch.full((x_t.numel(),), logtrits.TRIT_IGNORE, dtype=torch.uint8)
    trits[x.numel() :] = logtrits.TRIT_UP
    moved, changed = logtrits.round_with_log_changes(x_t, bits, trits)
    assert not bool(changed.any()) and torch.equal(moved.view(torch.int64), r_t.view(torch.int64))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    widen=st.sampled_from([0, 2, 4]),
    rel=st.integers(-50, -20),
    gap=st.integers(-4, 20),
    bits=st.sampled_from([32, 28, 26, 16]),
)
def test_within_equalsTheFullGeometry(seed: int, widen: int, rel: int, gap: int, bits: int) -> None:
    # the two-pass candidate search must find exactly the lanes the definition names
    band = Band(rel, max(min(rel - gap, -2), -60))
    x = torch.cat([_mixed_values(3000, seed, bits), torch.tensor([0.0, -0.0, 1e-40, 3e38, 1e300])])
    xf = x.view(torch.int64)
    top = bandcheck.top_binade(xf)
    geo = bandcheck.geometry(xf, bits, band)
    want = (geo.off & (geo.distance <= (geo.band << widen))).nonzero().squeeze(1)
    got, sub = bandcheck.within(xf, bits, band, widen, top)
    assert torch.equal(got, want)
    assert torch.equal(sub.distance, geo.distance[want]) and torch.equal(sub.band, geo.band[want])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([32, 28, 26]), extra=st.sampled_from([0, 1, 2]))
def test_roundAndBand_listsExactlyTheOddRoundedLanesNearAMidpoint(seed: int, bits: int, extra: int) -> None:
    # the parity shortcut (last kept mantissa bit) must agree with the grid neighbours, rare lanes included
    tails = [
        [],
        [3e-39, -7e-40, 1e-45, 2.0**-126 * (1 - 2.0**-25), -(2.0**-149) * 1.5],  # float32-subnormal range
        [3.3e38, -1e39, 2.0**128],  # near and past the range
    ][extra]
    x = torch.cat([_mixed_values(2000, seed, bits), torch.tensor(tails, dtype=torch.float64)])
    xf = x.view(torch.int64)
    rounded, positions = bandcheck.round_and_band(x, bits, BAND)
    assert torch.equal(rounded.view(torch.int64), rounding.rnd(x, bits, top=math.inf).view(torch.int64))
    cand, _ = bandcheck.within(xf, bits, BAND, 2, bandcheck.top_binade(xf))
    _, odd = bandcheck._neighbours(xf, cand, bits)
    want = cand[rounded.index_select(0, cand).view(torch.int64) == odd.view(torch.int64)]
    assert torch.equal(positions, want)


@pytest.mark.parametrize("bits", [32, 26])
def test_within_inRange_matchesTheFullTest(bits: int) -> None:
    x = _mixed_values(3000, 5, bits)
    xf = x.view(torch.int64)
    top = bandcheck.top_binade(xf)
    for widen in (0, 2, 4):
        full, _ = bandcheck.within(xf, bits, BAND, widen, top)
        fast, _ = bandcheck.within(xf, bits, BAND, widen, top, in_range=True)
        assert full.numel() > 0 and torch.equal(full, fast)
