"""How far from a midpoint each party accepts a logged direction (``game.training.numerics.reach``).

Two machines measure an entry's distance ``d`` within ``B / 16`` of each other, and its band ``B``
within 2x (the tensor's top on either side of a power of two). Here the other machine is built
exactly so: the entry moved by up to ``B / 16`` float64 ulps, the top moved across a binade or not.
The rules that keep the honest side paid: an entry an auditor refuses, the judge on any machine
refuses too (else the auditor disputes and loses); one an auditor accepts, a rebuild of agreed
states on any machine accepts too (else the judge's rebuild misses the agreed leaf).
"""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.native import library
from game.training.numerics import bandcheck, logtrits
from game.training.numerics.bandfile import Band
from game.training.numerics.reach import CHECKS, Checks, reach

#: A band whose floor (of the tensor's top binade) dominates, so that the top's binade doubles it.
BAND = Band(-50, -46)
HALF = 1 << 28  # half a float32 grid step, in float64 ulps of a value in [1, 2)
JUST_BELOW = 2048.0 * (1 - 2.0**-40)  # binade 10, a hair below binade 11
#: The op's top value here and on the other machine, whose top lies one binade lower (-1), in the
#: same binade (0), or one higher (1).
TOPS = {-1: (2048.0, JUST_BELOW), 0: (1500.0, 1500.0), 1: (JUST_BELOW, 2048.0)}


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _tensor(entry: int, top: float) -> torch.Tensor:
    """The int64 view of an op's output: the entry (bits), then the top value."""
    return torch.tensor([entry, _bits(top)], dtype=torch.int64)


def _entry_at(d: int, k: int, above: bool) -> int:
    """Bits of a value in [1, 2) lying ``d`` float64 ulps above or below the midpoint after grid point ``k``."""
    mid = _bits(1.0) + (k << 29) + HALF
    return mid + d if above else mid - d


def _band_of(xf: torch.Tensor) -> int:
    geo = bandcheck.geometry(xf, 32, BAND)
    return int(geo.band[0])


def _accepts(xf: torch.Tensor, widen: int, checks: Checks) -> bool:
    top = bandcheck.top_binade(xf)
    try:
        bandcheck.check_entries(xf, 32, BAND, torch.tensor([0]), widen=widen, top_biased=top, checks=checks)
    except bandcheck.BandViolation as exc:
        assert exc.kind == "outside" and exc.index == 0
        return False
    return True


def test_reach_growsFromJudgeToAuditToRebuild_byTheDocumentedAmounts() -> None:
    b = 1 << 16
    assert [reach(b, 4, c) for c in CHECKS] == [16 * b, 32 * b + b // 8, 128 * b]
    assert [reach(b, 2, c) for c in CHECKS] == [4 * b, 8 * b + b // 8, 32 * b]
    t = torch.tensor([b, 8], dtype=torch.int64)
    assert reach(t, 4, "audit").tolist() == [32 * b + b // 8, 256 + 1]
    with pytest.raises(ValueError, match="checks"):
        reach(b, 4, "client")  # type: ignore[arg-type]


def test_theMachinesHere_differAsTheBandsAllow() -> None:
    """The other machine's band is half, equal to or twice this one's: the cases the rules cover."""
    entry = _entry_at(0, 3, True)
    bands = {side: [_band_of(_tensor(entry, top)) for top in tops] for side, tops in TOPS.items()}
    low, high = (1 << 16) + 4, (1 << 17) + 4
    assert bands == {-1: [high, low], 0: [low, low], 1: [low, high]}


def _machines(d: int, delta: int, side: int, k: int, above: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """This machine's op output and the other's (:data:`TOPS`), for an entry ``d`` ulps from its
    midpoint here and ``delta`` further there (clamped to a sixteenth of the smaller band)."""
    top_here, top_there = TOPS[side]
    here = _tensor(_entry_at(d, k, above), top_here)
    limit = min(_band_of(here), _band_of(_tensor(_entry_at(d, k, above), top_there))) // 16
    delta = max(-limit, min(limit, delta))
    return here, _tensor(_entry_at(max(d + delta, 0), k, above), top_there)


def _edges() -> list[int]:
    b = 1 << 17  # the largest band here: edges of both bands' thresholds, both widths
    out = []
    for w in (2, 4):
        for band in (b // 2 + 4, b + 4):
            for edge in (band << w, reach(band, w, "audit"), reach(band, w, "rebuild")):
                out += [edge - 3, edge, edge + 3]
    return out


@settings(max_examples=300, deadline=None)
@given(
    d=st.one_of(
        st.integers(0, 40 << 17), st.sampled_from(_edges()).flatmap(lambda e: st.integers(e - 8200, e + 8200))
    ),
    delta=st.integers(-(1 << 13), 1 << 13),
    side=st.sampled_from([-1, 0, 1]),
    k=st.integers(0, 1000),
    above=st.booleans(),
    widen=st.sampled_from([2, 4]),
)
def test_anEntryAnAuditorRefuses_anyJudgeRefuses_andOneItAccepts_anyRebuildAccepts(
    d: int, delta: int, side: int, k: int, above: bool, widen: int
) -> None:
    """With the judge's own rule at the auditor (16 B both sides), an entry near 16 B from its
    midpoint is refused by the auditor and accepted by the judge on the other machine: the case
    this property holds against (next test)."""
    d = max(0, min(d, HALF - (1 << 14)))
    auditor, other = _machines(d, delta, side, k, above)
    if not _accepts(auditor, widen, "audit"):
        assert not _accepts(other, widen, "judge")
    else:
        assert _accepts(other, widen, "rebuild")


@pytest.mark.parametrize("side", [0, 1])
def test_atTheJudgesEdge_theAuditorNoLongerRefusesWhatTheJudgeAccepts(side: int) -> None:
    """Before: the auditor checked by the judge's rule on its own machine, refused this entry and
    disputed the step; the judge on the other machine accepted it and ruled for the trainer."""
    b = _band_of(_tensor(_entry_at(0, 7, True), TOPS[side][0]))
    auditor, judge = _machines(16 * b + 1, -b, side, 7, True)
    assert not _accepts(auditor, 4, "judge")  # the rule the auditor used to check by
    assert _accepts(judge, 4, "judge")
    assert _accepts(auditor, 4, "audit")


def _odd(xf: torch.Tensor) -> float:
    return float(bandcheck._neighbours(xf, torch.tensor([0]), 32)[1][0])


@pytest.mark.parametrize("ratio, accepted_by", [(20, {"audit", "rebuild"}), (40, {"rebuild"})])
def test_roundWithEntries_pastTheKernelsReach_takesTheTorchPath_byWhoChecks(
    ratio: int, accepted_by: set[Checks]
) -> None:
    """The fused kernels (the C one here, where built) refuse past 16 B; the torch path then takes
    the entry as far as who checks accepts it, and sends its value to the odd neighbour."""
    b = _band_of(_tensor(_entry_at(0, 5, False), 1500.0))
    xf = _tensor(_entry_at(ratio * b, 5, False), 1500.0)
    x = xf.view(torch.float64)
    if library.available():
        from game.training.native import bindings
        from game.training.numerics import rounding

        g = rounding._grid(32)
        params = bindings.BandParams(g.k0, g.max_finite, BAND.rel, BAND.abs)
        assert bindings.round_with_entries(xf.clone(), params, torch.tensor([0]), False) is None
    for checks in CHECKS:
        if checks in accepted_by:
            out = bandcheck.round_with_entries(x, 32, BAND, torch.tensor([0]), checks=checks).rounded
            assert float(out[0]) == _odd(xf) and float(out[1]) == 1500.0
        else:
            with pytest.raises(bandcheck.BandViolation, match="outside the op's band"):
                bandcheck.round_with_entries(x, 32, BAND, torch.tensor([0]), checks=checks)


def test_roundWithTrits_aCorrectionPastTheJudgesReach_isAnAuditorsToTake() -> None:
    """A packed log's correction 6 B from its midpoint: the judge's rule (4 B) refuses it, an
    auditor (some 8 B) and a rebuild (32 B) move the value as the trit says."""
    b = _band_of(_tensor(_entry_at(0, 9, True), 1500.0))
    xf = _tensor(_entry_at(6 * b, 9, True), 1500.0)  # above its midpoint: nearest is up
    x = xf.view(torch.float64)
    trits = torch.tensor([logtrits.TRIT_DOWN, logtrits.TRIT_IGNORE], dtype=torch.uint8)
    with pytest.raises(bandcheck.BandViolation, match="outside the op's band"):
        bandcheck.round_with_trits(x, 32, BAND, trits)
    for checks in ("audit", "rebuild"):
        out, moved = bandcheck.round_with_trits(x, 32, BAND, trits, checks=checks)
        assert moved == 1 and float(out[0]) < float(x[0])
