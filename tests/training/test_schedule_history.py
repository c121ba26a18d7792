"""A torch scheduler holding a function of the task's own that keeps a history (engine/carried.py,
``Watch.check_rates``).

Why: a judge, or an auditor starting from a checkpoint, builds the scheduler afresh and steps it to
the disputed step on the state it loaded. torch's ``LambdaLR``, ``MultiplicativeLR`` and
``CyclicLR`` are schedules of the step only if the task's function is: ``MultiplicativeLR`` with a
factor read off the parameters, or a lambda that averages what it saw, trained and audited from
step 1, and the judge's re-run of every step from 3 on gave another leaf. The trainer now compares
its rates with a fresh scheduler's at each power of two and is stopped there, naming the scheduler,
before it commits a run it would lose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import CarriedStateError
from game.judgeupdate import judged_step
from game.training.engine.train import train
from game.training.task.config import load_config
from tests.training.test_task_api import TASK_PY, make_plugin, trains_and_audits

WARMUP = "scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.params.warmup)),"
NORM = "float(opt.param_groups[0]['params'][0].detach().norm())"

OWN_CODE = '''
class Averaged:
    """A factor that is the mean of the first weight's norms it has seen: a history."""

    def __init__(self, opt):
        self.opt, self.seen = opt, []

    def __call__(self, step):
        self.seen.append(float(self.opt.param_groups[0]["params"][0].detach().norm()))
        return sum(self.seen) / len(self.seen)


class Warmup:
    """A warm-up of one's own class: a function of the step alone."""

    def __init__(self, steps):
        self.steps = steps

    def __call__(self, step):
        return min(1.0, (step + 1) / self.steps)


@task('''

HISTORY = {
    "MultiplicativeLR": f"torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda s: 0.5 + 0.1 * {NORM})",
    "LambdaLR": "torch.optim.lr_scheduler.LambdaLR(opt, Averaged(opt))",
    "SequentialLR": (
        "torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.ConstantLR(opt, 0.5, total_iters=1), "
        f"torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda s: 0.5 + 0.1 * {NORM})], milestones=[1])"
    ),
}


def _body(scheduler: str) -> str:
    body = TASK_PY.replace("\n\n@task(", "\n" + OWN_CODE, 1)
    return body.replace(WARMUP, f"scheduler=lambda opt: {scheduler},").replace(
        'optimizer="adam"', 'optimizer="sgd"'
    )


@pytest.mark.parametrize("asynchronous", [False, True], ids=["synchronous", "asynchronous"])
@pytest.mark.parametrize("name", sorted(HISTORY))
def test_aSchedulesFunctionWithAHistory_stopsTheTrainerAtAPowerOfTwo(
    tmp_path: Path, name: str, asynchronous: bool
) -> None:
    make_plugin(tmp_path, _body(HISTORY[name]))
    cfg = load_config(tmp_path / "task.toml").replace(
        steps=8,
        checkpoint_interval=1,
        max_staleness=1 if asynchronous else 0,
        accumulate=2 if asynchronous else 1,
    )
    with pytest.raises(
        CarriedStateError,
        match=rf"step 4: the task's scheduler, {name}, is not a schedule of the step alone.*param group 0's lr",
    ):
        train(cfg, "cpu-1t", tmp_path / "t")


@pytest.mark.parametrize(
    "scheduler",
    [
        "torch.optim.lr_scheduler.LambdaLR(opt, Warmup(3))",
        "torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)",
        "torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda s: 0.9 if s % 2 else 1.0)",
        "torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2, scale_fn=lambda x: 0.9**x, scale_mode='iterations')",
    ],
    ids=["own-class", "lambda", "multiplicative", "cyclic-scale-fn"],
)
def test_aSchedulesFunctionOfTheStepAlone_trains_andEveryStepIsJudgedAlike(
    tmp_path: Path, scheduler: str
) -> None:
    """No rate is refused that a judge gives again: from a checkpoint at every step, each re-run
    agrees with the trainer's leaf."""
    trains_and_audits(tmp_path, _body(scheduler), steps=5, checkpoint_interval=1)
    for step in range(1, 6):
        assert judged_step(tmp_path / "t", step, "cpu-1t").matches_transcript, step
