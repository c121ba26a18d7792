"""A scheduler of the task's own class, which a judge fast-forwards (engine/carried.py,
``Watch._own_schedule``).

Why: a judge re-running step ``k`` steps a fresh scheduler ``k - 1`` times. A scheduler of the
task's own whose learning rate reads more than its count of steps (here the parameters' norm)
trained and audited from step 1, and the judge's re-run of a later step, with another learning
rate, ruled the honest trainer wrong (a rate of the step and of the committed state alone is the
same for the judge: it steps its scheduler on the state loaded). Now such a scheduler's steps are run again afresh at each
power of two and at the last step, as its judge would run them: one whose rate keeps a history
of the parameters stops the trainer at the first of those after it departs (step 4), naming it; a
schedule of the step alone trains, those steps run twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import CarriedStateError
from game.training.engine.replay import replay_transcript_step
from game.training.engine.train import train
from game.training.task.config import load_config
from tests.training.test_carried import counted_reruns
from tests.training.test_plateau import _OLD
from tests.training.test_task_api import TASK_PY, make_plugin

WARMUP = """
class Warmup(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, opt, steps):
        self.steps = steps
        super().__init__(opt)

    def get_lr(self):
        return [base * min(1.0, (self.last_epoch + 1) / self.steps) for base in self.base_lrs]
"""

#: Each step's rate the last one's times a factor of the parameters' norm then: its history, which
#: a fresh scheduler stepped on the committed state alone does not have (from step 3 on).
BY_NORM = """
class ByNorm(torch.optim.lr_scheduler.LRScheduler):
    def get_lr(self):
        norm = sum(float(p.detach().norm()) for g in self.optimizer.param_groups for p in g["params"])
        return [g["lr"] / (1.0 + 0.01 * norm) for g in self.optimizer.param_groups]
"""


def _body(classes: str, scheduler: str) -> str:
    body = TASK_PY.replace("class Net(nn.Module):", classes + "\n\nclass Net(nn.Module):")
    return body.replace(_OLD, f"scheduler=lambda opt: {scheduler},")


def test_aScheduleOfTheStepAlone_trains_itsStepsAtPowersOfTwoRunTwice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    afresh = counted_reruns(monkeypatch)
    make_plugin(tmp_path, _body(WARMUP, "Warmup(opt, 3)"))
    cfg = load_config(tmp_path / "task.toml").replace(steps=6, checkpoint_interval=1)
    train(cfg, "cpu-1t", tmp_path / "t")
    assert afresh == [2, 4, 6]
    assert replay_transcript_step(tmp_path / "t", 5, "noisy").matches_transcript


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "asynchronous"])
def test_aSchedulerWithAHistory_stopsTheTrainerAtTheNextPowerOfTwo_namingIt(
    tmp_path: Path, staleness: int
) -> None:
    make_plugin(tmp_path, _body(BY_NORM, "ByNorm(opt)"))
    cfg = load_config(tmp_path / "task.toml").replace(steps=4, accumulate=2, max_staleness=staleness)
    with pytest.raises(
        CarriedStateError, match=r"step 4: the task's scheduler, ByNorm, is not a schedule of the step alone"
    ):
        train(cfg, "cpu-1t", tmp_path / "t")
