"""``vgame node trainer --rehearse NAME@S``: the CLI resolves a deviation of ``game.strategies`` and
hands it to the trainer agent, which plays it (and is caught at step S) and keeps its name in its
state; a bad spec is one line naming the valid choices."""

from __future__ import annotations

import json
from typing import Any

import pytest

from game.agents import AgentError
from game.chain.types import Outcome
from game.cli.rehearse import REHEARSALS, Rehearsal, parse_rehearsal
from game.errors import ConfigError
from game.scenarios import SCENARIOS
from game.strategies.trainers import DEVIATIONS
from tests.agents.conftest import games, run_game, small_config


def test_everyDeviationOfTheRegistry_canBeRehearsed() -> None:
    assert {SCENARIOS.get(name).deviation for name in REHEARSALS} == set(DEVIATIONS.names())
    assert REHEARSALS == ("poison", "skip-step", "wrong-lr", "tampered-log", "steer")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("poison@x", "give the step where the trainer deviates after the @, e.g. poison@4"),
        ("poison", "give the step where the trainer deviates after the @"),
        ("poison@", "give the step where the trainer deviates after the @"),
        ("poison@-1", "give the step where the trainer deviates after the @"),
        ("nope@3", "no deviation is called 'nope'"),
        ("Poison@3", "no deviation is called 'Poison'"),  # the registry's class names are not the CLI's
        ("poison@0", "the task has steps 1..8, not 0"),
        ("steer@9", "the task has steps 1..8, not 9"),
    ],
)
def test_aBadRehearsal_isOneLine_namingTheValidChoices(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_rehearsal(spec, small_config())
    said = str(refused.value)
    assert said.startswith(f"--rehearse {spec}: ") and says in said and "\n" not in said
    assert (
        "valid: poison@S, skip-step@S, wrong-lr@S, tampered-log@S, steer@S, with S a step of the task, 1..8"
        in said
    )


@pytest.mark.parametrize("name", REHEARSALS)
def test_eachRehearsal_makesItsScenariosDeviation_atItsStep(name: str) -> None:
    cfg = small_config()
    rehearsal = parse_rehearsal(f"{name}@3", cfg)
    assert rehearsal == Rehearsal(name, 3) and rehearsal.spec == f"{name}@3"
    made = rehearsal.deviation(cfg)
    assert type(made) is DEVIATIONS.get(SCENARIOS.get(name).deviation or "")
    assert made.step == 3  # type: ignore[attr-defined]
    assert rehearsal.banner(7).startswith(f"REHEARSAL {name}@3: this trainer cheats on task 7 on purpose")


def test_aRehearsingTrainer_isCaughtAtItsStep_andKeepsItsRehearsalInItsStateAndActions(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    from trainer_node.agent import TrainerAgent

    rehearsal = parse_rehearsal("poison@5", tiny_cfg)
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    agents.trainer = TrainerAgent(  # as `vgame node trainer --rehearse poison@5` builds it
        roles["trainer"], task_id, tiny_cfg, profile=agents.trainer.profile, workdir=agents.trainer.workdir,
        store=agents.trainer.store, data_key=agents.trainer.data_key,
        deviation=rehearsal.deviation(tiny_cfg), rehearsal=rehearsal.spec,
    )  # fmt: skip
    actions = run_game(agents, roles["client"], task_id)
    (game,) = games(roles["client"], task_id)
    assert game.outcome == Outcome.AUDITOR_WON and game.pinned_step == 5
    state = json.loads((agents.trainer.taskdir / "trainer.json").read_text())
    assert state["rehearsal"] == "poison@5"
    marked = {a.what for a in actions if a.actor == "trainer" and "REHEARSAL poison@5" in a.detail}
    assert marked == {"train", "commit"}


def test_aWorkdir_keepsTheRehearsalItWasStartedWith(
    roles: dict[str, Any], post_task: Any, tiny_cfg: Any, store: Any, data_key: bytes, tmp_path: Any
) -> None:
    """A transcript trained part honest and part deviating (or with two deviations) commits to
    neither: a restart with another --rehearse, or with none, is refused, and so is a rehearsal in an
    honest trainer's workdir."""
    from trainer_node.agent import TrainerAgent

    def trainer(task_id: int, workdir: str, spec: str | None) -> TrainerAgent:
        rehearsal = None if spec is None else parse_rehearsal(spec, tiny_cfg)
        return TrainerAgent(
            roles["trainer"], task_id, tiny_cfg, profile="cpu-1t", workdir=tmp_path / workdir, store=store,
            data_key=data_key, deviation=None if rehearsal is None else rehearsal.deviation(tiny_cfg),
            rehearsal=spec,
        )  # fmt: skip

    rehearsed, honest = post_task(tiny_cfg), post_task(tiny_cfg)
    trainer(rehearsed, "rehearsing", "skip-step@2").step()
    trainer(honest, "honest", None).step()
    for task_id, workdir, spec, says in (
        (rehearsed, "rehearsing", None, "is the workdir of a rehearsal, skip-step@2: run it again with --rehearse skip-step@2"),
        (rehearsed, "rehearsing", "poison@2", "run it again with --rehearse skip-step@2, or give this trainer a fresh"),
        (honest, "honest", "poison@2", "is the workdir of an honest trainer: run it again with no --rehearse"),
    ):  # fmt: skip
        with pytest.raises(AgentError, match=says):
            trainer(task_id, workdir, spec).step()
    assert trainer(rehearsed, "rehearsing", "skip-step@2").step() == []  # the same one goes on
