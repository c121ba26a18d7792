"""The C kernels against the torch and numpy ones: the same bits, the same counts, the same errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import RoundingLogError
from game.training.log import codec as chunkcodec
from game.training.native import bindings, library
from game.training.numerics import bandcheck, logtrits, rounding
from game.training.numerics.bandfile import Band

from .test_bandcheck import _mixed_values, _perturb

TAILS = {
    "none": [],
    "subnormal": [3e-39, -7e-40, 1e-45],  # rare lanes: the torch kernel runs
    "zero": [0.0, -0.0, 0.0],
}


#: The trainer kernels' cases (here the C ones, in test_cuda_kernels the Triton ones): the grid, a
#: band, lanes near midpoints and rare tails, at scales from the subnormal range to far above one.
TRAINER_CASES = {
    "seed": st.integers(0, 2**31 - 1),
    "bits": st.sampled_from([32, 28, 26, 16]),
    "rel": st.integers(-48, -20),
    "gap": st.integers(0, 20),
    "tail": st.sampled_from(sorted(TAILS)),
    "scale": st.sampled_from([1.0, -3.0, 2.0**-60, 2.0**40]),
}
#: The auditor kernels' cases: an honest log plus up to ``extra`` of the trainer's free choices.
AUDITOR_CASES = {
    "seed": st.integers(0, 2**31 - 1),
    "bits": st.sampled_from([32, 28, 26]),
    "tail": st.sampled_from(sorted(TAILS)),
    "extra": st.integers(0, 20),
    "count_free": st.booleans(),
}


def _values(seed: int, bits: int, tail: str, scale: float) -> torch.Tensor:
    x = _mixed_values(1500, seed, bits) * scale
    return torch.cat([x, torch.tensor(TAILS[tail], dtype=torch.float64)])


def test_available_whereACompilerIs() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert library.available()


@settings(max_examples=60, deadline=None)
@given(**TRAINER_CASES)
def test_trainerKernel_equalsTorch(seed: int, bits: int, rel: int, gap: int, tail: str, scale: float) -> None:
    band = Band(rel, max(rel - gap, -60))
    x = _values(seed, bits, tail, scale)
    r_native, p_native = bandcheck.round_and_band(x, bits, band)
    with library.disabled():
        r_torch, p_torch = bandcheck.round_and_band(x, bits, band)
    assert torch.equal(r_native.view(torch.int64), r_torch.view(torch.int64))
    assert torch.equal(p_native, p_torch)
    if library.available():  # the C kernel took the tensor unless it holds rare lanes
        g = rounding._grid(bits)
        xf = x.view(torch.int64).clone()
        params = bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs)
        assert (bindings.round_and_band(xf, params) is None) == (tail == "subnormal")


@settings(max_examples=60, deadline=None)
@given(**AUDITOR_CASES)
def test_auditorKernel_equalsTorch(seed: int, bits: int, tail: str, extra: int, count_free: bool) -> None:
    band = Band(-35, -46)
    x_t = _values(seed, bits, tail, 1.0)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    _, honest = bandcheck.round_and_band(x_t, bits, band)
    # a trainer's own choices among the values within 16 bands: accepted, and moved the same way
    free, _ = bandcheck.within(
        x_a.view(torch.int64), bits, band, 4, bandcheck.top_binade(x_a.view(torch.int64))
    )
    g = torch.Generator().manual_seed(seed)
    chosen = free[torch.randperm(free.numel(), generator=g)[:extra]]
    positions = torch.cat([honest, chosen]).unique()
    got = bandcheck.round_with_entries(x_a, bits, band, positions, count_free=count_free)
    with library.disabled():
        want = bandcheck.round_with_entries(x_a, bits, band, positions, count_free=count_free)
    assert torch.equal(got.rounded.view(torch.int64), want.rounded.view(torch.int64))
    assert (got.corrections, got.free) == (want.corrections, want.free)


def block_edge_case(size: int) -> tuple[Band, torch.Tensor, torch.Tensor]:
    """A wide band (many lanes in it), ``size`` values, and entries: every other lane within 16
    bands, plus both lanes at every 1024-lane edge where they are within 16 bands."""
    band = Band(-30, -40)
    x = _mixed_values(size, 11, 32)
    xf = x.view(torch.int64)
    near, _ = bandcheck.within(xf, 32, band, 4, bandcheck.top_binade(xf))
    edges = torch.tensor([i for b in range(1024, size, 1024) for i in (b - 1, b)], dtype=torch.int64)
    return band, x, torch.cat([near[::2], edges[torch.isin(edges, near)]]).unique()


@pytest.mark.parametrize("size", [1023, 1024, 1025, 4096 + 3])
def test_kernels_acrossBlockEdges_equalTorch(size: int) -> None:
    """The C kernels work in blocks of 1024 lanes: entries on both sides of every block edge, every
    lane within 16 bands listed or not, and a tensor that ends mid-block, still match torch."""
    band, x, positions = block_edge_case(size)
    xf = x.view(torch.int64)
    assert positions.numel() > 2 * (size // 1024)
    got_r, got_p = bandcheck.round_and_band(x, 32, band)
    got = bandcheck.round_with_entries(x, 32, band, positions, count_free=True)
    with library.disabled():
        want_r, want_p = bandcheck.round_and_band(x, 32, band)
        want = bandcheck.round_with_entries(x, 32, band, positions, count_free=True)
    assert torch.equal(got_r.view(torch.int64), want_r.view(torch.int64)) and torch.equal(got_p, want_p)
    assert torch.equal(got.rounded.view(torch.int64), want.rounded.view(torch.int64))
    assert (got.corrections, got.free) == (want.corrections, want.free)
    assert got.corrections > 0
    if library.available():  # the C kernels took the tensor
        g = rounding._grid(32)
        params = bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs)
        assert bindings.round_with_entries(xf.clone(), params, positions, True) is not None


def band_edge_values(bits: int, band: Band, binades: int = 48) -> torch.Tensor:
    """Lanes exactly at, one below and one above the edges of one, four and sixteen bands from
    their midpoint, on both sides of it, in each of the top ``binades`` binades below 1.0 (the
    tensor's top, one lane on the grid), went odd and even, both signs: where the C kernels' sieve
    must let through every lane the band holds (both of its binade cuts and their reaches)."""
    g = rounding._grid(bits)
    top = 1023
    lanes = [top << 52]
    for e in range(top - binades, top + 1):
        probe = torch.tensor([(e << 52) | 1], dtype=torch.int64)
        b = int(bandcheck.geometry(probe, bits, band, top_biased=top).band[0])
        for kept in (4, 5):  # the neighbour below the midpoint: even, odd (and its next bit clear)
            base = (e << 52) | (kept << g.k0)
            for widen in (0, 2, 4):
                for delta in (-1, 0, 1):
                    for side in (-1, 1):
                        dropped = g.half + side * ((b << widen) + delta)
                        if 0 < dropped < g.step:
                            lanes += [base | dropped, (base | dropped) | -(2**63)]
    return torch.tensor(lanes, dtype=torch.int64).view(torch.float64)


@pytest.mark.parametrize("bits", [32, 30, 29, 26, 16])
@pytest.mark.parametrize("band", [Band(-35, -46), Band(-46, -46), Band(-40, -60), Band(-30, -40)])
def test_kernels_atTheBandsEdges_equalTorch(bits: int, band: Band) -> None:
    """Both C kernels list and move exactly the lanes torch does at the band's edges, in every
    binade: narrow bands take the kernels' sieve (cut and reach included), on 32-bit words where a
    grid step fits in one (bits 30 and up) and on 64-bit lanes below; the wide band (-30, -40)
    takes the trainer's exact loops (the auditor's sieve, one band wide, still applies)."""
    x = band_edge_values(bits, band)
    got_r, got_p = bandcheck.round_and_band(x, bits, band)
    with library.disabled():
        want_r, want_p = bandcheck.round_and_band(x, bits, band)
    assert torch.equal(got_r.view(torch.int64), want_r.view(torch.int64)) and torch.equal(got_p, want_p)
    # both sides of the trainer's edge: lanes listed, and not every lane that went odd (half of them)
    assert 0 < got_p.numel() < x.numel() // 2
    for count_free in (False, True):
        got = bandcheck.round_with_entries(x, bits, band, got_p[::2], count_free=count_free)
        with library.disabled():
            want = bandcheck.round_with_entries(x, bits, band, want_p[::2], count_free=count_free)
        assert torch.equal(got.rounded.view(torch.int64), want.rounded.view(torch.int64))
        assert (got.corrections, got.free) == (want.corrections, want.free)
        assert got.corrections > 0


def test_auditorKernel_entryOutsideTheBand_sameError() -> None:
    x = _mixed_values(2000, 3)
    xf = x.view(torch.int64)
    geo = bandcheck.geometry(xf, 32, Band(-35, -46))
    far = int((geo.off & (geo.distance > (geo.band << 5))).nonzero()[0, 0])
    errors = []
    for ctx in (library.disabled(), torch.no_grad()):  # torch kernel, then the C kernel
        with ctx, pytest.raises(bandcheck.BandViolation) as info:
            bandcheck.round_with_entries(x, 32, Band(-35, -46), torch.tensor([far]))
        errors.append((info.value.kind, info.value.index, str(info.value)))
    assert errors[0] == errors[1] and errors[0][:2] == ("outside", far)


def test_kernels_leaveTheirInputUntouched_unlessToldOtherwise() -> None:
    x = _mixed_values(1000, 4)
    before = x.clone()
    r, pos = bandcheck.round_and_band(x, 32, Band(-35, -46))
    replayed = bandcheck.round_with_entries(x, 32, Band(-35, -46), pos)
    assert torch.equal(x.view(torch.int64), before.view(torch.int64))
    r_in, pos_in = bandcheck.round_and_band(x, 32, Band(-35, -46), in_place=True)
    assert r_in.data_ptr() == x.data_ptr() or not library.available()
    assert torch.equal(r_in.view(torch.int64), r.view(torch.int64)) and torch.equal(pos_in, pos)
    y = before.clone()
    again = bandcheck.round_with_entries(y, 32, Band(-35, -46), pos, in_place=True)
    assert torch.equal(again.rounded.view(torch.int64), replayed.rounded.view(torch.int64))
    assert again.corrections == replayed.corrections


def test_nonContiguousInput_isRoundedInLogicalOrder() -> None:
    x = _mixed_values(1200, 5).reshape(30, 40).t()
    r_native, p_native = bandcheck.round_and_band(x, 32, Band(-35, -46))
    with library.disabled():
        r_torch, p_torch = bandcheck.round_and_band(x, 32, Band(-35, -46))
    assert r_native.shape == x.shape
    assert torch.equal(r_native.view(torch.int64), r_torch.view(torch.int64)) and torch.equal(
        p_native, p_torch
    )
    assert torch.equal(r_native.view(torch.int64), rounding.rnd(x, 32).view(torch.int64))


@pytest.mark.parametrize("bits", [32, 27, 16])
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_inPlaceRounding_equalsTorch(bits: int, tail: str) -> None:
    x = _values(7, bits, tail, -5.0)
    got = rounding.round_(x.clone(), bits)
    with library.disabled():
        want = rounding.round_(x.clone(), bits)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    assert torch.equal(got.view(torch.int64), rounding.rnd(x, bits, top=float("inf")).view(torch.int64))


#: float64 bit patterns at the edges of what the C kernels take (sign bit clear; each is also tried
#: negated): name -> (pattern, rare), for the 32-bit grid.
_MIN_NORMAL = (1023 - 126) << 52
_MAX_FINITE_32 = rounding._grid(32).max_finite
EDGE_LANES = {
    "zero": (0, False),
    "smallest subnormal float64": (1, True),
    "just below float32's smallest normal": (_MIN_NORMAL - 1, True),
    "float32's smallest normal": (_MIN_NORMAL, False),
    "largest finite": (_MAX_FINITE_32, False),
    "just past the largest finite": (_MAX_FINITE_32 + 1, True),
    "inf": (0x7FF0000000000000, True),
    "nan": (0x7FF8000000000000, True),
}


@pytest.mark.skipif(not library.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize("edge", sorted(EDGE_LANES))
@pytest.mark.parametrize("where", [0, 1500, 2999])  # a block's first lane, a middle one, the last
def test_kernels_takeATensor_exactlyWhenNoLaneIsRare(edge: str, negative: bool, where: int) -> None:
    pattern, rare = EDGE_LANES[edge]
    x = torch.cat([_values(3, 32, "none", 1.0), _values(4, 32, "none", 1.0)])
    x.view(torch.int64)[where] = pattern | (-(2**63) if negative else 0)
    g = rounding._grid(32)
    params = bindings.BandParams(g.k0, g.max_finite, -35, -46)
    taken = bindings.round_and_band(x.clone().view(torch.int64), params)
    assert (taken is None) == rare
    none = torch.empty(0, dtype=torch.int64)
    assert (bindings.round_with_entries(x.clone().view(torch.int64), params, none, False) is None) == rare
    assert bindings.round_inplace(x.clone().view(torch.int64), g.k0, g.max_finite) == (not rare)
    assert (bindings.round_and_trits(x.clone().view(torch.int64), g.k0, g.max_finite, 0) is None) == rare


# ---- the packed log's kernels --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    bits=st.sampled_from([32, 28, 26, 16]),
    tau=st.sampled_from([0.0, 2.0**-10, 0.25, 0.375]),
    tail=st.sampled_from(sorted(TAILS)),
    scale=st.sampled_from([1.0, -3.0, 2.0**-60, 2.0**40]),
    size=st.sampled_from([1, 1023, 1025, 1500]),
)
def test_packedTrainerKernel_equalsTorch(
    seed: int, bits: int, tau: float, tail: str, scale: float, size: int
) -> None:
    x = torch.cat([_mixed_values(size, seed, bits) * scale, torch.tensor(TAILS[tail], dtype=torch.float64)])
    r_native, t_native = bandcheck.round_and_trits(x, bits, tau)
    r_torch, t_torch = logtrits.round_and_log(x, bits, tau)
    assert torch.equal(r_native.view(torch.int64), r_torch.view(torch.int64))
    assert torch.equal(t_native, t_torch.reshape(-1))
    if library.available():  # the C kernel took the tensor unless it holds rare lanes
        g = rounding._grid(bits)
        xf = x.view(torch.int64).clone()
        took = bindings.round_and_trits(xf, g.k0, g.max_finite, logtrits.log_threshold(bits, tau))
        assert (took is None) == (tail == "subnormal")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    bits=st.sampled_from([32, 28, 26]),
    tail=st.sampled_from(sorted(TAILS)),
    size=st.sampled_from([7, 1024, 1500, 4099]),
)
def test_packedAuditorKernel_equalsTorch(seed: int, bits: int, tail: str, size: int) -> None:
    band = Band(-35, -46)
    x_t = torch.cat([_mixed_values(size, seed, bits), torch.tensor(TAILS[tail], dtype=torch.float64)])
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    # tau 0.25 as tasks use: values within a quarter step of a grid point are "ignore", so a
    # perturbation that carries one across its grid point does not flip the meaning of its trit
    _, trits = logtrits.round_and_log(x_t, bits, 0.25)
    got_r, got_n = bandcheck.round_with_trits(x_a, bits, band, trits.reshape(-1))
    want_r, changed = logtrits.round_with_log_changes(x_a, bits, trits)
    bandcheck.check_corrections(x_a, bits, band, changed)
    assert torch.equal(got_r.view(torch.int64), want_r.view(torch.int64))
    assert got_n == int(changed.count_nonzero())
    assert got_n > 0 or size < 1024  # exact ties pushed to the other side by the noise
    # the trainer's side wins: replaying its trits on its own values moves nothing
    assert torch.equal(got_r.view(torch.int64), logtrits.round_and_log(x_t, bits, 0.25)[0].view(torch.int64))


def test_packedAuditorKernel_movedLaneOutsideTheBand_sameError_inputUntouched() -> None:
    x = _mixed_values(3000, 3)
    xf = x.view(torch.int64)
    geo = bandcheck.geometry(xf, 32, Band(-35, -46))
    far = int((geo.off & (geo.distance > (geo.band << 3))).nonzero()[0, 0])
    _, trits = logtrits.round_and_log(x, 32, 0.0)
    trits = trits.clone()
    trits[far] = 2 - trits[far]  # the other side, far from any midpoint: tampering
    before = x.clone()
    errors = []
    for ctx in (library.disabled(), torch.no_grad()):  # torch kernel, then the C kernel
        with ctx, pytest.raises(bandcheck.BandViolation) as info:
            bandcheck.round_with_trits(x, 32, Band(-35, -46), trits, in_place=True)
        errors.append((info.value.kind, info.value.index, str(info.value)))
        assert torch.equal(x.view(torch.int64), before.view(torch.int64))
    assert errors[0] == errors[1] and errors[0][:2] == ("outside", far)
    if library.available():
        g = rounding._grid(32)
        params = bindings.BandParams(g.k0, g.max_finite, -35, -46)
        assert bindings.round_with_trits(xf.clone(), params, trits) is None
        bad = trits.clone()
        bad[5] = 3
        assert bindings.round_with_trits(xf.clone(), params, bad) is None


def test_packedKernels_inPlace_andNot() -> None:
    x = _mixed_values(1000, 4)
    before = x.clone()
    r, trits = bandcheck.round_and_trits(x, 32, 0.25)
    assert torch.equal(x.view(torch.int64), before.view(torch.int64))
    r_in, trits_in = bandcheck.round_and_trits(x, 32, 0.25, in_place=True)
    assert r_in.data_ptr() == x.data_ptr() or not library.available()
    assert torch.equal(r_in.view(torch.int64), r.view(torch.int64)) and torch.equal(trits_in, trits)
    y = before.clone()
    out, moved = bandcheck.round_with_trits(y, 32, Band(-35, -46), trits)
    assert torch.equal(y.view(torch.int64), before.view(torch.int64))
    assert torch.equal(out.view(torch.int64), r.view(torch.int64)) and moved == 0


def test_packedKernels_nonFinite_isAnErrorNamingTheOp() -> None:
    x = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64)
    with pytest.raises(rounding.NonFiniteError, match=r"op #3 aten\.mm"):
        bandcheck.round_and_trits(x, 32, 0.25, where="step 1, op #3 aten.mm.default")
    with pytest.raises(rounding.NonFiniteError, match=r"op #3 aten\.mm"):
        bandcheck.round_with_trits(
            x, 32, Band(-35, -46), torch.ones(3, dtype=torch.uint8), where="op #3 aten.mm"
        )


def test_damagedCacheEntry_isBuiltAgain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("VGAME_CACHE_DIR", str(tmp_path))
    damaged = library.library_path()
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not a shared library")  # a new file: the loaded library is not touched
    monkeypatch.setattr(library, "_tried", False)
    monkeypatch.setattr(library, "_lib", None)
    assert library.available()
    assert damaged.read_bytes()[:4] == b"\x7fELF"


def test_aCompilerThatRefusesTheKernels_leavesTheTorchKernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that cannot build kernels.c (an old one, one without GCC's vector extension) costs
    speed, not results: the load fails with a warning and the torch kernels run."""
    if shutil.which("false") is None:
        pytest.skip("no `false` command to stand in for a failing compiler")
    monkeypatch.setenv("VGAME_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # exits 1 on every file, as a compiler that refuses the source
    monkeypatch.setattr(library, "_tried", False)
    monkeypatch.setattr(library, "_lib", None)
    x = _values(5, 32, "none", 1.0)
    g = rounding._grid(32)
    params = bindings.BandParams(g.k0, g.max_finite, -35, -46)
    assert not library.available()
    assert bindings.round_and_band(x.clone().view(torch.int64), params) is None
    got_r, got_p = bandcheck.round_and_band(x, 32, Band(-35, -46))
    with library.disabled():
        want_r, want_p = bandcheck.round_and_band(x, 32, Band(-35, -46))
    assert torch.equal(got_r.view(torch.int64), want_r.view(torch.int64)) and torch.equal(got_p, want_p)
    assert not list(tmp_path.rglob("*.so"))


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.integers(0, 300), st.integers(0, 2**63 - 1), st.sampled_from([0, 127, 128, 2**56, 2**63 - 1])
        ),
        max_size=60,
    )
)
def test_uvarints_sameBytesAndValues_asNumpy(values: list[int]) -> None:
    v = np.array(values, dtype=np.int64)
    fast = chunkcodec.uvarint_encode(v)
    with library.disabled():
        slow = chunkcodec.uvarint_encode(v)
    assert fast == slow
    buf = np.frombuffer(b"\x05" + fast + b"\x7f", dtype=np.uint8)  # not at the start, bytes after
    out, end = chunkcodec.uvarint_decode(buf, 1, len(values))
    with library.disabled():
        out_np, end_np = chunkcodec.uvarint_decode(buf, 1, len(values))
    assert out.tolist() == out_np.tolist() == values and end == end_np == 1 + len(fast)
    if library.available() and values:
        assert bindings.uvarint_encode(v) == fast  # the C kernel took them
        assert bindings.uvarint_decode(buf, 1, len(values)) is not None


@pytest.mark.parametrize(
    ("data", "count", "message"),
    [
        (b"\x81\x00", 1, "shortest"),
        (b"\x80\x80", 1, "truncated"),
        (b"\x01\x02", 3, "truncated"),
        (b"\xff" * 9 + b"\x01", 1, "longer than 9"),
    ],
)
def test_malformedUvarints_sameError_asNumpy(data: bytes, count: int, message: str) -> None:
    buf = np.frombuffer(data, dtype=np.uint8)
    if library.available():
        assert bindings.uvarint_decode(buf, 0, count) is None  # the numpy decoder words the error
    with pytest.raises(chunkcodec.Malformed, match=message):
        chunkcodec.uvarint_decode(buf, 0, count)
    with library.disabled(), pytest.raises(chunkcodec.Malformed, match=message):
        chunkcodec.uvarint_decode(buf, 0, count)


def test_negativeValue_isRefused_byEitherEncoder() -> None:
    v = np.array([3, -1], dtype=np.int64)
    if library.available():
        assert bindings.uvarint_encode(v) is None
    with pytest.raises(RoundingLogError, match="non-negative"):
        chunkcodec.uvarint_encode(v)


@pytest.mark.parametrize(
    "positions", [[5, 3], [4, 4], [-1, 2], [2, 2000]], ids=["descending", "repeated", "negative", "past-end"]
)
def test_auditorKernel_refusesBadPositions_writingNothing(positions: list[int]) -> None:
    """The C kernel checks the entries' order and range itself and leaves the wording to torch."""
    if not library.available():
        pytest.skip("no C kernels on this machine")
    x = _mixed_values(1500, 5, 32)
    before = x.clone()
    g = rounding._grid(32)
    params = bindings.BandParams(g.k0, g.max_finite, -35, -46)
    assert bindings.round_with_entries(x, params, torch.tensor(positions), False) is None
    assert torch.equal(x.view(torch.int64), before.view(torch.int64))
    with pytest.raises(bandcheck.BandViolation):
        bandcheck.round_with_entries(x, 32, Band(-35, -46), torch.tensor(positions))


def test_toFloat32_convertsGridValues_andRefusesOffGrid() -> None:
    """The state's float32 conversion: exact on grid values (any tensor, any slice), None off it."""
    if not library.available():
        pytest.skip("no C kernels on this machine")
    x = rounding.rnd(_mixed_values(3000, 9, 32), 32)
    parts = [x[:1000], x[1000:], x[5:6]]
    got = bindings.to_float32(parts)
    assert got is not None
    for g, p in zip(got, parts, strict=True):
        assert np.array_equal(g.view(np.int32), p.float().numpy().view(np.int32))
    off = x.clone()
    off[2999] = 1.0 / 3.0
    assert bindings.to_float32([x[:10], off]) is None


def test_float32At_writesAtAnyOffset_andRefusesOneThatDoesNotFit() -> None:
    """The state buffer's conversion by address: values land at odd byte offsets, nothing else is
    written, and an offset that would run past the buffer is refused before any write."""
    if not library.available():
        pytest.skip("no C kernels on this machine")
    x = rounding.rnd(_mixed_values(300, 4, 32), 32)
    a, b = x[:100], x[100:]
    out = np.full(4 * 300 + 7, 0xAB, dtype=np.uint8)
    assert bindings.float32_at([a.data_ptr(), b.data_ptr()], [100, 200], [3, 3 + 400], out)
    want = x.float().numpy().view(np.uint8)
    assert np.array_equal(out[3 : 3 + 1200], want)
    assert (out[:3] == 0xAB).all() and (out[1203:] == 0xAB).all()
    untouched = out.copy()
    with pytest.raises(ValueError, match="does not fit"):
        bindings.float32_at([a.data_ptr()], [100], [len(out) - 399], out)
    with pytest.raises(ValueError, match="does not fit"):
        bindings.float32_at([a.data_ptr()], [100], [-1], out)
    assert np.array_equal(out, untouched)
