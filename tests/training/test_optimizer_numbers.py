"""An optimizer of the task's own that keeps Python numbers in its per-parameter state
(game/training/state/numbers.py).

Why: most optimizers written before torch kept its step count in a tensor count in a Python int
(``state["step"] += 1``, the bias corrections computed from it in Python floats), and vgame refused
them after step 1 ("optimizer state a.weight/step is a int, not a tensor"). A step now commits such
numbers exactly (``optim/<param>/<key>#number``), so the run trains, audits on another profile,
and the judge's re-run of a later step, from an optimizer built afresh with them loaded, agrees;
the numbers come back as the types they were, and the leaf depends on them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import ConfigError
from game.judgeupdate import judged_step
from game.training.engine.audit import audit
from game.training.engine.states import decode_state
from game.training.engine.train import train
from game.training.state.canonical import encode_state
from game.training.state.checkpoint import parse_state
from game.training.state.leaves import state_hash
from game.training.task.config import load_config
from game.training.transcript.layout import TranscriptPaths
from tests.training.test_carried_optimizer import _with
from tests.training.test_task_api import make_plugin

#: Adam as optimizers were written before torch kept the step in a tensor: an int count, the bias
#: corrections in Python floats, and a flag and a float kept beside them.
INT_STEP_ADAM = """
class IntStepAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"], state["rectified"], state["scale"] = 0, False, 1.0
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                state["rectified"] = state["step"] > 2
                state["scale"] = (1 - b2 ** state["step"]) ** 0.5 / (1 - b1 ** state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                size = group["lr"] * state["scale"] * (0.5 if state["rectified"] else 1.0)
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-size)
"""
BODY = _with("IntStepAdam(m.parameters(), lr=0.02)", INT_STEP_ADAM)


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "asynchronous"])
def test_anOptimizerCountingInPythonNumbers_trains_audits_andTheJudgeAgrees(
    tmp_path: Path, staleness: int
) -> None:
    make_plugin(tmp_path, BODY)
    cfg = load_config(tmp_path / "task.toml").replace(
        steps=4, checkpoint_interval=1, accumulate=2, max_staleness=staleness
    )
    out = tmp_path / "t"
    result = train(cfg, "cpu-1t", out)
    report = audit(out, "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in (3, 4):  # each from the committed state before it, in an optimizer built afresh
        judged = judged_step(out, step, "noisy")
        assert judged.matches_transcript and not judged.rejected, step
    state = decode_state(TranscriptPaths(out).checkpoint(3).read_bytes(), cfg)
    kept = state.optimizer.state[state.model.a.weight]
    assert (kept["step"], kept["rectified"]) == (3, True)
    assert type(kept["step"]) is int and type(kept["rectified"]) is bool and type(kept["scale"]) is float


def test_theLeafCommitsTheNumbers(tmp_path: Path) -> None:
    make_plugin(tmp_path, BODY)
    cfg = load_config(tmp_path / "task.toml").replace(steps=2, checkpoint_interval=1)
    train(cfg, "cpu-1t", tmp_path / "t")
    data = TranscriptPaths(tmp_path / "t").checkpoint(2).read_bytes()
    assert "optim/a.weight/step#number" in parse_state(data)[1]
    state = decode_state(data, cfg)
    leaf = state_hash(state)
    assert encode_state(state) == data
    for key, other in (("step", 7), ("rectified", True), ("scale", 0.5)):
        changed = decode_state(data, cfg)
        changed.optimizer.state[changed.model.a.weight][key] = other
        assert state_hash(changed) != leaf, key


def test_aListInTheOptimizersState_isRefusedNamingIt(tmp_path: Path) -> None:
    make_plugin(
        tmp_path,
        _with(
            "IntStepAdam(m.parameters(), lr=0.02)",
            INT_STEP_ADAM.replace(
                'state["scale"] = (1 - b2', 'state["history"] = [1.0]; state["scale"] = (1 - b2'
            ),
        ),
    )
    cfg = load_config(tmp_path / "task.toml").replace(steps=2)
    with pytest.raises(ConfigError, match=r"IntStepAdam keeps a\.weight/history in its state as a list"):
        train(cfg, "cpu-1t", tmp_path / "t")
