"""An inexact op on float32 tensors in a step or at construction (dispatch/widen.py): computed on its
float64 twin, rounded to the grid (through the log in a step), and written back into its float32
result. Through the C++ front (``cpu-1t``) and the Python mode (``noisy``), which must agree."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.training.dispatch import widen
from game.training.dispatch.initmode import init_module
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.log.packed import StepLog
from game.training.native import front
from game.training.numerics import rounding

BITS = 32
TAU = 0.25
PROFILES = ["cpu-1t", "noisy"]  # through the C++ front where it loads; the Python mode


def _mode(profile: str, mode: str, log: StepLog) -> RoundingMode:
    return RoundingMode(bits=BITS, tau=TAU, mode=mode, profile=get_profile(profile), step=3, log=log)  # type: ignore[arg-type]


def _norm_and_rotary(x: Tensor) -> list[Tensor]:
    """What transformers' Llama computes in float32 on purpose: its rotary table's cos and sin, its
    RMSNorm, a float32 softmax, and an in-place inexact op (add with alpha)."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    normed = h * torch.rsqrt(variance + 1e-6)
    angles = torch.cat((h, h), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    probs = F.softmax(x, dim=-1, dtype=torch.float32)
    acc = h.clone()
    acc.add_(normed, alpha=0.3)
    return [normed, cos, sin, probs, acc]


def _inputs() -> Tensor:
    g = torch.Generator().manual_seed(7)
    return rounding.rnd(torch.randn(64, 512, generator=g, dtype=torch.float64) * 3, BITS)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["record", "round"])
def test_aFloat32InexactOp_inAStep_isItsFloat64TwinRoundedAndLogged(profile: str, mode: str) -> None:
    """The trainer's float32 results are its float64 results rounded to nearest (the record rounds
    to nearest and logs the lanes near a boundary; mode ``round`` rounds without a log), and each is
    an op the log counts."""
    x = _inputs()
    log = StepLog()
    rm = _mode(profile, mode, log)
    with rm:
        y = torch.exp(x.to(torch.float32))
        z = x.to(torch.float32).cos()
    assert rm.via_front == (profile == "cpu-1t" and front.available())
    assert y.dtype == z.dtype == torch.float32
    assert rm.op_index == 2  # both logged, as float64 results are
    if profile == "cpu-1t":  # no noise: the float64 op's own result, to nearest
        assert torch.equal(y.to(torch.float64), rounding.rnd(torch.exp(x), BITS))
        assert torch.equal(z.to(torch.float64), rounding.rnd(torch.cos(x), BITS))


@pytest.mark.parametrize(("trainer", "auditor"), [("cpu-1t", "noisy"), ("noisy", "cpu-1t")])
def test_float32Ops_recordedOnOneInterceptor_replayBitExactlyOnTheOther(trainer: str, auditor: str) -> None:
    """A noisy machine's float64 results differ from a clean one's by an ulp: without the log the
    float32 results of the two would differ; with it the auditor's equal the trainer's, bit for bit,
    whichever of the front and the Python mode records."""
    x = _inputs()
    log = StepLog()
    rec = _mode(trainer, "record", log)
    with rec:
        recorded = _norm_and_rotary(x)
    rep = _mode(auditor, "replay", log)
    with rep:
        replayed = _norm_and_rotary(x)
    rep.finish()  # the log is used up exactly: the two made the same records in the same order
    assert rec.op_index == rep.op_index > 0
    for a, b in zip(recorded, replayed, strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert torch.equal(a, b)
    assert rep.corrections + rec.corrections > 0  # the noise moved some value across a boundary


def _defaulted(x: Tensor) -> list[Tensor]:
    """Float32 results in torch's default dtype from no float32 argument: Phimoe's router (a
    Python float with a boolean mask), a true division of integers, a factory in the default dtype
    and a transcendental op on its result."""
    mask = x > 0
    ranks = torch.argsort(x, dim=-1)
    steps = torch.arange(0.0, 1.0, 0.3)
    return [torch.add(0.3333, mask, alpha=0.6667), ranks / 7, steps, (ranks / 3).sin()]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["record", "round"])
def test_aFloat32ResultInTheDefaultDtype_inAStep_isItsFloat64TwinRounded(profile: str, mode: str) -> None:
    """A float32 result made from no float32 argument (torch's default dtype) is the same call's
    float64 result under a float64 default, rounded as any and logged: it was refused as the
    machine's own."""
    x = _inputs()
    rm = _mode(profile, mode, StepLog())
    with rm:
        got = _defaulted(x)
    assert rm.via_front == (profile == "cpu-1t" and front.available())
    assert all(t.dtype == torch.float32 for t in got)
    assert rm.op_index == 5  # each op logged (the sine's float32 argument widened as before)
    if profile == "cpu-1t":  # no noise: the float64 result, to nearest
        mask, ranks = x > 0, torch.argsort(x, dim=-1).to(torch.float64)
        want = [
            0.3333 + 0.6667 * mask.to(torch.float64),
            ranks / 7,
            torch.arange(0.0, 1.0, 0.3, dtype=torch.float64),
        ]
        want.append(rounding.rnd(ranks / 3, BITS).sin())
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g.to(torch.float64), rounding.rnd(w, BITS))


@pytest.mark.parametrize(("trainer", "auditor"), [("cpu-1t", "noisy"), ("noisy", "cpu-1t")])
def test_defaultDtypeResults_recordedOnOneInterceptor_replayBitExactlyOnTheOther(
    trainer: str, auditor: str
) -> None:
    """The front and the Python mode make the same twins of a default-dtype result: a record on
    one replays on the other with the log used up exactly and equal values."""
    x = _inputs()
    log = StepLog()
    rec = _mode(trainer, "record", log)
    with rec:
        recorded = _defaulted(x)
    rep = _mode(auditor, "replay", log)
    with rep:
        replayed = _defaulted(x)
    rep.finish()
    assert rec.op_index == rep.op_index == 5
    for a, b in zip(recorded, replayed, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["record", "round"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_anInexactHalfResult_isItsFloat64TwinRoundedAndConverted(
    profile: str, mode: str, dtype: torch.dtype
) -> None:
    """Half and bfloat16 are widened in a step too (``IN_STEP``; they were refused, and
    ``torch.optim.Muon`` with them): the result keeps its dtype and, without noise, is the float64
    twin rounded to the grid and converted. Data movement into them passes as it is."""
    x = torch.linspace(0.1, 2.0, 7, dtype=torch.float64)
    rm = _mode(profile, mode, StepLog())
    with rm:
        out = torch.exp(x.to(dtype) * 2.0)
    assert out.dtype == dtype and rm.op_index > 0
    if profile == "cpu-1t":
        assert torch.equal(out, rounding.rnd(torch.exp(x.to(dtype).double() * 2.0), BITS).to(dtype))


class _Rotary(nn.Module):
    """A rotary table made as transformers' Llama makes it, in float32, at construction."""

    def __init__(self) -> None:
        super().__init__()
        dim = 16
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq)
        self.proj = nn.Linear(dim, dim)


def test_aFloat32InexactOp_atConstruction_isItsFloat64TwinToNearest() -> None:
    built = init_module(_Rotary, seed=5)
    exponents = torch.arange(0, 16, 2, dtype=torch.float64) / 16
    expected = 1.0 / rounding.rnd(10000.0**exponents, BITS)  # each op's float64 twin, to nearest
    assert torch.equal(built.inv_freq, rounding.rnd(expected, BITS))
    assert torch.equal(init_module(_Rotary, seed=5).inv_freq, built.inv_freq)


def _twin_call(call: Callable[[], object]) -> tuple[tuple[object, ...], dict[str, object]]:
    captured: dict[str, object] = {}

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            captured.setdefault("call", (args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Spy():
        call()
    args, kwargs = captured["call"]  # type: ignore[misc]
    return widen.widened(args, kwargs)  # type: ignore[arg-type]


def test_widened_copiesFloat32TensorsAndDtypes_andLeavesTheRest() -> None:
    a = torch.ones(3, dtype=torch.float32)
    args, kwargs = _twin_call(lambda: torch.sum(a, dtype=torch.float32))
    assert isinstance(args[0], Tensor) and args[0].dtype == torch.float64 and args[0] is not a
    assert kwargs["dtype"] is torch.float64
    ints = torch.arange(3)
    args, _ = _twin_call(lambda: torch.cat([a, a.double(), ints.float()]))
    assert [t.dtype for t in args[0]] == [torch.float64] * 3  # type: ignore[union-attr]
    assert not widen.narrow_inputs((ints, 2.0), {"dtype": torch.float64})
