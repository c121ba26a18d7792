"""A call that takes float32 tensors beside the step's float64 ones (dispatch/widen.py, ``mixed``).

Why: a model written for float32 casts on purpose (``x = x.float()`` on its input, an image's
``uint8`` made ``float()``, ``.to(torch.float32)`` before a norm), and in a step its parameters are
float64. torch refuses that mix in a matrix product, a convolution, a norm's parameters, an indexed
write, a weighted loss: the user's own model stopped at step 1 with torch's words on dtypes, where
it trains as it is on float32. Now such a call runs as its float64 twin, through the C++ front and
the Python mode alike, and an in-place op's float32 tensor takes its twin's values back; where
torch refuses the mix above the dispatch (a convolution's bias), the step's function mode retries
the call on float64 copies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from game.errors import TaskCodeError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.engine.train import train
from game.training.log.packed import StepLog
from game.training.native import front
from game.training.numerics import rounding
from game.training.task.config import load_config
from tests.training.test_task_api import TASK_PY, make_plugin, trains_and_audits

BITS = 32
PROFILES = ["cpu-1t", "noisy"]  # through the C++ front where it loads; the Python mode


def _mode(profile: str, mode: str, log: StepLog) -> RoundingMode:
    return RoundingMode(bits=BITS, tau=0.25, mode=mode, profile=get_profile(profile), step=3, log=log)  # type: ignore[arg-type]


def _inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(11)
    x = rounding.rnd(torch.randn(16, 32, generator=g, dtype=torch.float64), BITS)
    w = rounding.rnd(torch.randn(32, 32, generator=g, dtype=torch.float64) / 4, BITS).requires_grad_(True)
    return x, w


def _calls(h: Tensor, w: Tensor) -> dict[str, Tensor]:
    """Calls torch refuses on a float32 ``h`` (or its bfloat16) and a float64 ``w``, as a float32
    model makes them."""
    acc = h.detach().clone()
    acc.index_add_(0, torch.tensor([0, 2]), w[:2].detach())
    put = h.detach().clone()
    put.index_put_((torch.tensor([1]),), w[3].detach())
    target = torch.arange(h.shape[0]) % h.shape[1]
    return {
        "linear": F.linear(h, w, w[0]),
        "bfloat16_linear": F.linear(h.to(torch.bfloat16), w),
        "matmul": h @ w,
        "layer_norm": F.layer_norm(h, (h.shape[-1],), w[0], w[1]),
        "group_norm": F.group_norm(h, 4, w[0], w[1]),
        "conv1d": F.conv1d(h[:, None, :], w[:2, None, :3]),
        "weighted_loss": F.cross_entropy(h, target, weight=w[0].detach().abs() + 0.1),
        "index_add_": acc,
        "index_put_": put,
    }


def _step(profile: str, mode: str, log: StepLog) -> tuple[RoundingMode, dict[str, Tensor], Tensor]:
    """The calls in a step, and ``w``'s gradient of their sum (whose backward mixes too)."""
    x, w = _inputs()
    h = x.to(torch.float32).requires_grad_(True)
    rm = _mode(profile, mode, log)
    with rm:
        out = _calls(h, w)
        sum(t.sum() for t in out.values() if t.requires_grad).backward()  # type: ignore[union-attr]
    assert w.grad is not None and h.grad is not None
    assert h.grad.dtype == torch.float32  # autograd gives a tensor's gradient its dtype
    return rm, out, torch.cat([w.grad.flatten(), h.grad.double().flatten()])


@pytest.mark.parametrize("profile", PROFILES)
def test_aCallMixingFloat32AndFloat64_runsAsItsFloat64Twin(profile: str) -> None:
    """Each result is the float64 call's, rounded (no noise on ``cpu-1t``: to nearest); a product
    gives float64, as torch's promotion would; an in-place op keeps its float32 tensor, which holds
    the twin's values."""
    rm, out, _ = _step(profile, "record", StepLog())
    assert rm.via_front == (profile == "cpu-1t" and front.available())
    for name in (
        "linear",
        "bfloat16_linear",
        "matmul",
        "layer_norm",
        "group_norm",
        "conv1d",
        "weighted_loss",
    ):
        assert out[name].dtype == torch.float64, name
    assert out["index_add_"].dtype == out["index_put_"].dtype == torch.float32
    x, w = _inputs()
    w = w.detach()
    acc, put = x.clone(), x.clone()
    acc.index_add_(0, torch.tensor([0, 2]), w[:2])
    put[1] = w[3]
    assert torch.equal(out["index_put_"].double(), put)  # a move: the same on every machine
    if profile == "cpu-1t":
        assert torch.equal(out["index_add_"].double(), rounding.rnd(acc, BITS))
        assert torch.equal(out["linear"], rounding.rnd(F.linear(x, w, w[0]), BITS))
        assert torch.equal(out["matmul"], rounding.rnd(x @ w, BITS))
        want = rounding.rnd(F.linear(x.to(torch.bfloat16).double(), w), BITS)
        assert torch.equal(out["bfloat16_linear"], want)


@pytest.mark.parametrize(("trainer", "auditor"), [("cpu-1t", "noisy"), ("noisy", "cpu-1t")])
def test_mixedCalls_recordedOnOneInterceptor_replayBitExactlyOnTheOther(trainer: str, auditor: str) -> None:
    """Forward and backward: the front and the Python mode round and log the same tensors in the
    same order, and the auditor's results and gradients equal the trainer's bit for bit."""
    log = StepLog()
    rec, recorded, rec_grads = _step(trainer, "record", log)
    rep, replayed, rep_grads = _step(auditor, "replay", log)
    rep.finish()  # the log is used up exactly
    assert rec.op_index == rep.op_index > 0
    assert rec.logged == rep.logged and rec.rounded.total() == rep.rounded.total()
    for name, t in recorded.items():
        assert t.dtype == replayed[name].dtype and torch.equal(t, replayed[name]), name
    assert torch.equal(rec_grads, rep_grads)
    assert rep.corrections + rec.corrections > 0  # the noise moved some value across a boundary


@pytest.mark.parametrize("profile", PROFILES)
def test_anInPlaceOpOnFloat64WithAFloat32Argument_isAppliedOnce(profile: str) -> None:
    """A float64 ``self`` written in place with a float32 argument beside it (ASGD's ``ax += mu *
    (p - ax)`` with ``mu`` a float32 scalar tensor, an EMA's ``lerp_`` by a float32 weight): the op
    ran, and its float64 twin ran again on the same ``self``, so ``ax`` held twice ``p``."""
    p = torch.tensor([0.25, 0.5, -1.0], dtype=torch.float64)
    mu = torch.ones((), dtype=torch.float32)
    axs = [torch.zeros(3, dtype=torch.float64) for _ in range(2)]
    ax, ema = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    with _mode(profile, "record", StepLog()):
        torch._foreach_addcmul_(axs, torch._foreach_sub([p, p], axs), [mu, mu])
        ax.addcmul_(p - ax, mu)
        ema.lerp_(p, torch.full((), 0.5, dtype=torch.float32))
    for got in (*axs, ax):
        assert torch.equal(got, p)
    assert torch.equal(ema, p / 2)


@pytest.mark.parametrize("profile", PROFILES)
def test_aMixedCallTorchRefusesForAnotherReason_raisesTorchsError(profile: str) -> None:
    """Widening fixes dtypes, not shapes: the twin's error reaches the model's code as torch's."""
    x, w = _inputs()
    with (
        _mode(profile, "record", StepLog()),
        pytest.raises(RuntimeError, match="shapes cannot be multiplied"),
    ):
        F.linear(x.to(torch.float32)[:, :5], w.detach())


#: Forwards of a model written for float32, each with the layers it adds: its input cast to float32
#: (a uint8 image's ``float() / 255``, or bfloat16) into a linear layer; and a convolution with its
#: bias, a PReLU and a bilinear layer on float32 input, whose mixes torch refuses in its composite
#: code above the dispatch (the function mode retries those: draws.ServingMode).
FORWARDS = {
    "input_float": ("        x = x.float()\n        return self.b(torch.tanh(self.a(x)))", ""),
    "uint8_image": (
        "        x = (x * 50 + 128).clamp(0, 255).to(torch.uint8)\n"
        "        return self.b(torch.tanh(self.a(x.float() / 255.0)))",
        "",
    ),
    "input_bfloat16": ("        return self.b(torch.tanh(self.a(x.to(torch.bfloat16))))", ""),
    "conv_prelu_bilinear": (
        "        h = self.c(self.a(x)[:, None, :].float()).mean(1)\n"
        "        h = self.p(h.float())\n"
        "        return self.b(self.bl(h.float(), h))",
        "        self.c = nn.Conv1d(1, 4, 3, padding=1)\n"
        "        self.p = nn.PReLU()\n"
        "        self.bl = nn.Bilinear(hidden, hidden, hidden)\n",
    ),
}


@pytest.mark.parametrize("name", sorted(FORWARDS))
def test_aModelThatCastsToFloat32_trainsAndAuditsBitExactly(tmp_path: Path, name: str) -> None:
    """A user's model as written for float32 training, trained through the C++ front on ``cpu-1t``
    and audited through the Python mode on ``noisy``."""
    forward, layers = FORWARDS[name]
    body = TASK_PY.replace("        return self.b(torch.tanh(self.a(x)))", forward)
    body = body.replace(
        "        self.b = nn.Linear(hidden, 3)\n", "        self.b = nn.Linear(hidden, 3)\n" + layers
    )
    trains_and_audits(tmp_path, body, steps=4)


def test_aMixRefusedInTheModulesOwnCode_saysToCastToTheParametersDtype(tmp_path: Path) -> None:
    """``nn.LSTM`` checks its input's dtype in Python, before any torch call vgame could widen, and
    torch's advice includes converting the model to float32, which does not hold in a step."""
    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        h, _ = self.r(self.a(x)[:, None, :].float())\n        return self.b(h[:, -1])",
    ).replace(
        "        self.b = nn.Linear(hidden, 3)\n",
        "        self.b = nn.Linear(hidden, 3)\n        self.r = nn.LSTM(hidden, hidden)\n",
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml")
    with pytest.raises(
        TaskCodeError, match=r"RNN input dtype .* cast to their dtype \(x\.to\(self\.weight\.dtype\)\)"
    ):
        train(cfg, "cpu-1t", tmp_path / "t")
