"""A task of one's own plays the whole game (issue 43): examples/own_task (a small transformer with
stock dropout and SDPA, its data in a file beside it) is trained by a trainer that poisons one
step, audited on another profile, bisected on the embedded chain and ruled by a judge on a third:
the poisoned step is pinned exactly, the auditor is paid, and an honest trainer of it is paid."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from game.demo import run_scenario
from game.training.task.config import TaskConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_task"


@pytest.fixture(scope="module")
def own_task(tmp_path_factory: pytest.TempPathFactory) -> TaskConfig:
    work = tmp_path_factory.mktemp("own") / "own_task"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    return load_config(work / "task.toml").replace(steps=9, checkpoint_interval=4, batch_size=16)


@pytest.mark.parametrize("poison_step", [1, 6])
def test_aPoisonedStepOfAPluginTask_isPinnedExactly_andTheAuditorIsPaid(
    own_task: TaskConfig, tmp_path: Path, poison_step: int
) -> None:
    result = run_scenario("poison", config=own_task, poison_step=poison_step, workdir=tmp_path / "w")
    assert result.disputed_step == poison_step
    assert result.winner == "auditor" and not result.trainer_paid
    assert result.balances_ok and result.contract_balance == 0
    assert result.trainer_profile != result.auditor_profile


def test_anHonestTrainerOfAPluginTask_isPaid(own_task: TaskConfig, tmp_path: Path) -> None:
    result = run_scenario("honest", config=own_task, workdir=tmp_path / "w")
    assert result.disputed_step is None and result.trainer_paid
    assert result.balances_ok and result.contract_balance == 0
