"""Poisson samples in a step (dispatch/poissons.py).

Why: ``torch.poisson`` and ``torch.distributions.Poisson(rate).sample()`` were refused (torch's
kernel draws from its generator and takes logarithms in the machine's libm). They are now torch's
own two methods (multiplied uniforms below rate 10, transformed rejection from there) written with
ordinary ops over served uniforms: the counts must follow the Poisson law on both sides of the
switch, give the same bits recorded through the C++ front and replayed through the Python mode on
another profile, and a user's task that draws them must train, audit and be judged alike.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from game.errors import UnsupportedOpError
from game.training.dispatch.draws import Draws
from game.training.dispatch.initmode import init_module
from game.training.dispatch.poissons import PTRS_FROM, poisson
from game.training.engine.replay import replay_transcript_step
from tests.training.test_carried import _body
from tests.training.test_stockops import _across_interceptors, _ops
from tests.training.test_task_api import trains_and_audits

N = 20_000


@pytest.mark.parametrize("rate", [0.4, 3.0, 9.5, PTRS_FROM, 37.0, 1500.0])
def test_counts_followThePoissonLaw(rate: float) -> None:
    """The largest distance between the empirical CDF of ``N`` counts and Poisson(rate)'s (the
    regularised upper incomplete gamma function at k + 1) is below the 1% Kolmogorov-Smirnov
    value 1.63 / sqrt(N) (conservative for a discrete law), and the mean within 4 standard errors."""
    x = poisson(Draws(5, 1, "test"), "p", torch.full((N,), rate, dtype=torch.float64))
    assert bool((x >= 0).all()) and torch.equal(x, x.floor())
    k = torch.arange(0, int(x.max()) + 1, dtype=torch.float64)
    cdf = torch.special.gammaincc(k + 1.0, torch.tensor(rate, dtype=torch.float64))
    empirical = (x[None, :] <= k[:, None]).double().mean(1)
    assert float((empirical - cdf).abs().max()) < 1.63 / math.sqrt(N)
    assert abs(float(x.mean()) - rate) < 4 * math.sqrt(rate / N)


def test_poissonCounts_areTheSameBits_recordedAndReplayedOnAnotherProfile() -> None:
    """Recorded through the C++ front on ``cpu-1t`` and replayed through the Python mode on
    ``noisy`` (the methods' exp, log and lgamma rounded with the log, so every comparison is
    between the same grid values), the counts are equal bit for bit, rates on both sides of the
    switch in one call; a zero rate gives zeros, and another step draws others."""

    def draw() -> list[Tensor]:
        rates = torch.tensor([[0.0, 0.7, 4.0, 9.9], [10.0, 25.0, 300.0, 2.5]], dtype=torch.float64)
        return [
            torch.poisson(rates.expand(16, 2, 4)),
            torch.distributions.Poisson(torch.full((3,), 60.0, dtype=torch.float64)).sample((32,)),
        ]

    recorded, replayed, ops = _across_interceptors(draw)
    assert ops.drawn > 0
    for r, p in zip(recorded, replayed, strict=True):
        assert torch.equal(r, p)
    counts, _ = recorded
    assert bool((counts[:, 0, 0] == 0).all()) and len(counts[:, 1, 2].unique()) > 8
    with _ops(step=5):
        other = draw()
    assert not torch.equal(other[0], counts)


def test_aNegativeRate_isTorchsOwnError() -> None:
    with _ops(), pytest.raises(RuntimeError, match="non-negative"):
        torch.poisson(torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_aUsersShotNoiseTask_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """Poisson shot noise on the input (a photon-count augmentation) and a count drawn from the
    model's own rate: trained on ``cpu-1t``, audited on ``noisy``; the judge's re-run of step 3
    gives the trainer's leaf."""
    body = _body(
        "        photons = torch.poisson((x.abs() * 20.0).detach()) / 20.0\n"
        "        h = torch.tanh(self.a(x + photons))\n"
        "        k = torch.distributions.Poisson(F.softplus(h).detach() * 12.0).sample()\n"
        "        return self.b(h + 0.01 * k)",
        "",
    )
    trains_and_audits(tmp_path, body, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript


def test_atConstruction_smallRatesAreDrawn_andLargeOnesRefusedAtLgamma() -> None:
    """At a model's construction ``exp`` and the products are rounded to nearest (the same on
    every machine), so counts below rate 10 are drawn from the seed; transformed rejection's
    ``lgamma`` is an inexact op there, refused where its value decides the model."""

    def build(rate: float) -> torch.nn.Module:
        m = torch.nn.Linear(2, 2)
        m.register_buffer("n", torch.poisson(torch.full((64,), rate)))
        return m

    first, again, other = (init_module(lambda: build(3.0), seed=s).n for s in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert abs(float(first.mean()) - 3.0) < 4 * math.sqrt(3.0 / 64) and torch.equal(first, first.floor())
    with pytest.raises(UnsupportedOpError, match=r"model construction: .*aten\.lgamma"):
        init_module(lambda: build(30.0), seed=1)
