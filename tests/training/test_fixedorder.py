"""Sums, products and QR served at construction (``orthogonal_``, a spectral norm, the ``orthogonal``
parametrization's ``geqrf`` and ``householder_product``): the same bits everywhere."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from game.training.dispatch import fixedorder
from game.training.dispatch.initmode import init_module
from game.training.engine.replay import replay_transcript_step
from tests.training.test_carried import _body
from tests.training.test_task_api import trains_and_audits


def _tree(values: list[float]) -> float:
    """The order :func:`fixedorder.tree_sum` promises, in Python floats (IEEE double)."""
    if not values:
        return 0.0
    while len(values) > 1:
        half = len(values) // 2
        values = [values[i] + values[half + i] for i in range(half)] + values[2 * half :]
    return values[0]


def _reference_qr(a: list[list[float]]) -> tuple[list[list[float]], list[list[float]]]:
    """Householder's QR in Python floats, one IEEE operation at a time, in the order the module
    gives: what every machine must reproduce bit for bit."""
    m, n = len(a), len(a[0])
    k = min(m, n)
    r = [row[:] for row in a]
    steps: list[tuple[list[float], float] | None] = []

    def reflect(rows: list[list[float]], top: int, v: list[float], scale: float) -> None:
        cols = len(rows[0])
        w = [_tree([v[i] * rows[top + i][c] for i in range(len(v))]) for c in range(cols)]
        for i in range(len(v)):
            vi = v[i] * scale
            rows[top + i] = [rows[top + i][c] - vi * w[c] for c in range(cols)]

    for j in range(k):
        x = [r[i][j] for i in range(j, m)]
        norm = math.sqrt(_tree([xi * xi for xi in x]))
        alpha = norm if x[0] < 0 else -norm
        v = [x[0] - alpha, *x[1:]]
        vv = _tree([vi * vi for vi in v])
        if vv == 0:
            steps.append(None)
            continue
        scale = 2.0 / vv
        block = [row[j:] for row in r[j:]]
        reflect(block, 0, v, scale)
        for i in range(j, m):
            r[i][j:] = block[i - j]
        r[j][j] = alpha
        for i in range(j + 1, m):
            r[i][j] = 0.0
        steps.append((v, scale))
    q = [[1.0 if i == c else 0.0 for c in range(k)] for i in range(m)]
    for j in reversed(range(k)):
        step = steps[j]
        if step is not None:
            reflect(q, j, *step)
    return q, r[:k]


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (6, 6), (1, 4), (9, 2)])
def test_qr_isTheReferenceOrder_bitForBit(shape: tuple[int, int]) -> None:
    """The factors are those of one sequence of IEEE operations (the reference, in Python floats),
    whatever torch's vector code does with the elementwise ones."""
    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(*shape, generator=g, dtype=torch.float64)
    a[0, -1] = 0.0  # a zero below no diagonal changes nothing; one on it is a sign of its own
    q, r = fixedorder.qr(a)
    want_q, want_r = _reference_qr(a.tolist())
    assert q.tolist() == want_q and r.tolist() == want_r


@pytest.mark.parametrize("shape", [(40, 40), (64, 17), (17, 64)])
def test_qr_factorsLikeLapack_upToTheSignsOfRsDiagonal(shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(7)
    a = torch.randn(*shape, generator=g, dtype=torch.float64)
    q, r = fixedorder.qr(a)
    lq, lr = torch.linalg.qr(a)
    assert q.shape == lq.shape and r.shape == lr.shape
    assert torch.equal(r, r.triu())
    assert torch.allclose(q @ r, a, atol=1e-13)
    assert torch.allclose(q.T @ q, torch.eye(q.shape[1], dtype=torch.float64), atol=1e-13)
    signs, lsigns = torch.diagonal(r).sign(), torch.diagonal(lr).sign()
    assert torch.allclose(q * signs, lq * lsigns, atol=1e-12)  # the unique Q of R's positive diagonal


def _same_at_every_thread_count(factor: Callable[[Tensor], tuple[Tensor, Tensor]], a: Tensor) -> bool:
    """Whether ``factor(a)`` gives the same bits on one thread and on several."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = factor(a)
        torch.set_num_threads(max(2, before))
        many = factor(a)
    finally:
        torch.set_num_threads(before)
    return torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_qr_isTheSameAtEveryThreadCount() -> None:
    g = torch.Generator().manual_seed(3)
    assert _same_at_every_thread_count(fixedorder.qr, torch.randn(300, 200, generator=g, dtype=torch.float64))


def test_treeSum_addsHalves_alongADim() -> None:
    x = torch.tensor([[1e16, 1.0], [1.0, 2.0], [-1e16, 3.0]], dtype=torch.float64)
    got = fixedorder.tree_sum(x, 0)
    assert got.tolist() == [_tree([1e16, 1.0, -1e16]), _tree([1.0, 2.0, 3.0])]
    assert got.tolist()[0] == 0.0  # (1e16 + 1) - 1e16: the order shows
    assert fixedorder.tree_sum(torch.zeros(0, 3, dtype=torch.float64), 0).tolist() == [0.0] * 3


@pytest.mark.parametrize(("left", "right"), [((5, 7), (7, 3)), ((6,), (6,)), ((4, 9), (9,)), ((9,), (9, 2))])
def test_matmul_isTheSumOfProductsByHalves_bitForBit(left: tuple[int, ...], right: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(left) + len(right))
    a = torch.randn(*left, generator=g, dtype=torch.float64)
    b = torch.randn(*right, generator=g, dtype=torch.float64)
    got = fixedorder.matmul(a, b)
    rows = a.reshape(-1, a.shape[-1]).tolist()
    cols = (b if b.dim() == 2 else b[:, None]).T.tolist()
    want = [[_tree([x * y for x, y in zip(r, c, strict=True)]) for c in cols] for r in rows]
    assert got.reshape(-1).tolist() == [v for row in want for v in row]
    assert got.shape == (a @ b).shape and torch.allclose(got, a @ b, atol=1e-13)


def test_matmul_inBlocksOfRows_isTheSameAsAtOnce(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(9)
    a, b = (
        torch.randn(37, 11, generator=g, dtype=torch.float64),
        torch.randn(11, 5, generator=g, dtype=torch.float64),
    )
    whole = fixedorder.matmul(a, b)
    monkeypatch.setattr(fixedorder, "_BLOCK", 11 * 5 * 3)  # three rows a block, the last one short
    assert torch.equal(fixedorder.matmul(a, b), whole)


def test_spectralNorm_atConstruction_isServed_andTheSeedsAlone() -> None:
    """``nn.utils.parametrizations.spectral_norm`` runs fifteen power iterations (``mv``) at
    construction: refused as a sum in the machine's order; served in a fixed one, the same model
    for the same seed, and its estimate near the weight's largest singular value."""

    def make() -> nn.Module:
        return nn.utils.parametrizations.spectral_norm(nn.Linear(12, 6))

    first, again = init_module(make, seed=4), init_module(make, seed=4)
    for (name, p), q in zip(first.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    raw = first.parametrizations.weight.original.detach()
    assert torch.allclose(first.weight.detach(), raw / torch.linalg.matrix_norm(raw, ord=2), rtol=0.05)


class _Recurrent(nn.Module):
    """Weights initialised orthogonally, as RWKV and recurrent models do: wide, tall and square."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(12, 5)
        self.tall = nn.Linear(4, 9)
        self.square = nn.Linear(8, 8)
        nn.init.orthogonal_(self.wide.weight, gain=2.0)
        nn.init.orthogonal_(self.tall.weight)
        nn.init.orthogonal_(self.square.weight)


def test_orthogonalInit_atConstruction_isServed_orthonormal_andTheSeedsAlone() -> None:
    """``nn.init.orthogonal_`` was refused at construction (LAPACK's QR differs by machine); it is
    built from the served normal draws and the Householder factorisation: the same model for the
    same seed, another for another, with orthonormal rows or columns times the gain."""
    first, again, other = (init_module(_Recurrent, seed=s) for s in (11, 11, 12))
    for name, p in first.named_parameters():
        assert torch.equal(p, dict(again.named_parameters())[name])
    assert not torch.equal(first.square.weight, other.square.weight)
    wide, tall, square = (m.weight.detach().double() for m in (first.wide, first.tall, first.square))
    assert torch.allclose(wide @ wide.T, 4 * torch.eye(5, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(tall.T @ tall, torch.eye(4, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(square @ square.T, torch.eye(8, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (5, 5), (3, 5, 4)])
def test_geqrf_isLapacksFormat_andItsProductLapacksQ(shape: tuple[int, ...]) -> None:
    """The compact form LAPACK's ``geqrf`` gives (R above, unit-led reflectors below, their
    scales), up to rounding, and ``householder_product`` of it LAPACK's Q: orthonormal columns."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(*shape, generator=g, dtype=torch.float64)
    compact, tau = fixedorder.geqrf(a)
    lapack, ltau = torch.geqrf(a)
    assert compact.shape == lapack.shape and tau.shape == ltau.shape
    assert torch.allclose(compact, lapack, atol=1e-12) and torch.allclose(tau, ltau, atol=1e-12)
    k = min(shape[-2:])
    q = fixedorder.householder_product(compact[..., :k], tau)
    assert torch.allclose(q, torch.linalg.householder_product(lapack[..., :k], ltau), atol=1e-12)
    assert torch.allclose(q @ compact.triu()[..., :k, :], a, atol=1e-12)


def test_geqrf_leavesAColumnAlreadyZeroBelowTheDiagonal_withTauZero_andIsTheSameAtEveryThreadCount() -> None:
    """LAPACK makes no reflection where a column is 0 below the diagonal (``tau`` 0, the diagonal
    entry kept with its sign), which ``orthogonal``'s parametrization reads; and the bits do not
    depend on the thread count."""
    a = torch.tensor([[-2.0, 1.0], [0.0, 3.0], [0.0, 4.0]], dtype=torch.float64)
    compact, tau = fixedorder.geqrf(a)
    lapack, ltau = torch.geqrf(a)
    assert tau[0] == 0 == ltau[0] and compact[0, 0] == -2.0 == lapack[0, 0]
    assert torch.allclose(compact, lapack, atol=1e-12) and torch.allclose(tau, ltau, atol=1e-12)
    g = torch.Generator().manual_seed(9)
    assert _same_at_every_thread_count(
        fixedorder.geqrf, torch.randn(200, 120, generator=g, dtype=torch.float64)
    )


class _Orthogonal(nn.Module):
    def __init__(self, orthogonal_map: str = "matrix_exp", trivialization: bool = True) -> None:
        super().__init__()
        self.square, self.tall = nn.Linear(6, 6), nn.Linear(6, 4)
        for m in (self.square, self.tall):
            nn.utils.parametrizations.orthogonal(
                m, orthogonal_map=orthogonal_map, use_trivialization=trivialization
            )


@pytest.mark.parametrize(
    ("orthogonal_map", "trivialization"),
    [("matrix_exp", True), ("cayley", True), ("householder", True), ("householder", False)],
)
def test_orthogonalParametrization_atConstruction_isServed_orthonormal_andTheSeedsAlone(
    orthogonal_map: str, trivialization: bool
) -> None:
    """``nn.utils.parametrizations.orthogonal`` was refused at construction (its weight made
    orthogonal with LAPACK's ``geqrf``): the same model for the same seed, another for another,
    its weights orthonormal."""
    first, again, other = (
        init_module(lambda: _Orthogonal(orthogonal_map, trivialization), seed=s) for s in (4, 4, 5)
    )
    state, same = first.state_dict(), again.state_dict()
    assert all(torch.equal(t, same[n]) for n, t in state.items())
    assert not torch.equal(first.square.weight, other.square.weight)
    with torch.no_grad():
        square, tall = first.square.weight.double(), first.tall.weight.double()
    assert torch.allclose(square @ square.T, torch.eye(6, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(tall @ tall.T, torch.eye(4, dtype=torch.float64), atol=1e-12)


def test_aTaskWithOrthogonalLayers_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """The weights' map (``matrix_exp``) runs in every step, rounded with the log: trained on
    ``cpu-1t``, audited on ``noisy``, and the judge's re-run of step 3 gives the trainer's leaf."""
    body = _body(
        "        return self.b(torch.tanh(self.a(x)))",
        "        nn.utils.parametrizations.orthogonal(self.b)\n"
        "        self.mix = nn.utils.parametrizations.orthogonal(nn.Linear(hidden, hidden))\n",
    ).replace("return self.b(torch.tanh(self.a(x)))", "return self.b(self.mix(torch.tanh(self.a(x))))")
    trains_and_audits(tmp_path, body, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript
