"""A task of one's own plays the whole game (issue 43): examples/own_task (a small transformer with
stock dropout and SDPA, its data in a file beside it) is trained by a trainer that poisons one
step, audited on another profile, bisected on the embedded chain and ruled by a judge on a third:
the poisoned step is pinned exactly, the auditor is paid, and an honest trainer of it is paid."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

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
    assert result.balances_ok and result.contract_balance == result.burnt > 0  # half the lost bond, locked
    assert result.trainer_profile != result.auditor_profile


def test_anHonestTrainerOfAPluginTask_isPaid(own_task: TaskConfig, tmp_path: Path) -> None:
    result = run_scenario("honest", config=own_task, workdir=tmp_path / "w")
    assert result.disputed_step is None and result.trainer_paid
    assert result.balances_ok and result.contract_balance == result.burnt == 0


def test_theDeliveredModel_loadsIntoTheTasksOwnClass_andRunsAsModelOfX(
    own_task: TaskConfig,
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    store: Any,
    data_key: bytes,
    tmp_path: Path,
) -> None:
    """What `vgame task model` writes (here as .safetensors) loads into the user's own model class,
    with no vgame code in it, and runs as ``model(x)`` with the committed final state's values."""
    import torch
    from safetensors.torch import load_file
    from tiny_task.model import RowTransformer  # type: ignore[import-not-found]

    from game.delivery import fetch_model
    from tests.agents.conftest import commit

    cfg = own_task.replace(steps=3)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)
    got = fetch_model(roles["client"], task_id, store, data_key, tmp_path / "model.safetensors")
    weights = load_file(str(got.path))
    model = RowTransformer(cfg.model.width, cfg.model.heads, cfg.model.layers, cfg.dropout).eval()
    model.load_state_dict(weights)  # strict: every name and shape of the user's class
    with torch.no_grad():
        logits = model(torch.rand(4, 8, 8))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert got.steps == 3 and got.preset == cfg.task
