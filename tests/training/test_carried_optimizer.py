"""An optimizer of the task's own that carries state outside the state a step commits, and a state
that does not load back from its own bytes (engine/carried.py, engine/states.py).

Why: a step commits the optimizer's per-parameter ``state`` tensors, and a judge re-runs a step in
an optimizer built afresh with them loaded and the scheduler fast-forwarded. A Lookahead that kept
its count of steps and its slow weights as attributes, an adaptive optimizer (D-Adaptation,
Prodigy) that kept its estimate in a param group, and a wrapper whose ``load_state_dict`` left it
holding another ``state`` dict than its inner optimizer's each trained and passed an audit from
step 1, and the judge's re-run of a later step ruled the honest trainer wrong. The first two are
now judged as a model's attributes are (run afresh at step 2, refused where the leaf differs),
the third refused after step 1 by a round trip through the committed bytes; the same optimizers
written to keep their state in ``self.state`` train and the judge agrees, and a scheduler's
writes to the param groups (a cyclic one's momentum too) are no carried state. An asynchronous
task's updates (its scratch model, the state's optimizer) and a parameter server's optimizer are
watched the same way (a Lookahead's count there trained, and the judge's re-run of update 2 failed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from game.errors import CarriedStateError, StateReloadError
from game.training.engine.replay import replay_transcript_step
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.engine.update import UpdateEngine, weights_of
from game.training.log.schedule import Applied, MicroBatchId
from game.training.task.config import load_config
from tests.training.test_carried import COUNTED, KEPT, counted_reruns
from tests.training.test_task_api import TASK_PY, make_plugin

_SCHEDULER = "        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR("

LOOKAHEAD_ATTRIBUTES = """
class Lookahead(torch.optim.AdamW):
    def __init__(self, params, k=2, alpha=0.5, **kw):
        super().__init__(params, **kw)
        self.k, self.alpha, self.count = k, alpha, 0
        self.slow = [p.detach().clone() for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        super().step()
        self.count += 1
        if self.count % self.k == 0:
            for p, s in zip([p for g in self.param_groups for p in g["params"]], self.slow):
                s.add_(p - s, alpha=self.alpha)
                p.copy_(s)
"""

LOOKAHEAD_STATE = """
class Lookahead(torch.optim.AdamW):
    def __init__(self, params, k=2, alpha=0.5, **kw):
        super().__init__(params, **kw)
        self.k, self.alpha = k, alpha

    @torch.no_grad()
    def step(self, closure=None):
        super().step()
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                if "slow" not in st:
                    st["slow"], st["count"] = p.detach().clone(), torch.zeros((), dtype=p.dtype)
                st["count"].add_(1)
                if int(st["count"]) % self.k == 0:
                    st["slow"].add_(p - st["slow"], alpha=self.alpha)
                    p.copy_(st["slow"])
"""

ESTIMATE_IN_GROUP = """
class Adaptive(torch.optim.Optimizer):
    def __init__(self, params, lr=1.0):
        super().__init__(params, dict(lr=lr, d=1e-3, seen=0))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            g["d"] = g["d"] * 1.5  # the step size's estimate grows, as D-Adaptation's does
            g["seen"] += 1
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-g["d"] * g["lr"])
"""

SHARED_BY_A_WRAPPER = """
class Lookahead(torch.optim.Optimizer):
    def __init__(self, inner, alpha=0.5):
        self.inner, self.alpha = inner, alpha
        self.param_groups, self.defaults, self.state = inner.param_groups, inner.defaults, inner.state

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                st.setdefault("slow", p.detach().clone())
                st["slow"].add_(p - st["slow"], alpha=self.alpha)
                p.copy_(st["slow"])

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, sd):
        self.inner.load_state_dict(sd)  # puts a new state dict in inner; this one keeps the old
"""


def _with(optimizer: str, classes: str = "", scheduler: str = "") -> str:
    """The test task with ``optimizer`` (an expression of ``m``), ``classes`` before its model."""
    body = TASK_PY.replace("class Net(nn.Module):", classes + "\n\nclass Net(nn.Module):")
    body = body.replace(_SCHEDULER, f"        optimizer=lambda m: {optimizer},\n{_SCHEDULER}")
    if scheduler:
        old = body[body.index(_SCHEDULER) : body.index("\n", body.index(_SCHEDULER))]
        body = body.replace(old, f"        scheduler=lambda opt: {scheduler},")
    return body


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            _with("Lookahead(m.parameters(), lr=0.02)", LOOKAHEAD_ATTRIBUTES),
            r"optimizer\.count: 0 at step 1, 1 now",
        ),
        (
            _with("Adaptive(m.parameters())", ESTIMATE_IN_GROUP),
            r"optimizer\.param_groups\[0\]\.d: 0\.001 at step 1",
        ),
    ],
    ids=["lookahead_attributes", "estimate_in_param_group"],
)
def test_anOptimizerCarryingStateOutsideItsState_stopsTheTrainerAtStep2_namingIt(
    tmp_path: Path, body: str, where: str
) -> None:
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=3)
    with pytest.raises(
        CarriedStateError, match=rf"step 2: the task's optimizer .*{where}.*afresh.*self\.state"
    ):
        train(cfg, "cpu-1t", tmp_path / "t")


def test_anOptimizerKeepingItsStateInSelfState_trains_andTheJudgeAgrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same Lookahead with its slow weights and count in ``self.state`` (committed with each
    step), under a OneCycle schedule that writes the learning rate and Adam's betas every step:
    no step is run afresh, and the judge's re-run of steps 3 and 4 gives the trainer's leaves."""
    afresh = counted_reruns(monkeypatch)
    body = _with(
        "Lookahead(m.parameters(), lr=0.02)",
        LOOKAHEAD_STATE,
        "torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)",
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=4, checkpoint_interval=1)
    train(cfg, "cpu-1t", tmp_path / "t")
    assert afresh == []
    for step in (3, 4):
        assert replay_transcript_step(tmp_path / "t", step, "noisy").matches_transcript


def test_aCounterKeptInAParamGroup_thatNoStepReads_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A number a param group keeps for a log line changes every step: each such step runs again
    afresh, shows the same leaf, and the run trains."""
    afresh = counted_reruns(monkeypatch)
    body = _with("Adaptive(m.parameters(), lr=0.05)", ESTIMATE_IN_GROUP.replace('g["d"] * 1.5', 'g["d"]'))
    make_plugin(tmp_path, body)
    train(load_config(tmp_path / "task.toml").replace(steps=3), "cpu-1t", tmp_path / "t")
    assert afresh == [2, 3]


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "asynchronous"])
def test_aStateThatDoesNotLoadBack_isRefusedAfterStep1(tmp_path: Path, staleness: int) -> None:
    """A wrapper whose inner optimizer's ``load_state_dict`` puts a new ``state`` dict in place
    of the one the wrapper shares: decoded from the committed bytes, the state loses every entry.
    Refused after step 1 (update 1 of an asynchronous task) naming what is lost; a synchronous
    run leaves no transcript behind (the run with the fix is not refused into it as another
    task's)."""
    make_plugin(tmp_path, _with("Lookahead(torch.optim.AdamW(m.parameters(), lr=0.02))", SHARED_BY_A_WRAPPER))
    out = tmp_path / "t"
    cfg = load_config(tmp_path / "task.toml").replace(steps=3, max_staleness=staleness, accumulate=2)
    with pytest.raises(
        StateReloadError, match=r"step 1: the state does not come back .*lost: optim/a\.bias/exp_avg"
    ):
        train(cfg, "cpu-1t", out)
    if not staleness:
        assert not any(out.iterdir())


def _updates_afresh(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The updates a one-process asynchronous run applies again afresh (``UpdateEngine._update_afresh``)."""
    afresh: list[int] = []
    run = UpdateEngine._update_afresh

    def counted(self: UpdateEngine, before: bytes, work: Any, log: Any, step: int) -> bytes:
        afresh.append(step)
        return run(self, before, work, log, step)

    monkeypatch.setattr(UpdateEngine, "_update_afresh", counted)
    return afresh


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            _with("Lookahead(m.parameters(), lr=0.02)", LOOKAHEAD_ATTRIBUTES),
            r"optimizer\.count: 0 at step 1, 1 now",
        ),
        (COUNTED, r"model\.calls: 0 at step 1, 2 now"),
    ],
    ids=["optimizer", "scratch_model"],
)
def test_onTheAsynchronousPath_carriedState_stopsTheTrainerAtUpdate2(
    tmp_path: Path, body: str, where: str
) -> None:
    """An asynchronous task's updates (each micro-batch on a version of its own, in a scratch model
    that lives on from update to update) trained with either carrier, and the judge's re-run of
    update 2 failed ("log tampering"): both are now judged by the update applied again afresh."""
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=3, max_staleness=1, accumulate=2)
    with pytest.raises(CarriedStateError, match=rf"step 2: .*{where}.*afresh"):
        train(cfg, "cpu-1t", tmp_path / "t")


def test_onTheAsynchronousPath_stateKeptWhereItIsCommitted_trains_andTheJudgeAgrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lookahead that keeps its state in ``self.state`` applies no update afresh; a model that
    keeps its last activations for a plot applies update 2 afresh, shows the same leaf, and
    trains. The judge's re-run of updates 3 and 4 gives the trainer's leaves in both."""
    afresh = _updates_afresh(monkeypatch)
    for name, body, again in (
        ("state", _with("Lookahead(m.parameters(), lr=0.02)", LOOKAHEAD_STATE), []),
        ("kept", KEPT, [2, 4]),
    ):
        make_plugin(tmp_path / name, body)
        cfg = load_config(tmp_path / name / "task.toml").replace(
            steps=4, max_staleness=1, accumulate=2, checkpoint_interval=1
        )
        train(cfg, "cpu-1t", tmp_path / name / "t")
        assert afresh == again
        afresh.clear()
        for step in (3, 4):
            assert replay_transcript_step(tmp_path / name / "t", step, "noisy").matches_transcript


NOISY_COUNTED = """
class NoisySGD(torch.optim.SGD):
    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            g["seen"] = g.get("seen", 0) + 1  # for a log line: no step reads it
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.add_(torch.randn_like(p.grad) * 0.01)  # Langevin-style noise, in place
        return super().step(closure)
"""


def test_aServersUpdateAppliedAgainAfresh_takesTheGradientsAsTheyCame(tmp_path: Path) -> None:
    """A server judges an update whose optimizer's param group changed (a counter no step reads) by
    applying it again afresh. With one micro-batch an update's folded gradients are the worker's own
    tensors, which an optimizer may change in place (noise added to ``p.grad``): applied again, they
    must be the worker's as it sent them, or the harmless counter is refused."""
    make_plugin(tmp_path, _with("NoisySGD(m.parameters(), lr=0.05)", NOISY_COUNTED))
    ue = UpdateEngine(engine_for(load_config(tmp_path / "task.toml").replace(steps=3), "cpu-1t"))
    state = ue.engine.init_state()
    for u in (1, 2, 3):
        work, _ = ue.record_micro(Applied(MicroBatchId(u, 0), u - 1), weights_of(state))
        ue.record_apply(state, [work])
    assert state.step == 3
