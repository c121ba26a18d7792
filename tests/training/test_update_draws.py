"""What an optimizer's step draws, served (dispatch/stockops.py ``updating``).

Why: an optimizer of a task's own that draws in its step (DP-SGD's Gaussian noise on the clipped
gradients, Langevin dynamics' noise on the update) drew from torch's generator, which a step
refuses: such a task could not train at all. The update (clipping and the optimizer's step) now
draws from the counter RNG under the prefix ``update``, the same on every machine and on every
worker that applies it; the task trains, audits on another profile and is judged alike, and two
data-parallel workers write the one-process transcript.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import _get_current_function_mode_stack

from game.training.dispatch.draws import Draws
from game.training.dispatch.stockops import StockOps, draws_nothing, update_seed, updating
from game.training.engine.replay import replay_transcript_step
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.parallel.launch import launch
from game.training.task.config import load_config
from tests.training.test_task_api import TASK_PY, make_plugin, trains_and_audits

NOISY_SGD = '''
class NoisySGD(torch.optim.SGD):
    """DP-SGD's update: each gradient clipped by value, Gaussian noise added, then SGD's step."""

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    torch.nn.utils.clip_grad_value_([p], 0.5)
                    p.grad.add_(torch.randn_like(p.grad) * 0.01)
        return super().step(closure)
'''

_SCHEDULER = "        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR("
BODY = TASK_PY.replace("class Net(nn.Module):", NOISY_SGD + "\n\nclass Net(nn.Module):").replace(
    _SCHEDULER, f"        optimizer=lambda m: NoisySGD(m.parameters(), lr=0.05, momentum=0.9),\n{_SCHEDULER}"
)


def test_updatingServesTheCounterRngsDraws_underAPrefixOfItsOwn_andSeedsTheGlobals() -> None:
    """A normal drawn in an update is ``Draws(seed, step, "update")``'s first normal, on the grid;
    a micro-batch's first draw of the same step is another; Python's and numpy's generators give
    the update's seeded words, and are put back after. Torch's default dtype stays float32 (torch's
    optimizers make their step counters in it, and the state commits them so)."""
    before = random.getstate()
    with updating(9, 4, bits=32) as served:
        drawn = torch.randn(3, 5, dtype=torch.float64)
        words = (random.random(), float(np.random.random()))
        assert torch.get_default_dtype() == torch.float32
    assert served["randn"] == 1
    assert torch.equal(
        drawn, Draws(9, 4, "update", bits=32).normal("randn", (3, 5), drawn.device, torch.float64)
    )
    with StockOps(9, 4, 0, torch.arange(8), bits=32):
        micro = torch.randn(3, 5, dtype=torch.float64)
    assert not torch.equal(drawn, micro)
    seeded = random.Random(int.from_bytes(update_seed(9, 4), "big")).random()
    assert words[0] == seeded and random.getstate() == before


def test_anOptimizerThatDrawsInItsStep_trainsAuditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """DP-SGD's noisy update, trained on ``cpu-1t`` and audited on ``noisy`` (it was refused at
    step 1, "randn_like draws from torch's random generator"); the judge's re-run of step 3 gives
    the trainer's leaf."""
    trains_and_audits(tmp_path, BODY, steps=4, checkpoint_interval=1)
    assert replay_transcript_step(tmp_path / "t", 3, "noisy").matches_transcript


def test_twoWorkersApplyingTheNoisyUpdate_writeTheOneProcessTranscript(tmp_path: Path) -> None:
    """Each data-parallel rank applies the update with the same draws: the launch's roots are one
    process's."""
    make_plugin(tmp_path, BODY)
    cfg = load_config(tmp_path / "task.toml").replace(accumulate=2, steps=3)
    one = train(cfg, "cpu-1t", tmp_path / "one")
    two = launch(cfg, "cpu-1t", tmp_path / "two", 2).result
    assert (two.state_root, two.log_root) == (one.state_root, one.log_root)


def test_theServedUpdate_leavesTorchsOptimizerStateAsTorchMakesIt(tmp_path: Path) -> None:
    """Adam's step counters are made in torch's default dtype (float32) and committed so: the
    served update does not change the state's format (a float64 default there made them
    float64, and two more rounded ops a step)."""
    make_plugin(tmp_path, TASK_PY)
    cfg = load_config(tmp_path / "task.toml").replace(steps=1)
    engine = engine_for(cfg, "cpu-1t")
    state = engine.init_state()
    engine.run_step(state, 1, mode="record")
    steps = [s["step"] for s in state.optimizer.state.values()]
    assert steps and all(t.dtype == torch.float32 and float(t) == 1.0 for t in steps)


def _sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], lr=0.1)


def _hooked(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    optimizer.register_step_pre_hook(lambda *_: None)
    return optimizer


class _OwnSGD(torch.optim.SGD):
    pass


def _replaced_step(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    optimizer.step = lambda closure=None: None  # type: ignore[method-assign]
    return optimizer


@pytest.mark.parametrize(
    ("make", "serves"),
    [
        (_sgd, False),
        (lambda: torch.optim.Adam(_sgd().param_groups[0]["params"]), False),
        (lambda: _hooked(_sgd()), True),
        (lambda: _OwnSGD(_sgd().param_groups[0]["params"], lr=0.1), True),
        (lambda: _replaced_step(_sgd()), True),
    ],
    ids=["sgd", "adam", "a step hook", "a task's subclass", "step replaced"],
)
def test_updating_servesWhereTheOptimizerMayDraw_andSkipsTheModeForTorchsOwnStep(
    make: Callable[[], torch.optim.Optimizer], serves: bool
) -> None:
    """Issue 46: torch's own optimizers draw nothing, so their update runs without the function
    mode (its Python for each torch call was about 1 ms of a GPT-2-shape step); an optimizer that may draw
    (a task's class, a hook, a replaced step) is served as before. Python's generator is seeded
    for the update either way."""
    optimizer = make()
    assert draws_nothing(optimizer) is not serves
    seeded = random.Random(int.from_bytes(update_seed(9, 4), "big")).random()
    with updating(9, 4, bits=32, optimizer=optimizer) as served:
        assert bool(_get_current_function_mode_stack()) is serves
        assert random.random() == seeded
        if serves:
            torch.randn(2, dtype=torch.float64)
    assert served["randn"] == (1 if serves else 0)


def test_updating_aGlobalStepHook_keepsTheMode() -> None:
    handle = register_optimizer_step_post_hook(lambda *_: None)
    try:
        assert not draws_nothing(_sgd())
    finally:
        handle.remove()
    assert draws_nothing(_sgd())
