"""An op whose result is complex (an FFT: FNet's token mixing, a spectral layer) or sparse (an
``nn.Embedding(sparse=True)``'s gradient) in a step.

Why: a complex128 result was neither rounded nor logged. An FFT's last bits differ from library to
library (pocketfft, MKL, cuFFT), so an auditor's ops after it computed on other values and an
honest trainer failed its audit (here at step 3 of 4 against the ``noisy`` profile). Now its (real,
imaginary) lanes are rounded with the log like any inexact result, through the Python mode and the
C++ front alike; an FFT of float32 tensors is computed in float64 and brought back, as any float32
op is; and a complex64 result that cannot be is refused, as a float32 one is. A sparse gradient
stopped inside the rounding kernels with torch's words on memory formats; it is refused by name.
A complex parameter drawn at construction was refused there; it is served.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from game.errors import UnsupportedOpError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.engine.train import train
from game.training.log.formats import new_step_log
from game.training.native import front
from game.training.numerics import rounding
from game.training.task.config import load_config
from tests.training.test_task_api import TASK_PY, make_plugin, trains_and_audits

FORWARDS = {
    "float64": (
        "        h = self.a(x)\n"
        "        f = torch.fft.rfft(h, dim=-1)\n"
        "        return self.b(torch.fft.irfft(f * 0.5, n=h.shape[-1]) + h)"
    ),
    "branches": (  # one complex tensor into three: its gradient summed, a modulus, an angle
        "        h = self.a(x)\n"
        "        f = torch.fft.rfft(h, dim=-1)\n"
        "        g = (f * f.conj()).real + f.abs() + torch.angle(f)\n"
        "        return self.b(torch.fft.irfft(f * 2j, n=h.shape[-1]) + g.sum(-1, keepdim=True) * 0.01 + h)"
    ),
    "float32": (
        "        h = self.a(x)\n"
        "        f = torch.fft.fft(h.float(), dim=0)\n"
        "        return self.b(torch.fft.ifft(f * f.abs().mean(), dim=0).real.double() + h)"
    ),
}


@pytest.mark.parametrize("precision", sorted(FORWARDS))
def test_aModelWithAnFFT_trainsAndAuditsBitExactlyAgainstOtherMachines(
    tmp_path: Path, precision: str
) -> None:
    """Trained through the C++ front on ``cpu-1t``; audited through the Python mode on ``noisy``
    (each inexact result perturbed, as another machine's last bits are) and ``splitk-16``."""
    body = TASK_PY.replace("        return self.b(torch.tanh(self.a(x)))", FORWARDS[precision])
    root = trains_and_audits(tmp_path / "noisy", body, steps=8)
    assert root == trains_and_audits(tmp_path / "splitk", body, steps=8)


#: A complex parameter, and how a model makes it at construction.
COMPLEX_PARAMETERS = {
    "randn": "torch.randn(hidden, dtype=torch.complex128)",
    # FNO's spectral weights, written with real draws: torch.complex packs them, a move
    "complex_of_real_draws": "torch.complex(0.1 * torch.rand(hidden), 0.1 * torch.rand(hidden))",
}


@pytest.mark.parametrize("made", sorted(COMPLEX_PARAMETERS))
def test_aModelWithAComplexParameter_trainsAndAuditsBitExactly(tmp_path: Path, made: str) -> None:
    """A complex parameter drawn at construction was refused there (``torch.randn`` of a complex
    dtype was torch's generator's; ``torch.complex`` an inexact op whose result reached the
    parameter); it is drawn from the counter RNG and packed as a move, and the model trains on
    ``cpu-1t`` and audits on ``noisy`` (Adam's foreach path updates it as real lanes)."""
    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        f = torch.fft.fft(self.a(x), dim=-1) * self.w\n        return self.b(torch.fft.ifft(f, dim=-1).real)",
    ).replace(
        "        self.b = nn.Linear(hidden, 3)\n",
        f"        self.b = nn.Linear(hidden, 3)\n        self.w = nn.Parameter({COMPLEX_PARAMETERS[made]})\n",
    )
    trains_and_audits(tmp_path, body, steps=4)


def test_aComplexParameterScaledAsAComplexTensor_isRefusedSayingHowToScaleItsParts(tmp_path: Path) -> None:
    """FNO's ``scale * torch.rand(..., dtype=torch.cfloat)``: a product with a complex tensor is
    inexact, so its result may not reach the model's state; the refusal says how to make it exact."""
    body = TASK_PY.replace(
        "        self.b = nn.Linear(hidden, 3)\n",
        "        self.b = nn.Linear(hidden, 3)\n"
        "        self.w = nn.Parameter(0.1 * torch.rand(hidden, dtype=torch.cfloat))\n",
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml")
    with pytest.raises(UnsupportedOpError, match=r"reached w, .*torch\.complex\(s \* torch\.rand\(n\)"):
        train(cfg, "cpu-1t", tmp_path / "t")


@pytest.mark.parametrize("via_front", [False, True])
def test_aComplexResult_isOnTheGrid_andLogged(via_front: bool) -> None:
    """Both interceptors round a complex128 result's lanes to the float32 grid (so every machine's
    next op starts from the same values): an FFT's and a complex product's with the log, a sum's
    (componentwise, IEEE's) without; a complex tensor's modulus is logged, a real one's not."""
    if via_front and not front.available():
        pytest.skip("no C++ front here")
    x = rounding.round_(
        torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), 32
    )
    profile = get_profile("cpu-1t")
    rm = RoundingMode(
        bits=32, tau=0.25, mode="record", profile=profile, step=1, log=new_step_log("sparse", 1)
    )
    with contextlib.nullcontext() if via_front else front.disabled(), profile.apply(), rm:
        f = torch.fft.rfft(x, dim=-1)
        g = f * (0.5 + 0.25j)  # a complex product: not exact either
        s = f + g  # componentwise: exact, rounded without the log
        m = f.abs()  # a hypot: inexact on a complex tensor, exact on a real one
        x.abs()
    rm.finish()
    assert rm.via_front == via_front
    for t in (f, g, s):
        lanes = torch.view_as_real(t)
        assert torch.equal(lanes, lanes.float().double()), "a complex result off the grid"
    assert torch.equal(m, m.float().double())
    assert rm.logged["aten._fft_r2c.default"] == 1 and rm.logged["aten.mul.Tensor"] == 1
    assert rm.logged["aten.abs.default"] == 1 and rm.rounded["aten.abs.default"] == 1  # m, then r
    assert rm.rounded["aten.add.Tensor"] == 1 and not rm.logged["aten.add.Tensor"]


def test_aComplex64ResultThatCannotBeWidened_isRefusedByName() -> None:
    """A complex64 result of an op with no float32 or complex64 argument to widen (a complex128 sum
    asked for in complex64) would be this machine's own: refused, naming the op and its dtype."""
    x = torch.ones(4, dtype=torch.float64)
    profile = get_profile("cpu-1t")
    rm = RoundingMode(
        bits=32, tau=0.25, mode="record", profile=profile, step=1, log=new_step_log("sparse", 1)
    )
    with (
        front.disabled(),
        profile.apply(),
        rm,
        pytest.raises(
            UnsupportedOpError, match=r"step 1: aten\.sum\.\w+ gives a complex64 result, which is not rounded"
        ),
    ):
        torch.view_as_complex(torch.stack([x, x], -1)).sum(dtype=torch.complex64)


SPARSE_PY = TASK_PY.replace(
    "        return self.b(torch.tanh(self.a(x)))",
    "        idx = (x.abs() * 3).long().clamp(max=9)\n"
    "        return self.b(self.e(idx).mean(1) + torch.tanh(self.a(x)))",
).replace(
    "        self.b = nn.Linear(hidden, 3)\n",
    "        self.b = nn.Linear(hidden, 3)\n        self.e = nn.Embedding(10, hidden, sparse=SPARSE)\n",
)


@pytest.mark.parametrize("via_front", [False, True])
def test_aSparseGradient_isRefusedAtStep1ByName_andTheDenseOneTrains(tmp_path: Path, via_front: bool) -> None:
    if via_front and not front.available():
        pytest.skip("no C++ front here")
    body = SPARSE_PY.replace("sparse=SPARSE", "sparse=True").replace(
        "        init_weights=",
        "        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=cfg.lr),\n        init_weights=",
    )
    name = make_plugin(tmp_path / "sparse", body)
    cfg = load_config(tmp_path / "sparse" / "task.toml").replace(steps=2)
    assert name in cfg.task
    with (
        contextlib.nullcontext() if via_front else front.disabled(),
        pytest.raises(
            UnsupportedOpError,
            match=r"step 1: aten\.\w+.* gives a sparse \(sparse_coo\) result.*sparse=False",
        ),
    ):
        train(cfg, "cpu-1t", tmp_path / "sparse" / "t")
    trains_and_audits(tmp_path / "dense", body.replace("sparse=True", "sparse=False"), steps=2)
