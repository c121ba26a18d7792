"""Ties in sort, argsort and topk in a step (dispatch/tieorder.py).

Why: the order of equal values is a sort's algorithm's: torch's CPU ``topk`` returned tied
elements out of index order, and CUDA's kernels give another order, so a step that used the
indices (a TopK sparse autoencoder over ReLU zeros, a router) computed otherwise on a GPU. In a
step they are now a stable sort's: equal values in index order, which torch guarantees on every
device; values and gradients stay torch's.
"""

from __future__ import annotations

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
