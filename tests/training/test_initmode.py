"""Deterministic construction of a stock model (issue 43): every draw served from the counter RNG at
step 0, exact ops let through, any other op refused at once; the same bits on every thread count
and in every process."""

from __future__ import annotations

import contextlib
import hashlib
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from game.errors import ConfigError, UnsupportedOpError
from game.training.dispatch.initmode import InitMode, init_module
from game.training.numerics import rng

SEED = 21
ROOT = Path(__file__).resolve().parents[2]


class EveryLayer(nn.Module):
    """One of each stock layer type the brief names, plus a bool buffer made with tril and a
    parameter drawn with torch.randn in the constructor."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 8)
        self.conv = nn.Conv2d(2, 4, 3)
        self.embed = nn.Embedding(12, 8, padding_idx=0)
        self.ln = nn.LayerNorm(8)
        self.bn = nn.BatchNorm2d(4)
        self.mha = nn.MultiheadAttention(8, 2)
        self.encoder = nn.TransformerEncoderLayer(8, 2, 16)
        self.noise = nn.Parameter(torch.randn(3, 4) * 0.5)
        self.register_buffer("causal", torch.ones(5, 5, dtype=torch.bool).tril())


def state_digest(model: nn.Module) -> str:
    """SHA-256 over every tensor of the state, by name, as raw bytes."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode() + str(t.dtype).encode() + t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_everyStockLayer_isFloat64_andIndependentOfTheThreadCount() -> None:
    before = torch.get_num_threads()
    digests = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model = init_module(EveryLayer, seed=SEED)
            digests.append(state_digest(model))
    finally:
        torch.set_num_threads(before)
    assert digests[0] == digests[1]
    floats = [t for t in model.state_dict().values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float64 for t in floats)
    assert torch.equal(model.embed.weight[0], torch.zeros(8, dtype=torch.float64))  # padding row
    assert state_digest(init_module(EveryLayer, seed=SEED + 1)) != digests[0]


def test_everyStockLayer_sameBitsInAnotherProcess() -> None:
    script = (
        "import torch; from tests.training.test_initmode import EveryLayer, state_digest, SEED; "
        "from game.training.dispatch.initmode import init_module; "
        "torch.manual_seed(12345); torch.set_num_threads(2); "  # torch's own generator plays no part
        "print(state_digest(init_module(EveryLayer, seed=SEED)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip() == state_digest(init_module(EveryLayer, seed=SEED))


def test_linearWeight_isTheDocumentedDraw() -> None:
    """nn.Linear's kaiming_uniform_ is the first draw: purpose init/0/kaiming_uniform_, 53-bit
    uniforms at step 0, mapped by u * 2b - b with torch's bound b = 1/sqrt(fan_in)."""
    model = init_module(lambda: nn.Linear(9, 4), seed=SEED)
    bound = math.sqrt(3.0) * (math.sqrt(2.0 / (1 + 5)) / math.sqrt(9))  # gain(leaky_relu, sqrt 5) / sqrt(fan)
    u = rng.uniform(SEED, 0, "init/0/kaiming_uniform_", None, (4, 9))
    assert torch.equal(model.weight.detach(), u * (2 * bound) - bound)
    u = rng.uniform(SEED, 0, "init/1/uniform_", None, (4,))
    assert torch.equal(model.bias.detach(), u * (2 / 3) - 1 / 3)


def test_defaultDtype_isFloat64Inside_andRestoredAfterAnError() -> None:
    before = torch.get_default_dtype()
    with pytest.raises(UnsupportedOpError), InitMode(SEED):
        assert torch.get_default_dtype() == torch.float64
        torch.ops.aten.bernoulli.default(torch.full((3,), 0.5))  # ATen's own draw: refused at once
    assert torch.get_default_dtype() == before


def test_explicitFloat32_isWidenedExactly() -> None:
    model = init_module(lambda: nn.Linear(3, 2, dtype=torch.float32), seed=SEED)
    assert model.weight.dtype == torch.float64
    assert torch.equal(model.weight, model.weight.float().double())


def test_trainingTimeDropout_inTheFactory_passes() -> None:
    """Eval-mode-free construction: dropout modules draw nothing until called."""
    model = init_module(lambda: nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)), seed=SEED)
    assert isinstance(model[1], nn.Dropout)


@pytest.mark.parametrize(
    ("initialiser", "op"),
    [
        (lambda t: t.uniform_(-1, 1).erfinv_(), "erfinv"),  # the old trunc_normal_'s inverse CDF
        (lambda t: t.copy_(torch.full((3, 3), 2.0).lgamma()), "lgamma"),
        (lambda t: t.copy_(torch.ones(3, 3).logcumsumexp(0)), "logcumsumexp"),
        (lambda t: t.copy_(torch.ones(3, 3).cumsum(0, dtype=torch.half)), "cumsum"),  # a half scan
        (lambda t: t.copy_(torch.full((3, 3), 2.0).digamma()), "digamma"),
    ],
)
def test_inexactInitialiser_isRefusedNamingTheOp(initialiser: Callable[[Tensor], Any], op: str) -> None:
    """An inexact op's result kept in the model's state (provisional.py): refused, naming it."""

    class Initialised(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(3, 3))
            with torch.no_grad():
                initialiser(self.weight)

    with pytest.raises(UnsupportedOpError, match=op) as caught:
        init_module(Initialised, seed=SEED)
    assert "init_weights" in str(caught.value) or "transcendental" in str(caught.value)


@pytest.mark.parametrize(
    "initialiser",
    [
        lambda t: nn.init.trunc_normal_(t, std=0.02),  # within +-2 std: exact rejection sampling
        lambda t: nn.init.xavier_normal_(t),
        lambda t: nn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu"),
        lambda t: nn.init.sparse_(t, 0.5),
        lambda t: t.fill_(0.25).mul_(3.0).add_(torch.ones(3, 3)),
        # a narrow cut: rejection sampling in logs, each op rounded to nearest float32
        lambda t: nn.init.trunc_normal_(t, 0.0, 1.0, 2.0, 3.0).clamp_(2.0, 3.0).sub_(2.0).pow_(0.5),
        lambda t: t.exponential_(),  # a served uniform's log, rounded to nearest
        lambda t: t.cauchy_(),  # and its tangent
        lambda t: t.log_normal_(),  # a served normal's exponential
    ],
)
def test_exactInitialisers_passAndRepeat(initialiser: Callable[[Tensor], Any]) -> None:
    made = []
    for _ in range(2):
        with InitMode(SEED):
            t = torch.empty(3, 3)
            initialiser(t)
        made.append(t)
    assert made[0].dtype == torch.float64 and torch.equal(made[0], made[1])


def test_metaTensors_passWhateverTheOp() -> None:
    """A model built on "meta" (to be loaded later) has no values that could differ."""
    with InitMode(SEED) as mode:
        model = nn.Linear(3, 4, device="meta")
        drawn = torch.rand(3, device="meta").exp()
        normed = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 2, 3, device="meta"), dim=2)
    assert model.weight.is_meta and drawn.is_meta and mode.draws.ordinal == 0
    assert normed.weight.is_meta


def test_factoryReturningNoModule_isConfigError() -> None:
    with pytest.raises(ConfigError, match=r"not an nn\.Module"):
        init_module(lambda: torch.ones(2), seed=SEED)  # type: ignore[arg-type,return-value]


def test_aDrawReachingATenWithItsDefaultsLeftOut_isServedAsTheFunctionsIs() -> None:
    """While transformers initialises a model it swaps ``nn.init``'s functions for guarded copies,
    and their draw reaches ATen, where it is served (``_FILLS``). The dispatcher leaves out a
    trailing argument equal to its default: T5 draws ``normal_(w, mean=0.0, std=1.0)``, which came
    as ``normal_(w)`` and was refused. It is served with the defaults, as the function mode serves
    the unswapped call."""
    initialization = pytest.importorskip("transformers.initialization")

    class Net(nn.Module):
        def __init__(self, guarded: bool) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 4)
            with initialization.guard_torch_init_functions() if guarded else contextlib.nullcontext():
                nn.init.normal_(self.a.weight, mean=0.0, std=1.0)
                nn.init.uniform_(self.b.weight, a=0.0, b=1.0)

    plain = init_module(lambda: Net(guarded=False), seed=3)
    guarded = init_module(lambda: Net(guarded=True), seed=3)
    for p, q in zip(plain.parameters(), guarded.parameters(), strict=True):
        assert torch.equal(p, q)
    assert float(guarded.a.weight.detach().std()) > 0.5  # a unit normal, not Linear's own uniform
    assert float(guarded.b.weight.detach().min()) >= 0.0


@pytest.mark.parametrize(
    ("start", "end", "steps"),
    [(0, 0.1, 7), (0.0, 0.0, 4), (-1.5, 2.25, 13), (1e-3, 3, 2), (2.5, -7, 1), (0, 1, 0), (0.1, 0.7, 1000)],
)
def test_linspace_atConstruction_isEachValueRoundedOnce(start: float, end: float, steps: int) -> None:
    """Vision models (ConvNeXt, SegFormer, PVT, ...) take their stochastic-depth rates from
    ``torch.linspace`` at construction; torch's kernel rounds a step, then a product and a sum, in
    an order its vector code and each machine choose, so it was refused. It is served: each value
    is ``start + (end - start) * i / (steps - 1)`` worked out exactly and rounded once, as float64,
    and as float32 by way of it (to nearest, where no machine could round it otherwise)."""
    from fractions import Fraction

    a, b = Fraction(start), Fraction(end)
    want = [float(a + (b - a) * i / (steps - 1)) for i in range(steps)] if steps > 1 else [float(a)] * steps
    with InitMode(0):
        got = torch.linspace(start, end, steps)
        narrow = torch.linspace(start, end, steps, dtype=torch.float32)
    assert got.dtype == torch.float64 and got.tolist() == want
    assert narrow.dtype == torch.float32 and narrow.tolist() == torch.tensor(want).float().tolist()
    torch_own = torch.linspace(start, end, steps, dtype=torch.float64)
    assert torch.allclose(got, torch_own, rtol=1e-15, atol=1e-300)  # torch's values, up to its rounding


def test_cumsumAndCumprod_atConstruction_areTheRunningSumAndProductInOrder() -> None:
    """A diffusion model keeps ``alphas_cumprod = torch.cumprod(1 - betas, 0)`` as a buffer, made at
    construction; torch's scan kernels sum in an order of their own, so it was refused. It is
    served: the running sum or product taken one element after another in float64 (each step one
    IEEE operation, as Python's floats do it), cast to the op's dtype; an integer scan is exact and
    runs as it is."""

    class Schedule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            betas = torch.linspace(1e-4, 0.02, 1000)
            self.register_buffer("abar", torch.cumprod(1 - betas, 0))
            self.register_buffer("total", torch.rand(4, 37).cumsum(-1))
            self.register_buffer("narrow", torch.rand(50, dtype=torch.float32).cumsum(0))
            self.register_buffer("counts", torch.arange(1, 9).cumprod(0))
            self.scale = nn.Parameter(torch.randn(6).cumsum(0, dtype=torch.float32))

    before = torch.get_num_threads()
    built = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            built.append(init_module(Schedule, seed=SEED))
    finally:
        torch.set_num_threads(before)
    assert state_digest(built[0]) == state_digest(built[1])
    model = built[0]

    def running(values: list[float], combine: Callable[[float, float], float]) -> list[float]:
        out = [values[0]]
        for v in values[1:]:
            out.append(combine(out[-1], v))
        return out

    with InitMode(SEED):
        betas = torch.linspace(1e-4, 0.02, 1000)
    want_abar = running((1 - betas).tolist(), lambda a, b: a * b)
    assert model.abar.dtype == torch.float64 and model.abar.tolist() == want_abar
    assert model.abar[-1] < 1e-4  # the schedule itself, not just any product
    with InitMode(SEED):  # the same draws, in the same order
        torch.linspace(1e-4, 0.02, 1000)
        total_in = torch.rand(4, 37)
        narrow_in = torch.rand(50, dtype=torch.float32)
        torch.arange(1, 9)
        scale_in = torch.randn(6)
    assert model.total.tolist() == [running(row, lambda a, b: a + b) for row in total_in.tolist()]
    assert narrow_in.dtype == torch.float32  # a float32 scan's values, widened exactly with the model
    assert (
        model.narrow.tolist()
        == torch.tensor(running(narrow_in.tolist(), lambda a, b: a + b)).float().tolist()
    )
    assert model.counts.dtype == torch.int64 and model.counts.tolist() == [1, 2, 6, 24, 120, 720, 5040, 40320]
    assert (
        model.scale.tolist() == torch.tensor(running(scale_in.tolist(), lambda a, b: a + b)).float().tolist()
    )


def test_resizingTokenEmbeddingsAroundTheirMean_isRefusedNamingTheSwitch_andWithoutItIsBuilt() -> None:
    """transformers' ``resize_token_embeddings`` (adding special tokens before a fine-tune) draws
    the added rows from the old rows' mean and covariance, refused with the generic advice alone;
    the refusal now names ``mean_resizing=False``, with which the model builds the same twice."""
    transformers = pytest.importorskip("transformers")

    def gpt2(**resize: Any) -> nn.Module:
        cfg = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
        model = transformers.GPT2LMHeadModel(cfg)
        model.resize_token_embeddings(34, **resize)
        return model

    with pytest.raises(UnsupportedOpError, match=r"resize_token_embeddings .*mean_resizing=False") as caught:
        init_module(gpt2, seed=SEED)
    assert "mean_resizing=False" in (caught.value.fix or "")
    built = [init_module(lambda: gpt2(mean_resizing=False), seed=SEED) for _ in range(2)]
    assert built[0].get_input_embeddings().weight.shape[0] == 34
    assert state_digest(built[0]) == state_digest(built[1])
