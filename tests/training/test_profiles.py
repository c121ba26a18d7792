"""Hardware profiles: catalogue, thread setting, and the emulation hooks (split-K order, noise)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from game.errors import ConfigError
from game.training.dispatch.profiles import DEFAULT_NOISE, PROFILE_NAMES, get_profile, list_profiles
from game.training.native import front, library

aten = torch.ops.aten


def test_getProfile_unknown_namesTheValidOnes() -> None:
    with pytest.raises(ConfigError, match=r"cpu-1t.*splitk-16.*noisy"):
        get_profile("tpu-9000")


def test_listProfiles_describesEveryProfile() -> None:
    rows = list_profiles()
    assert [r["name"] for r in rows] == list(PROFILE_NAMES)
    assert {"cpu-1t", "cpu-2t", "splitk-16", "splitk-64", "noisy", "cuda"} <= set(PROFILE_NAMES)
    for r in rows:
        assert set(r) == {"name", "description", "available", "rounding_kernels", "interceptor"}
        assert r["description"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["cuda"]["available"] == torch.cuda.is_available()
    assert by_name["cpu-1t"]["available"]


def test_roundingKernels_sayWhichRun() -> None:
    """CPU profiles: the C kernels where they load, else torch; CUDA: Triton where it compiles."""
    cpu = "c" if library.available() else "torch"
    assert {get_profile(n).rounding_kernels() for n in ("cpu-1t", "cpu-2t", "noisy")} == {cpu}
    with library.disabled():
        assert get_profile("cpu-1t").rounding_kernels() == "torch"
    cuda = get_profile("cuda").rounding_kernels()
    assert cuda in (("triton", "torch") if torch.cuda.is_available() else ("none",))


def test_interceptor_saysWhereTheFrontStandsIn() -> None:
    """The C++ front on profiles that emulate nothing (CPU or GPU), where it is built; the mode on
    the emulating ones."""
    front_here = "front" if front.available() else "python"
    assert {get_profile(n).interceptor() for n in ("cpu-1t", "cpu-2t", "cuda")} == {front_here}
    assert {get_profile(n).interceptor() for n in ("noisy", "splitk-16", "splitk-64")} == {"python"}
    with front.disabled():
        assert get_profile("cpu-1t").interceptor() == "python"


def test_apply_setsThreadsAndRestores() -> None:
    before = torch.get_num_threads()
    with get_profile("cpu-2t").apply():
        assert torch.get_num_threads() == 2
    with get_profile("cpu-1t").apply():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_apply_unavailable_isConfigError() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ConfigError, match="not available"), get_profile("cuda").apply():
        pass


def _cases() -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(3)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, generator=g)

    return [
        (aten.mm.default, (r(5, 300), r(300, 4)), {}),
        (aten.addmm.default, (r(4), r(5, 300), r(300, 4)), {}),
        (aten.addmm.default, (r(5, 4), r(5, 300), r(300, 4)), {"beta": 0.5, "alpha": 2.0}),
        (aten.bmm.default, (r(2, 5, 300), r(2, 300, 3)), {}),
        (aten.baddbmm.default, (r(2, 5, 3), r(2, 5, 300), r(2, 300, 3)), {}),
        (aten.mv.default, (r(5, 300), r(300)), {}),
        (aten.addmv.default, (r(5), r(5, 300), r(300)), {}),
        (aten.dot.default, (r(300), r(300)), {}),
        (
            aten.convolution.default,
            (r(2, 40, 6, 6), r(3, 40, 3, 3), r(3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
            {},
        ),
    ]


@pytest.mark.parametrize("name", ["splitk-16", "splitk-64"])
def test_splitK_sameValueOtherSummationOrder(name: str) -> None:
    profile = get_profile(name)
    differs = 0
    for func, args, kwargs in _cases():
        native = func(*args, **kwargs)
        emulated = profile.compute(func, args, kwargs)
        assert emulated.shape == native.shape and emulated.dtype == native.dtype, str(func)
        torch.testing.assert_close(emulated, native, rtol=1e-12, atol=1e-12, msg=str(func))
        differs += not torch.equal(emulated, native)
    assert differs >= len(_cases()) // 2  # a real change of summation order, not the native kernel


def test_splitK_float32_differsFromNative() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 512, generator=g), torch.randn(512, 8, generator=g)
    out = get_profile("splitk-16").compute(aten.mm.default, (a, b), {})
    assert out.dtype == torch.float32
    assert not torch.equal(out, a @ b)


def test_nativeProfiles_computeIsTheOp() -> None:
    func, args, kwargs = _cases()[0]
    assert torch.equal(get_profile("cpu-1t").compute(func, args, kwargs), func(*args, **kwargs))
    assert not get_profile("cpu-2t").emulates


def test_noise_isBoundedRelativeAndNonZero() -> None:
    profile = get_profile("noisy")
    assert profile.noise == DEFAULT_NOISE
    source = profile.noise_generator()
    assert source is not None
    x = torch.linspace(-3.0, 5.0, 10_001, dtype=torch.float64)
    y = x.clone()
    source.perturb(y)
    rel = ((y - x) / x)[x != 0]
    assert float(rel.abs().max()) <= DEFAULT_NOISE + 2**-52  # plus the rounding of the product
    assert int((y != x).sum()) > 9_000


def test_noise_float32_movesAboutAnUlp() -> None:
    source = get_profile("noisy").noise_generator()
    assert source is not None
    x = torch.linspace(1.0, 2.0, 10_001, dtype=torch.float32)
    y = x.clone()
    source.perturb(y)
    assert int((y != x).sum()) > 0
    assert float(((y - x).abs() / x).max()) <= 2.0**-23


def test_noise_seeded_isReproducible_unseeded_isNot() -> None:
    x = torch.linspace(1.0, 2.0, 1000, dtype=torch.float64)
    outs = []
    for seed in (5, 5, None):
        source = replace(get_profile("noisy"), noise=2.0**-30, noise_seed=seed).noise_generator()
        assert source is not None
        y = x.clone()
        source.perturb(y)
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_profile_rejectsBadNoiseBounds() -> None:
    for bad in (1.5, -1e-9, float("nan")):
        with pytest.raises(ConfigError, match="noise"):
            replace(get_profile("noisy"), noise=bad)
    assert get_profile("cpu-1t").noise_generator() is None
