"""Gamma, Beta and Dirichlet samples in a step (dispatch/gammas.py).

Why: mixup draws its weight from ``torch.distributions.Beta(a, a).sample()``, which was refused (a
transcendental rejection sampler in torch's kernel). It is now Marsaglia and Tsang's sampler
written with ordinary ops over served draws: it must follow the gamma law, give the same bits
recorded through the C++ front and replayed through the Python mode on another profile, keep the
reparameterised gradient of a learned concentration torch's, and a user's mixup task must train,
audit and be judged alike.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch.draws import Draws
from game.training.dispatch.gammas import standard_gamma
from game.training.dispatch.initmode import init_module
from game.training.engine.replay import replay_transcript_step
from tests.training.test_carried import LOSS, _body
from tests.training.test_stockops import _across_interceptors, _ops
from tests.training.test_task_api import trains_and_audits

N = 20_000


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 9.0])
def test_samples_followTheGammaLaw(alpha: float) -> None:
    """The Kolmogorov-Smirnov distance of ``N`` samples to Gamma(alpha, 1)'s CDF (the regularised
    incomplete gamma function) is below its 1% critical value, 1.63 / sqrt(N)."""
    d = Draws(5, 1, "test")
    x = standard_gamma(d, "g", torch.full((N,), alpha, dtype=torch.float64)).sort().values
    cdf = torch.special.gammainc(torch.tensor(alpha, dtype=torch.float64), x)
    i = torch.arange(1, N + 1, dtype=torch.float64)
    ks = float(torch.maximum(i / N - cdf, cdf - (i - 1) / N).max())
    assert bool((x > 0).all()) and ks < 1.63 / math.sqrt(N), ks
    assert abs(float(x.mean()) - alpha) < 4 * math.sqrt(alpha / N)


def test_betaGammaAndDirichletSamples_areTheSameBits_recordedAndReplayedOnAnotherProfile() -> None:
    """Recorded through the C++ front on ``cpu-1t`` and replayed through the Python mode on
    ``noisy`` (its ops rounded with the log: the accept test compares the same grid values on
    both), the samples are equal bit for bit; they are Beta's and Dirichlet's (in [0, 1], rows
    summing to 1) and another step draws others."""

    def draw() -> list[Tensor]:
        conc = torch.tensor([0.3, 1.0, 4.0], dtype=torch.float64)
        return [
            torch.distributions.Beta(0.4, 0.4).sample((64,)),
            torch.distributions.Gamma(torch.full((8, 3), 0.5, dtype=torch.float64), 2.0).sample(),
            torch.distributions.Dirichlet(conc).sample((8,)),
        ]

    recorded, replayed, ops = _across_interceptors(draw)
    assert ops.drawn > 0
    for r, p in zip(recorded, replayed, strict=True):
        assert torch.equal(r, p)
    beta, _, dirichlet = recorded
    assert bool(((beta >= 0) & (beta <= 1)).all()) and len(beta.unique()) > 32
    assert torch.allclose(dirichlet.sum(-1), torch.ones(8, dtype=torch.float64))
    with _ops(step=5):
        other = draw()
    assert not torch.equal(other[0], beta)


def test_rsampleOfALearnedConcentration_keepsTorchsGradient() -> None:
    """Gamma.rsample's gradient to its concentration is ``_standard_gamma_grad`` of the
    concentration and the sample (torch's implicit reparameterisation); in a step, an op of its
    own, rounded with the log as any."""
    alpha = torch.tensor([0.4, 1.5, 6.0], dtype=torch.float64, requires_grad=True)
    with _ops():
        g = torch.distributions.Gamma(alpha, 1.0).rsample()
        g.sum().backward()
    assert alpha.grad is not None
    assert torch.equal(alpha.grad, torch._standard_gamma_grad(alpha.detach(), g.detach()))


def test_aUsersMixupTask_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """Mixup with a Beta weight and a learned Dirichlet's rsample in the model: trained on
    ``cpu-1t``, audited on ``noisy``; the judge's re-run of step 3 gives the trainer's leaf."""
    body = _body(
        "        w = torch.distributions.Dirichlet(F.softplus(self.k) + 0.2).rsample((x.shape[0],))\n"
        "        return self.b(torch.tanh(self.a(x))) * w",
        "        self.k = nn.Parameter(torch.ones(3, dtype=torch.float64))\n",
        loss=LOSS.replace('lambda m, b: F.cross_entropy(m(b["x"]), b["y"])', "mixup"),
        before="def mixup(m, b):\n"
        "    lam = torch.distributions.Beta(0.4, 0.4).sample()\n"
        "    p = torch.arange(b['x'].shape[0]).flip(0)\n"
        "    out = m(lam * b['x'] + (1 - lam) * b['x'][p])\n"
        "    return lam * F.cross_entropy(out, b['y']) + (1 - lam) * F.cross_entropy(out, b['y'][p])\n\n\n",
    )
    trains_and_audits(tmp_path, body, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript


def test_aBetaSampleAtConstruction_isStillRefused() -> None:
    """At a model's construction the sampler's ops are inexact, refused as any op that is."""

    def build() -> torch.nn.Module:
        m = torch.nn.Linear(2, 2)
        m.s = torch.nn.Parameter(torch.distributions.Beta(2.0, 2.0).sample((2,)))
        return m

    with pytest.raises(UnsupportedOpError, match=r"model construction: .* is not exact"):
        init_module(build, seed=1)
