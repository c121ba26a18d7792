"""The Triton kernels against the torch ones: the same bits, the same counts, nothing written on refusal.

Without a GPU they run on CPU tensors in Triton's interpreter (set here before the module is first
imported); with one, on the GPU. Either way the reference is the torch path with the C kernels off.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings

from game.training import banding, native, rounding
from game.training.bands import Band

from .test_banding import _mixed_values, _perturb
from .test_native import AUDITOR_CASES, TAILS, TRAINER_CASES, _values, block_edge_case

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from game.training import cuda_kernels  # noqa: E402  (Triton reads TRITON_INTERPRET at import)

DEV = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.skipif(not cuda_kernels.available(), reason="Triton is not installed")
BAND = Band(-35, -46)


def _params(bits: int, band: Band) -> native.BandParams:
    g = rounding._grid(bits)
    return native.BandParams(g.k0, g.max_finite, band.rel, band.abs)


def _copy(x: torch.Tensor) -> torch.Tensor:
    """A copy on the kernels' device (on CPU, ``to`` alone would hand back ``x`` itself)."""
    return x.to(DEV, copy=True)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().cpu().view(torch.int64)


@settings(max_examples=40, deadline=None)
@given(**TRAINER_CASES)
def test_trainerKernel_equalsTorch(seed: int, bits: int, rel: int, gap: int, tail: str, scale: float) -> None:
    band = Band(rel, max(rel - gap, -60))
    x = _values(seed, bits, tail, scale)
    with native.disabled():
        want_r, want_p = banding.round_and_band(x, bits, band)
    buf = _copy(x)
    got = cuda_kernels.round_and_band(buf, _params(bits, band))
    if tail == "subnormal":  # a rare lane: refused, nothing written
        assert got is None and torch.equal(_bits(buf), _bits(x))
        return
    assert got is not None
    assert torch.equal(_bits(buf), _bits(want_r)) and torch.equal(got.cpu(), want_p)


@settings(max_examples=40, deadline=None)
@given(**AUDITOR_CASES)
def test_auditorKernel_equalsTorch(seed: int, bits: int, tail: str, extra: int, count_free: bool) -> None:
    x_t = _values(seed, bits, tail, 1.0)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    with native.disabled():
        _, honest = banding.round_and_band(x_t, bits, BAND)
        free, _ = banding.within(
            x_a.view(torch.int64), bits, BAND, 4, banding.top_binade(x_a.view(torch.int64))
        )
        g = torch.Generator().manual_seed(seed)
        positions = torch.cat([honest, free[torch.randperm(free.numel(), generator=g)[:extra]]]).unique()
        want = banding.round_with_entries(x_a, bits, BAND, positions, count_free=count_free)
    buf = _copy(x_a)
    got = cuda_kernels.round_with_entries(buf, _params(bits, BAND), positions, count_free)
    if tail == "subnormal":
        assert got is None and torch.equal(_bits(buf), _bits(x_a))
        return
    assert got is not None
    assert torch.equal(_bits(buf), _bits(want.rounded))
    assert (got.corrections, got.free) == (want.corrections, want.free)


@pytest.mark.parametrize("size", [1023, 1024, 1025, 4096 + 3])
def test_kernels_acrossBlockEdges_equalTorch(size: int) -> None:
    """Programs take 1024 lanes each: entries on both sides of every edge and a last partial block."""
    band, x, positions = block_edge_case(size)
    with native.disabled():
        want_r, want_p = banding.round_and_band(x, 32, band)
        want = banding.round_with_entries(x, 32, band, positions, count_free=True)
    t = _copy(x)
    assert torch.equal(cuda_kernels.round_and_band(t, _params(32, band)).cpu(), want_p)  # type: ignore[union-attr]
    assert torch.equal(_bits(t), _bits(want_r))
    a = _copy(x)
    got = cuda_kernels.round_with_entries(a, _params(32, band), positions, True)
    assert got is not None and (got.corrections, got.free) == (want.corrections, want.free)
    assert torch.equal(_bits(a), _bits(want.rounded)) and got.corrections > 0


def _far_lane(x: torch.Tensor) -> int:
    geo = banding.geometry(x.view(torch.int64), 32, BAND)
    return int((geo.off & (geo.distance > (geo.band << 5))).nonzero()[0, 0])


@pytest.mark.parametrize("case", ["descending", "repeated", "negative", "past-end", "outside", "zero"])
def test_auditorKernel_refusesBadEntries_writingNothing(case: str) -> None:
    """Order, range, band and a listed zero: refused before anything is written; torch words it."""
    x = _mixed_values(1500, 5, 32)
    x[7] = 0.0
    positions = {
        "descending": [5, 3],
        "repeated": [4, 4],
        "negative": [-1, 2],
        "past-end": [2, 2000],
        "outside": [1, _far_lane(x)],
        "zero": [3, 7],
    }[case]
    buf = _copy(x)
    assert cuda_kernels.round_with_entries(buf, _params(32, BAND), torch.tensor(positions), False) is None
    assert torch.equal(_bits(buf), _bits(x))
    if case != "zero":  # a listed zero is refused by the kernels only (the torch path takes it)
        with pytest.raises(banding.BandViolation):
            banding.round_with_entries(x, 32, BAND, torch.tensor(positions))


@pytest.mark.parametrize("bits", [32, 27, 16])
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_inPlaceRounding_equalsTorch(bits: int, tail: str) -> None:
    x = _values(7, bits, tail, -5.0)
    want = rounding.rnd(x, bits, top=float("inf"))
    buf = _copy(x)
    done = cuda_kernels.round_inplace(buf, *_params(bits, BAND)[:2])
    assert done == (tail != "subnormal")
    if not done:  # the normal lanes may be rounded already; the torch path finishes the job
        rounding.round_(buf, bits)
    assert torch.equal(_bits(buf), _bits(want))


def test_notTheirs_isLeftToTorch() -> None:
    """float32, empty and non-contiguous tensors are the torch kernels' (or, on CPU, the C ones')."""
    assert not cuda_kernels.usable(torch.zeros(4, dtype=torch.float32, device=DEV))
    assert not cuda_kernels.usable(torch.zeros(0, dtype=torch.float64, device=DEV))
    assert not cuda_kernels.usable(torch.zeros(4, 4, dtype=torch.float64, device=DEV).t())
    assert cuda_kernels.round_and_band(torch.zeros(4, 4, dtype=torch.float64).t(), _params(32, BAND)) is None
