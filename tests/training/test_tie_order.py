"""Ties in sort, argsort, topk, the selections, msort and quantile in a step (dispatch/tieorder.py).

Why: the order of equal values is a sort's algorithm's: torch's CPU ``topk`` returned tied
elements out of index order, and CUDA's kernels give another order, so a step that used the
indices (a TopK sparse autoencoder over ReLU zeros, a router) computed otherwise on a GPU. In a
step they are now a stable sort's: equal values in index order, which torch guarantees on every
device; values and gradients stay torch's.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from tests.training.test_stockops import _across_interceptors, _ops


def _tied(rows: int = 3, n: int = 5000) -> Tensor:
    """Rows of mostly zeros (a ReLU's), with runs of ones and twos: thousands of ties."""
    x = torch.zeros(rows, n, dtype=torch.float64)
    x[:, ::7] = 1.0
    x[:, 3::11] = 2.0
    return x


def _in_index_order(values: Tensor, indices: Tensor) -> bool:
    """Whether, along the last dim, every run of equal values has ascending indices."""
    same = values[..., 1:] == values[..., :-1]
    return bool((indices[..., 1:] > indices[..., :-1])[same].all())


@pytest.mark.parametrize("largest", [True, False])
def test_topkSortAndArgsort_giveTiesInIndexOrder_withTorchsValues(largest: bool) -> None:
    x = _tied()
    with _ops():
        top = torch.topk(x, 800, largest=largest)
        method = x.topk(800, dim=1, largest=largest, sorted=False)
        ordered = torch.sort(x, descending=largest)
        by_method = x.sort(dim=-1, descending=largest)
        order = torch.argsort(x, descending=largest)
    for values, indices in (top, method, ordered, by_method):
        assert _in_index_order(values, indices)
        assert torch.equal(values, x.gather(-1, indices))
    assert torch.equal(top.values, torch.topk(x, 800, largest=largest).values)
    assert torch.equal(ordered.values, torch.sort(x, descending=largest).values)
    assert torch.equal(order, ordered.indices)
    assert torch.equal(top.indices, ordered.indices[:, :800])


def test_topksGradient_reachesTheChosenElements_andTheSameOnBothInterceptors() -> None:
    """Recorded through the C++ front and replayed through the Python mode on ``noisy``: the same
    indices and the same gradient, which lands on the first ``k`` in index order among ties."""

    def run() -> list[Tensor]:
        x = _tied(2, 600).requires_grad_(True)
        top = torch.topk(x * 1.0, 200)
        top.values.sum().backward()
        assert x.grad is not None
        return [top.indices, x.grad]

    recorded, replayed, _ = _across_interceptors(run)
    assert all(torch.equal(r, p) for r, p in zip(recorded, replayed, strict=True))
    indices, grad = recorded
    x = _tied(2, 600)
    expected = torch.zeros_like(x).scatter_(
        1, torch.sort(x, descending=True, stable=True).indices[:, :200], 1.0
    )
    assert torch.equal(grad, expected) and _in_index_order(x.gather(1, indices), indices)


def _last_index_of(x: Tensor, values: Tensor) -> Tensor:
    """Each row's last index holding its value (NaN for NaN)."""
    hit = (x == values[:, None]) | (x.isnan() & values[:, None].isnan())
    at = torch.arange(x.shape[1]).expand(x.shape)
    return torch.where(hit, at, -1).max(1).values


def _expected_selections(x: Tensor) -> dict[str, Tensor]:
    """The index each selection's convention names, worked out row by row from a stable sort."""
    order = torch.sort(x, dim=1, stable=True).indices
    numbers = (~x.isnan()).sum(1)
    n = x.shape[1]
    median_at = torch.where(numbers < n, numbers, (n - 1) // 2)
    return {
        "kthvalue": order[:, 899],
        "median": order.gather(1, median_at[:, None])[:, 0],
        "nanmedian": order.gather(1, ((numbers - 1) // 2)[:, None])[:, 0],
        "mode": _last_index_of(x, torch.mode(x, 1).values),
    }


def test_selections_pickTheStableSortsElement_withTorchsValues() -> None:
    """``kthvalue``, ``median``, ``nanmedian`` and ``mode`` over thousands of ties (and rows with
    NaNs for the two medians): torch's values, at the index the stable sort names. This CPU's own
    ``kthvalue`` and ``mode`` name other tied elements."""
    x = _tied(4, 5000)
    x[1, 5] = x[2, 17] = float("nan")
    calls = {
        "kthvalue": lambda t: torch.kthvalue(t, 900, 1),
        "median": lambda t: t.median(dim=1),
        "nanmedian": lambda t: torch.nanmedian(t, 1, keepdim=True),
        "mode": lambda t: t.mode(),
    }
    expected = _expected_selections(x)
    for name, call in calls.items():
        with _ops():
            got = call(x)
        torchs = call(x)
        assert type(got) is type(torchs), name
        assert torch.equal(got.values, torchs.values) or torch.allclose(
            got.values, torchs.values, equal_nan=True
        ), name
        assert got.indices.shape == torchs.indices.shape, name
        assert torch.equal(got.indices.reshape(-1), expected[name]), name
        picked = x.gather(1, got.indices.reshape(-1, 1))[:, 0]
        assert torch.allclose(picked, got.values.reshape(-1), equal_nan=True), name


def test_selectionsWithoutADim_andWithDimsElsewhere_matchTorch() -> None:
    x = _tied(6, 40).t().contiguous()  # the ties down dim 0
    with _ops():
        whole = x.median()
        down = torch.kthvalue(x, 7, dim=0, keepdim=True)
        modes = torch.mode(x, 0)
    assert torch.equal(whole, x.median())
    assert down.values.shape == (1, 6) and torch.equal(down.values, torch.kthvalue(x, 7, 0, True).values)
    stable = torch.sort(x, dim=0, stable=True).indices
    assert torch.equal(down.indices[0], stable[6])
    assert torch.equal(modes.indices, _last_index_of(x.t(), modes.values))


@pytest.mark.parametrize("name", ["kthvalue", "median", "mode"])
def test_selectionsGradient_reachesThePickedElement_andTheSameOnBothInterceptors(name: str) -> None:
    """A selection's gradient lands on the element it picked (its backward is the sort's), the
    same through the C++ front and the Python mode on ``noisy``."""
    pick = {
        "kthvalue": lambda t: torch.kthvalue(t, 100, -1),
        "median": lambda t: torch.median(t, -1),
        "mode": lambda t: torch.mode(t, -1),
    }[name]

    def run() -> list[Tensor]:
        x = _tied(2, 600).requires_grad_(True)
        chosen = pick(x * 1.0)
        (chosen.values * torch.tensor([1.0, 3.0], dtype=torch.float64)).sum().backward()
        assert x.grad is not None
        return [chosen.indices, x.grad]

    recorded, replayed, _ = _across_interceptors(run)
    assert all(torch.equal(r, p) for r, p in zip(recorded, replayed, strict=True))
    indices, grad = recorded
    expected = torch.zeros(2, 600, dtype=torch.float64)
    expected[0, indices[0]], expected[1, indices[1]] = 1.0, 3.0
    assert torch.equal(grad, expected)


QUANTILE_MODES = ("linear", "lower", "higher", "nearest", "midpoint")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_quantiles_areTorchsValuesBitForBit_inEveryForm(dtype: torch.dtype) -> None:
    """Every interpolation, scalar and 1-D ``q``, a dim, none, ``keepdim``, rows with a NaN, and
    ``nanquantile``: the same shapes and bits as torch's own."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 25, generator=g, dtype=dtype)
    x[x.abs() < 0.3] = 0.0
    x[1, 2, 5] = float("nan")
    qs = (0.3, torch.tensor(0.71, dtype=dtype), torch.tensor([0.0, 0.25, 0.5, 0.9, 1.0], dtype=dtype))
    for f, q, dim, keepdim, how in itertools.product(
        (torch.quantile, torch.nanquantile), qs, (None, 0, -1), (False, True), QUANTILE_MODES
    ):
        want = f(x, q, dim=dim, keepdim=keepdim, interpolation=how)
        with _ops():
            got = f(x, q, dim=dim, keepdim=keepdim, interpolation=how)
        assert got.shape == want.shape and torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (
            f,
            q,
            dim,
            how,
        )


def test_quantileAndMsortGradients_reachTheStableSortsElements_theSameOnBothInterceptors() -> None:
    """Among ties, the elements a quantile interpolates between, and those ``msort`` puts in a
    place, are the stable sort's (this CPU's own sort names elements thousands of places on), the
    same through the C++ front and the Python mode on ``noisy``."""
    x0 = _tied(1, 6000)[0]
    q = torch.tensor([0.3, 0.75], dtype=torch.float64)

    def run() -> list[Tensor]:
        x = x0.clone().requires_grad_(True)
        y = x0.clone().requires_grad_(True)
        torch.quantile(x * 1.0, q).sum().backward()
        torch.msort((y * 1.0)[:, None])[1000:1003].sum().backward()
        assert x.grad is not None and y.grad is not None
        return [x.grad, y.grad]

    recorded, replayed, _ = _across_interceptors(run)
    assert all(torch.equal(r, p) for r, p in zip(recorded, replayed, strict=True))
    order = torch.sort(x0, stable=True).indices
    ranks = q * (x0.numel() - 1)
    picked = torch.cat((order[ranks.floor().long()], order[ranks.ceil().long()]))
    assert torch.equal(torch.nonzero(recorded[0]).flatten(), picked.unique())
    assert torch.equal(torch.nonzero(recorded[1]).flatten(), order[1000:1003].sort().values)
