"""The trainer agent against an honest auditor on another profile: no challenge, paid after the window."""

from __future__ import annotations

from typing import Any

from game.chain.types import TaskStatus
from tests.agents.conftest import run_game, withdrawn


def test_honest_trainer_is_paid_after_the_window(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    actions = run_game(agents, roles["client"], task_id)
    whats = [(a.actor, a.what) for a in actions]
    assert ("trainer", "commit") in whats
    assert ("auditor", "replay") in whats
    assert agents.auditor.verdict == "match"
    assert not any(a.what in ("challenge", "reveal", "respond", "rule") for a in actions)
    task = roles["client"].task(task_id)
    assert task.status == TaskStatus.FINALIZED
    assert withdrawn(roles["client"], roles["trainer"].me) == task.payment + task.trainer_bond
    assert agents.trainer.done and agents.auditor.done
