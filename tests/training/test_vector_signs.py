"""Eigenvectors' and singular vectors' signs in a step (dispatch/vectorsigns.py).

Why: a vector is unique only up to its sign, and another LAPACK build or cuSOLVER may give the
other; the rounding log cannot correct a sign, so a step that used ``eigh`` or ``svd`` vectors
computed otherwise on another machine and the honest trainer failed its audit. The ``noisy``
profile now emulates such a machine (every other vector negated); the served calls turn each
vector so that its first entry of largest magnitude is positive, and the two sides agree.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from game.training.dispatch.profiles import get_profile
from game.training.dispatch.vectorsigns import negative
from game.training.engine.replay import replay_transcript_step
from tests.training.test_carried import _body
from tests.training.test_stockops import _across_interceptors
from tests.training.test_task_api import trains_and_audits


def _matrices() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 4, dtype=torch.float64, generator=g)
    return a, a.mT @ a + torch.eye(4, dtype=torch.float64)


def test_noisyProfile_negatesEveryOtherVector_asAnotherLapackMay() -> None:
    a, sym = _matrices()
    noisy = get_profile("noisy")
    values, vectors = noisy.compute(torch.ops.aten._linalg_eigh.default, (sym,), {})
    ref_values, ref_vectors = torch.ops.aten._linalg_eigh.default(sym)
    assert torch.equal(values, ref_values)
    assert torch.equal(vectors[:, 0::2], ref_vectors[:, 0::2]) and torch.equal(
        vectors[:, 1::2], -ref_vectors[:, 1::2]
    )
    u, s, vh = noisy.compute(torch.ops.aten._linalg_svd.default, (a,), {"full_matrices": False})
    assert torch.allclose(u @ torch.diag(s) @ vh, a)
    assert not get_profile("cpu-1t").flips_vectors


def test_eighAndSvdVectors_areTheSameBits_recordedAndReplayedOnAMachineWithOtherSigns() -> None:
    """Recorded through the C++ front on ``cpu-1t``, replayed through the Python mode on
    ``noisy`` (other signs): every vector equal bit for bit, each with its largest entry positive,
    and the factorisations still the matrices'."""
    a, sym = _matrices()

    def run() -> list[Tensor]:
        values, q = torch.linalg.eigh(sym)
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        u2, _, v2 = torch.svd(a)
        return [values, q, u, s, vh, u2, v2, a.svd()[2]]

    recorded, replayed, _ = _across_interceptors(run)
    for r, p in zip(recorded, replayed, strict=True):
        assert torch.equal(r, p)
    values, q, u, s, vh, u2, v2, v3 = recorded
    for vectors in (q, u, u2):  # a right singular vector turns with its left one
        assert not bool(negative(vectors, -2).any())
    assert torch.allclose(q @ torch.diag(values) @ q.mT, sym) and torch.allclose(u @ torch.diag(s) @ vh, a)
    assert torch.allclose(u2 @ torch.diag(s) @ v2.mT, a) and torch.equal(v3, v2)


def test_aTaskUsingEighAndSvdVectors_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """A model that projects on its activations' eigenvectors and adds a right singular vector,
    gradients through both: trained on ``cpu-1t``, audited on ``noisy``; the judge's re-run of step
    3 gives the trainer's leaf."""
    body = _body(
        "        h = torch.tanh(self.a(x))\n"
        "        c = h.t() @ h / h.shape[0] + 0.1 * torch.eye(h.shape[1], dtype=h.dtype)\n"
        "        _, q = torch.linalg.eigh(c)\n"
        "        _, _, vh = torch.linalg.svd(h, full_matrices=False)\n"
        "        return self.b(h + 0.1 * (h @ q) + 0.1 * vh[0])"
    )
    trains_and_audits(tmp_path, body, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript
