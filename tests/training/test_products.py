"""``prod`` and ``cumprod`` with a gradient (game/training/dispatch/products.py).

Why: PyTorch computes their gradients by another formula under a Python dispatch mode than
through the C++ front, so both interceptors refused them where they were differentiated, and a
model multiplying probabilities or breaking sticks could not train. In a step they now run with a
backward of vgame's own: its gradients are the true ones (``gradcheck``, zeros anywhere in a row
included), and a task using them trains through either interceptor to the same roots, audits on
another profile, and the judge's re-runs agree.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from game.training.dispatch.products import _Cumprod, _Prod
from game.training.engine.audit import audit
from game.training.engine.replay import replay_transcript_step
from game.training.engine.train import train
from game.training.native import front
from game.training.task.config import load_config
from tests.training.test_task_api import TASK_PY, make_plugin

#: (shape, flat positions set to zero): none, at either end, inside, two in a row, several rows.
CASES = [
    ((6,), ()),
    ((6,), (0,)),
    ((6,), (5,)),
    ((6,), (2,)),
    ((6,), (1, 4)),
    ((3, 5), (1, 5, 6, 14)),
    ((2, 3, 4), (0, 5, 13, 14, 23)),
]


def _input(shape: tuple[int, ...], zeros: tuple[int, ...]) -> torch.Tensor:
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(len(zeros)))
    x.view(-1)[list(zeros)] = 0.0
    return x.requires_grad_()


@pytest.mark.parametrize(("shape", "zeros"), CASES)
def test_theGradients_areTheTrueOnes_withZerosAnywhere(
    shape: tuple[int, ...], zeros: tuple[int, ...]
) -> None:
    x = _input(shape, zeros)
    dims = range(-len(shape), len(shape))
    assert torch.autograd.gradcheck(lambda t: _Prod.apply(t, None, False), (x,))
    for dim in dims:
        for keepdim in (False, True):
            assert torch.autograd.gradcheck(partial(_Prod.apply, dim=dim, keepdim=keepdim), (x,)), (
                dim,
                keepdim,
            )
        assert torch.autograd.gradcheck(partial(_Cumprod.apply, dim=dim), (x,)), dim
        g = torch.linspace(-1, 2, x.numel(), dtype=torch.float64).reshape(shape)
        ours = torch.autograd.grad(_Cumprod.apply(x, dim), x, g)[0]
        torchs = torch.autograd.grad(torch.cumprod(x, dim), x, g)[0]
        torch.testing.assert_close(ours, torchs, rtol=1e-12, atol=1e-12)


PRODUCTS = TASK_PY.replace(
    "        return self.b(torch.tanh(self.a(x)))",
    """        h = torch.sigmoid(self.a(x))
        none_fire = (1 - h).prod(-1, keepdim=True)   # a product of probabilities
        sticks = torch.cumprod(1 - h, 1) * h          # stick-breaking weights
        return self.b(h * none_fire + sticks + torch.relu(h - 0.5).prod(1, keepdim=True))""",
)


def test_aTaskMultiplyingProbabilities_trainsThroughEitherInterceptor_auditsAndIsJudgedAlike(
    tmp_path: Path,
) -> None:
    make_plugin(tmp_path, PRODUCTS)
    cfg = load_config(tmp_path / "task.toml").replace(steps=4, checkpoint_interval=1)
    result = train(cfg, "cpu-1t", tmp_path / "t")
    with front.disabled():
        python = train(cfg, "cpu-1t", tmp_path / "python")
    assert (python.state_root, python.log_root) == (result.state_root, result.log_root)
    report = audit(tmp_path / "t", "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in (2, 4):
        assert replay_transcript_step(tmp_path / "t", step, "noisy").matches_transcript
