"""A scheduler stepped with the step's loss (``ReduceLROnPlateau``): its state is committed with the
step's (game/training/state/schedstate.py).

Why: it was refused, since its learning rate at step ``k`` depends on every loss before it, and a
judge re-runs step ``k`` alone from the committed state. Now the engine steps it with the step's
loss and the leaf commits its best loss, its counters and the learning rates it has cut to: a run
whose learning rate is cut trains, audits on another profile, and the judge's re-run of a step
after a cut gives the trainer's leaf; a state that differs only there has another leaf; the
same holds for an asynchronous task's updates, on many workers and on a parameter server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import CheckpointError, ConfigError
from game.judgeupdate import judged_step
from game.training.engine.audit import audit
from game.training.engine.replay import replay_transcript_step
from game.training.engine.states import decode_state, fresh_state
from game.training.engine.train import train
from game.training.parallel.launch import launch
from game.training.state import schedstate
from game.training.state.canonical import encode_state
from game.training.state.checkpoint import parse_state
from game.training.state.leaves import state_hash
from game.training.task.config import TaskConfig, load_config
from game.training.transcript.layout import TranscriptPaths
from tests.training.helpers import file_tree
from tests.training.test_cli_training import vgame
from tests.training.test_task_api import TASK_PY, make_plugin

_OLD = "scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.params.warmup)),"
#: ``mode="max"`` on a falling loss: every step after the first is a bad one, so with no patience
#: the learning rate is halved at each (down to ``min_lr``), and the cooldown holds it some steps.
PLATEAU = TASK_PY.replace(
    _OLD,
    'scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0, '
    "factor=0.5, cooldown=1, min_lr=0.004),",
)
STEPS = 6


def _cfg(root: Path, **changes: object) -> TaskConfig:
    make_plugin(root, PLATEAU)
    return load_config(root / "task.toml").replace(**{"steps": STEPS, "checkpoint_interval": 1, **changes})


def _lrs(out: Path, cfg: TaskConfig) -> list[float]:
    """The learning rate each committed state (steps 0..cfg.steps) holds."""
    paths = TranscriptPaths(out)
    return [
        decode_state(paths.checkpoint(s).read_bytes(), cfg).optimizer.param_groups[0]["lr"]
        for s in range(cfg.steps + 1)
    ]


def test_aRunWhoseLearningRateIsCut_audits_andTheJudgeAgreesAfterTheCuts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    out = tmp_path / "t"
    result = train(cfg, "cpu-1t", out)
    lrs = _lrs(out, cfg)
    assert lrs[0] == lrs[1] == 0.05 and lrs[2] == 0.025  # cut after step 2, then cooling down
    assert len(set(lrs)) >= 3 and min(lrs) >= 0.004  # cut again after the cooldown
    report = audit(out, "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in range(3, STEPS + 1):  # each from the committed state before it, as a judge runs it
        assert replay_transcript_step(out, step, "noisy").matches_transcript


def test_theLeafCommitsTheSchedulersState_andItComesBackFromTheBytes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    state = fresh_state(cfg)
    sched = state.scheduler
    sched.step(1.0)
    sched.step(0.5)  # a bad step: lr cut, cooldown set
    names = [n for n in parse_state(encode_state(state))[1] if n.startswith(schedstate.PREFIX)]
    assert schedstate.LR in names and "sched/best" in names and "sched/num_bad_epochs" in names
    back = decode_state(encode_state(state), cfg)
    assert back.scheduler.state_dict() == sched.state_dict()
    assert back.optimizer.param_groups[0]["lr"] == state.optimizer.param_groups[0]["lr"] == 0.025
    leaf = state_hash(state)
    for change in ("best", "cooldown_counter", "lr"):
        other = decode_state(encode_state(state), cfg)
        if change == "lr":
            other.optimizer.param_groups[0]["lr"] = 0.0125
        else:
            setattr(other.scheduler, change, getattr(other.scheduler, change) + 1)
        assert state_hash(other) != leaf, change


def test_bytesWithoutTheSchedulersState_doNotFitTheTask(tmp_path: Path) -> None:
    """A state's bytes written for the same model without the scheduler's state (another task's)
    are refused, not loaded with the scheduler left fresh."""
    make_plugin(tmp_path)
    plain = encode_state(fresh_state(load_config(tmp_path / "task.toml")))
    with pytest.raises(CheckpointError, match=r"do not fit the task's scheduler: missing \['sched/"):
        decode_state(plain, _cfg(tmp_path / "plateau"))


@pytest.mark.parametrize("profile", ["cpu-1t", "noisy"])
def test_staleGradients_theUpdatesLossIsItsMicroBatches_andTheJudgeAgrees(
    tmp_path: Path, profile: str
) -> None:
    """An asynchronous task's update gives the scheduler the mean of the losses of the micro-batches
    it applies (each computed on its own version): the run's learning rate is cut, the audit on
    another profile matches, and the judge's re-run of each update after a cut (from the committed
    states the schedule names, on either profile) gives the trainer's leaf."""
    cfg = _cfg(tmp_path, max_staleness=1, accumulate=2)
    out = tmp_path / "t"
    result = train(cfg, "cpu-1t", out)
    assert len(set(_lrs(out, cfg))) >= 3
    report = audit(out, "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in range(3, STEPS + 1):
        judged = judged_step(out, step, profile)
        assert judged.matches_transcript and not judged.rejected, step


def test_aSchedulerWritingMoreThanTheLearningRate_isRefusedAfterItsFirstStep(tmp_path: Path) -> None:
    body = PLATEAU.replace("class Net(nn.Module):", MOMENTUM_TOO + "\n\nclass Net(nn.Module):").replace(
        "torch.optim.lr_scheduler.ReduceLROnPlateau(", "Damped("
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=3)
    with pytest.raises(ConfigError, match=r"Damped, stepped with the loss, wrote the param groups' betas"):
        train(cfg, "cpu-1t", tmp_path / "t")


MOMENTUM_TOO = """
class Damped(torch.optim.lr_scheduler.ReduceLROnPlateau):
    def step(self, metrics):
        super().step(metrics)
        for g in self.optimizer.param_groups:
            g["betas"] = (0.8, 0.999)
"""


def test_twoWorkers_writeTheOneProcessTranscript(tmp_path: Path) -> None:
    """Data-parallel rank 0 steps the scheduler with the loss of every rank's micro-batches, added
    in micro-batch order as one process adds them: the same files, byte for byte."""
    cfg = _cfg(tmp_path, accumulate=2, steps=4)
    train(cfg, "cpu-1t", tmp_path / "one")
    launched = launch(cfg, "cpu-1t", tmp_path / "two", 2)
    assert launched.workers == 2
    assert file_tree(tmp_path / "two") == file_tree(tmp_path / "one")
    assert len(set(_lrs(tmp_path / "one", cfg))) >= 2  # a cut


def test_cli_train_showsTheLearningRate_andALineAtEachCut(tmp_path: Path) -> None:
    make_plugin(tmp_path, PLATEAU)
    run = vgame(
        "train", "--config", str(tmp_path / "task.toml"), "--steps", "4", "--out", str(tmp_path / "t")
    )
    assert run.returncode == 0, run.stderr
    cuts = [line.split() for line in run.stderr.splitlines() if "cut the learning rate" in line]
    assert cuts == [
        ["step", "2", "ReduceLROnPlateau", "cut", "the", "learning", "rate", "to", "0.025"],
        ["step", "4", "ReduceLROnPlateau", "cut", "the", "learning", "rate", "to", "0.0125"],
    ]
