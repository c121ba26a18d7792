"""Half and bfloat16 ops in a step (dispatch/widen.py, ``IN_STEP``), and optimizer state kept in
another dtype than its parameters (state/optstate.py, ``keep_dtypes``).

Why: torch's own ``torch.optim.Muon`` runs its Newton-Schulz iteration on ``grad.bfloat16()``, a
memory-lean optimizer keeps its moments in bfloat16, and a model may cast to half on purpose. A
step refused every inexact op with such a result (another device's bfloat16 matrix product gives
other bits), so Muon stopped at step 1. Such an op now runs as its float64 twin, rounded through
the log as a float32 result is, and its value is converted to the narrow dtype: every device
converts a value both sides agree on the same way. And torch's ``load_state_dict`` casts floating
state to the parameter's dtype, so a judge re-ran a step with float64 moments where the trainer
had bfloat16 ones: the committed dtype is now kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from game.judgeupdate import judged_step
from game.training.dispatch.mode import RoundingMode
from game.training.engine.replay import state_after
from game.training.engine.step import engine_for
from game.training.log.packed import StepLog
from game.training.native import front
from game.training.numerics import rounding
from game.training.state.tensors import TrainState
from game.training.task.config import load_config
from game.training.transcript.reader import Transcript
from tests.training.test_mixed_floats import BITS, PROFILES, _mode
from tests.training.test_task_api import TASK_PY, trains_and_audits


def _inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(5)
    x = rounding.rnd(torch.randn(8, 16, generator=g, dtype=torch.float64), BITS)
    w = rounding.rnd(torch.randn(16, 16, generator=g, dtype=torch.float64) / 4, BITS)
    return x, w


def _calls(x: Tensor, w: Tensor) -> dict[str, Tensor]:
    """Inexact ops on bfloat16 and half tensors, as Muon's iteration and a half model make them;
    ``x`` and ``w`` are float64 (the casts are moves)."""
    xb, wb, xh = x.to(torch.bfloat16), w.to(torch.bfloat16), x.to(torch.float16)
    m = torch.zeros_like(xb)
    m.lerp_(xb, 0.1)  # an in-place inexact op on a bfloat16 self
    return {
        "matmul": xb @ wb,
        "norm": xb.norm(),
        "softmax": torch.softmax(xb / 3, -1),
        "gelu": F.gelu(xh),
        "add_alpha": torch.add(xh, xh, alpha=0.3),
        "lerp_": m,
        "sum_to_float": xb.sum(0, dtype=torch.float32),
    }


def _twins(x: Tensor, w: Tensor) -> dict[str, Tensor]:
    """What each call gives on the grid: its float64 twin rounded to nearest, then converted."""
    xb, wb, xh = (t.to(d).double() for t, d in ((x, torch.bfloat16), (w, torch.bfloat16), (x, torch.float16)))
    want = {
        "matmul": (xb @ wb, torch.bfloat16),
        "norm": (xb.norm(), torch.bfloat16),
        "softmax": (
            torch.softmax(rounding.rnd(xb / 3, BITS).to(torch.bfloat16).double(), -1),
            torch.bfloat16,
        ),
        "gelu": (F.gelu(xh), torch.float16),
        "add_alpha": (torch.add(xh, xh, alpha=0.3), torch.float16),
        "lerp_": (torch.zeros_like(xb).lerp_(xb, 0.1), torch.bfloat16),
        "sum_to_float": (xb.sum(0), torch.float32),
    }
    return {k: rounding.rnd(v, BITS).to(d) for k, (v, d) in want.items()}


def _step(profile: str, mode: str, log: StepLog) -> tuple[RoundingMode, dict[str, Tensor]]:
    x, w = _inputs()
    rm = _mode(profile, mode, log)
    with rm:
        out = _calls(x, w)
    return rm, out


@pytest.mark.parametrize("profile", PROFILES)
def test_anInexactOpOnHalves_isItsFloat64TwinRounded_thenConverted(profile: str) -> None:
    """Each result keeps its dtype; without noise (``cpu-1t``) it is the float64 twin rounded to
    the grid and converted, which is not what the machine's own bfloat16 kernel gives for all."""
    rm, out = _step(profile, "record", StepLog())
    assert rm.via_front == (profile == "cpu-1t" and front.available())
    want = _twins(*_inputs())
    for name, t in out.items():
        assert t.dtype == want[name].dtype, name
        if profile == "cpu-1t":
            assert torch.equal(t, want[name]), name
    assert rm.op_index > 0


@pytest.mark.parametrize(("trainer", "auditor"), [("cpu-1t", "noisy"), ("noisy", "cpu-1t")])
def test_halfOps_recordedOnOneInterceptor_replayBitExactlyOnTheOther(trainer: str, auditor: str) -> None:
    """The front and the Python mode round and log the same twins in the same order; the auditor's
    noisy float64 twins give the trainer's half and bfloat16 results bit for bit."""
    log = StepLog()
    rec, recorded = _step(trainer, "record", log)
    rep, replayed = _step(auditor, "replay", log)
    rep.finish()  # the log is used up exactly
    assert rec.op_index == rep.op_index > 0 and rec.logged == rep.logged
    for name, t in recorded.items():
        assert t.dtype == replayed[name].dtype and torch.equal(t, replayed[name]), name


NO_BIAS = TASK_PY.replace("nn.Linear(4, hidden)", "nn.Linear(4, hidden, bias=False)").replace(
    "nn.Linear(hidden, 3)", "nn.Linear(hidden, 3, bias=False)"
)

LEAN_ADAM = '''
class LeanAdam(torch.optim.Optimizer):
    """Adam with its first moment in bfloat16 and its second in half, kept so across a reload."""

    def __init__(self, params, lr=0.01, betas=(0.9, 0.99)):
        super().__init__(params, dict(lr=lr, betas=betas))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            for p in ps:
                if not self.state[p]:
                    self.state[p]["m"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    self.state[p]["v"] = torch.zeros_like(p, dtype=torch.float16)
            b1, b2 = group["betas"]
            ms = [self.state[p]["m"] for p in ps]
            torch._foreach_lerp_(ms, [p.grad.bfloat16() for p in ps], 1 - b1)
            for p, m in zip(ps, ms):
                v = self.state[p]["v"]
                v.mul_(b2).addcmul_(p.grad.half(), p.grad.half(), value=1 - b2)
                p.add_(m.double() / (v.double().sqrt() + 1e-3), alpha=-group["lr"])


@task('''


def _state(root: Path, step: int) -> TrainState:
    t = Transcript(root / "t")
    return state_after(t, engine_for(t.config, "cpu-1t"), step)


def _judged_everywhere(root: Path, steps: int) -> None:
    for step in range(1, steps + 1):
        assert judged_step(root / "t", step, "cpu-1t").matches_transcript, step


def test_torchsMuon_trainsAuditsAndIsJudged(tmp_path: Path) -> None:
    """``torch.optim.Muon`` (its iteration in bfloat16) trains, its audit on ``noisy`` matches,
    and the judge's re-run of every step gives the trainer's leaf."""
    body = NO_BIAS.replace(
        "        loss=lambda m, b:",
        "        optimizer=lambda m: torch.optim.Muon(m.parameters(), lr=0.05),\n        loss=lambda m, b:",
    )
    trains_and_audits(tmp_path, body, steps=3)
    _judged_everywhere(tmp_path, 3)
    first, last = (_state(tmp_path, s).model for s in (0, 3))
    assert not torch.equal(first.a.weight, last.a.weight)  # it stepped


def test_optimizerStateInNarrowerDtypes_isReloadedInThem(tmp_path: Path) -> None:
    """An optimizer keeping bfloat16 and half moments: the state a judge loads keeps those dtypes
    (torch's ``load_state_dict`` made them float64, and the reload check refused the task), so its
    re-run of every step agrees."""
    body = TASK_PY.replace("\n\n@task(", "\n" + LEAN_ADAM, 1).replace(
        "        loss=lambda m, b:",
        "        optimizer=lambda m: LeanAdam(m.parameters()),\n        loss=lambda m, b:",
    )
    trains_and_audits(tmp_path, body, steps=3)
    _judged_everywhere(tmp_path, 3)
    state = _state(tmp_path, 2)
    moments = state.optimizer.state[state.model.a.weight]
    assert (moments["m"].dtype, moments["v"].dtype) == (torch.bfloat16, torch.float16)


def test_aHalfCastInTheModel_trainsAndAudits(tmp_path: Path) -> None:
    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        h = self.a(x)\n"
        "        att = torch.softmax(h.bfloat16() @ h.bfloat16().T / 3, -1)\n"
        "        return self.b(torch.tanh((att @ h.half().bfloat16()).to(h.dtype)) + F.gelu(h.half()).double())",
    )
    trains_and_audits(tmp_path, body, steps=3)
    _judged_everywhere(tmp_path, 3)
    assert load_config(tmp_path / "task.toml").steps == 4  # the declared default, changed for the run alone
