"""Poisson and binomial counts in a step (dispatch/counts.py).

Why: ``torch.poisson``, ``torch.binomial`` and ``torch.distributions``' ``Poisson`` and
``Binomial`` samples were refused (torch's kernels draw from its generator and take logarithms in
the machine's libm). They are now torch's own methods (below a mean of 10 a direct one, from there
a transformed rejection) written with ordinary ops over served uniforms: the counts must follow
their law on both sides of the switch, give the same bits recorded through the C++ front and
replayed through the Python mode on another profile, and a user's task that draws them must train,
audit and be judged alike.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch.counts import REJECTION_FROM, binomial, poisson
from game.training.dispatch.draws import Draws
from game.training.dispatch.initmode import init_module
from game.training.engine.replay import replay_transcript_step
from tests.training.test_carried import _body
from tests.training.test_stockops import _across_interceptors, _ops
from tests.training.test_task_api import trains_and_audits

N = 20_000


def _fits(x: Tensor, cdf: Tensor, mean: float, var: float) -> None:
    """``N`` whole counts whose empirical CDF at 0, 1, ... is within the 1% Kolmogorov-Smirnov
    value 1.63 / sqrt(N) of ``cdf`` (conservative for a discrete law), and whose mean is within 4
    standard errors of ``mean``."""
    assert bool((x >= 0).all()) and torch.equal(x, x.floor())
    k = torch.arange(0, len(cdf), dtype=torch.float64)
    empirical = (x[None, :] <= k[:, None]).double().mean(1)
    assert float((empirical - cdf).abs().max()) < 1.63 / math.sqrt(N)
    assert abs(float(x.mean()) - mean) < 4 * math.sqrt(var / N)


@pytest.mark.parametrize("rate", [0.4, 3.0, 9.5, REJECTION_FROM, 37.0, 1500.0])
def test_counts_followThePoissonLaw(rate: float) -> None:
    """Poisson(rate)'s CDF is the regularised upper incomplete gamma function at k + 1."""
    x = poisson(Draws(5, 1, "test"), "p", torch.full((N,), rate, dtype=torch.float64))
    k = torch.arange(0, int(x.max()) + 1, dtype=torch.float64)
    _fits(x, torch.special.gammaincc(k + 1.0, torch.tensor(rate, dtype=torch.float64)), rate, rate)


@pytest.mark.parametrize(
    ("n", "p"),
    [
        (5, 0.3),
        (40, 0.2),
        (60, 0.9),
        (50, REJECTION_FROM / 50),
        (400, 0.45),
        (10_000, 0.97),
        (7, 0.0),
        (7, 1.0),
    ],
)
def test_counts_followTheBinomialLaw(n: int, p: float) -> None:
    """Binomial(n, p)'s CDF summed from its probabilities (by lgamma, in float64), on both sides
    of the switch and of p = 1/2 (counts taken from n)."""
    x = binomial(
        Draws(5, 1, "test"), "b", torch.full((N,), float(n)), torch.full((N,), p, dtype=torch.float64)
    )
    assert bool((x <= n).all())
    k, nn, pp = (
        torch.arange(n + 1, dtype=torch.float64),
        torch.tensor(float(n)),
        torch.tensor(p, dtype=torch.float64),
    )
    log_pmf = torch.lgamma(nn + 1) - torch.lgamma(k + 1) - torch.lgamma(nn - k + 1)
    pmf = torch.exp(log_pmf + torch.xlogy(k, pp) + torch.xlogy(nn - k, 1 - pp))
    _fits(x, pmf.cumsum(0), n * p, max(n * p * (1 - p), 1e-12))


def test_counts_areTheSameBits_recordedAndReplayedOnAnotherProfile() -> None:
    """Recorded through the C++ front on ``cpu-1t`` and replayed through the Python mode on
    ``noisy`` (the methods' exp, log, log1p and lgamma rounded with the log, so every comparison
    is between the same grid values), the counts are equal bit for bit, means on both sides of the
    switch in one call; a zero rate gives zeros, and another step draws others."""

    def draw() -> list[Tensor]:
        rates = torch.tensor([[0.0, 0.7, 4.0, 9.9], [10.0, 25.0, 300.0, 2.5]], dtype=torch.float64)
        n = torch.tensor([[3.0, 30.0, 200.0, 1000.0]], dtype=torch.float64)
        p = torch.tensor([[0.5], [0.1], [0.93]], dtype=torch.float64)
        return [
            torch.poisson(rates.expand(16, 2, 4)),
            torch.distributions.Poisson(torch.full((3,), 60.0, dtype=torch.float64)).sample((32,)),
            torch.binomial(n.expand(3, 4).repeat(8, 1), p.repeat(8, 4)),
            torch.distributions.Binomial(50, probs=torch.full((4,), 0.4, dtype=torch.float64)).sample((16,)),
        ]

    recorded, replayed, ops = _across_interceptors(draw)
    assert ops.drawn > 0
    for r, p in zip(recorded, replayed, strict=True):
        assert torch.equal(r, p)
    counts, _, trials, _ = recorded
    assert bool((counts[:, 0, 0] == 0).all()) and len(counts[:, 1, 2].unique()) > 8
    assert bool((trials <= torch.tensor([3.0, 30.0, 200.0, 1000.0])).all()) and len(trials[:, 3].unique()) > 8
    with _ops(step=5):
        other = draw()
    assert not torch.equal(other[0], counts)


def test_aNegativeRate_isTorchsOwnError_andAFractionalCountIsRefused() -> None:
    with _ops(), pytest.raises(RuntimeError, match="non-negative"):
        torch.poisson(torch.tensor([1.0, -1.0], dtype=torch.float64))
    with _ops(), pytest.raises(UnsupportedOpError, match=r"torch\.binomial: a count of 2\.5"):
        torch.binomial(torch.tensor([2.5], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64))


def test_aUsersShotNoiseTask_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """Poisson shot noise on the input (a photon-count augmentation), a count drawn from the
    model's own rate and a binomial thinning by its own probabilities: trained on ``cpu-1t``, audited on ``noisy``; the judge's re-run of step 3
    gives the trainer's leaf."""
    body = _body(
        "        photons = torch.poisson((x.abs() * 20.0).detach()) / 20.0\n"
        "        h = torch.tanh(self.a(x + photons))\n"
        "        k = torch.distributions.Poisson(F.softplus(h).detach() * 12.0).sample()\n"
        "        kept = torch.binomial(torch.full_like(h, 30.0), torch.sigmoid(h).detach()) / 30.0\n"
        "        return self.b(h * kept + 0.01 * k)",
        "",
    )
    trains_and_audits(tmp_path, body, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript


def test_atConstruction_smallRatesAreDrawn_andLargeOnesRefusedAtLgamma() -> None:
    """At a model's construction ``exp``, ``log`` and the products are rounded to nearest (the
    same on every machine), so Poisson counts below rate 10 and binomial counts (both methods) are
    drawn from the seed; PTRS's ``lgamma`` is an inexact op there, refused where its value decides
    the model."""

    def build(rate: float, n: float = 0.0) -> torch.nn.Module:
        m = torch.nn.Linear(2, 2)
        m.register_buffer("n", torch.poisson(torch.full((64,), rate)))
        m.register_buffer("b", torch.binomial(torch.full((64,), n), torch.full((64,), 0.3)))
        return m

    for n in (10.0, 100.0):
        first, again, other = (init_module(lambda n=n: build(3.0, n), seed=s) for s in (1, 1, 2))
        for name, mean in (("n", 3.0), ("b", 0.3 * n)):
            got = getattr(first, name)
            assert torch.equal(got, getattr(again, name)) and not torch.equal(got, getattr(other, name))
            assert abs(float(got.mean()) - mean) < 4 * math.sqrt(mean / 64) and torch.equal(got, got.floor())
    with pytest.raises(UnsupportedOpError, match=r"model construction: .*aten\.lgamma"):
        init_module(lambda: build(30.0), seed=1)
