"""The trainer agent against an honest auditor on another profile: no challenge, paid after the window."""

from __future__ import annotations

from typing import Any

import pytest

from game.chain.types import TaskStatus
from game.training.transcript.reader import steps_on_disk
from tests.agents.conftest import run_game, small_config, withdrawn


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


def test_trainerAcceptsBeforeTraining_clientCannotCancelTheWorkAway(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """Issue 44: the client could cancel until the commit was mined, front-running it after the
    trainer had done the work. The trainer accepts (and bonds) first; a cancel mid-training is refused."""
    from game.chain.errors import CommitWindowOpen

    task_id = post_task(tiny_cfg)
    refused: list[Exception] = []

    def progress(label: str, done: int, total: int) -> None:
        if label == "train" and done == 3:
            try:
                roles["client"].with_options(prechecks=False).cancel(task_id)  # the contract's own refusal
            except CommitWindowOpen as exc:
                refused.append(exc)

    agents = make_agents(task_id, tiny_cfg, progress=progress)
    actions = agents.trainer.step()
    assert [a.what for a in actions] == ["accept", "train", "publish", "commit"], actions
    assert len(refused) == 1 and refused[0].task_id == task_id  # type: ignore[attr-defined]
    assert roles["client"].task(task_id).status == TaskStatus.COMMITTED


def test_commitWindowPassesWhileTraining_clientCancels_trainingStops(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer that does not commit within the window it accepted: the client cancels and takes
    the payment and the trainer's bond; the training stops at its next look and commits nothing."""
    import trainer_node.agent as trainer_module

    cfg = small_config(steps=40)
    task_id = post_task(cfg, commit_window=60)
    monkeypatch.setattr(trainer_module, "CANCEL_CHECK_S", 0.0)  # look at the task after every step
    client = roles["client"]

    def progress(label: str, done: int, total: int) -> None:
        if label == "train" and done == 5:
            client.chain.time_travel(61)
            client.cancel(task_id)

    agents = make_agents(task_id, cfg, progress=progress)
    actions = agents.trainer.step()
    assert [a.what for a in actions] == ["accept", "cancelled"], actions
    assert "nothing to commit (5 steps trained are kept in" in actions[1].detail
    assert steps_on_disk(agents.trainer.transcript_dir) == 6  # leaf 0 and steps 1-5: not 40
    task = client.task(task_id)
    assert task.status == TaskStatus.CANCELLED
    assert client.credit() == task.payment + task.trainer_bond
    assert agents.trainer.step() == [] and agents.trainer.done  # said once; nothing left to do


def test_clockTooShortForThePolicy_refusedBeforeAccepting(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """The node's own terms: a clock too short to answer every game under congestion is refused
    before the trainer bonds anything or trains."""
    from game.agents import AgentError

    task_id = post_task(tiny_cfg, clock_allowance=10)
    agents = make_agents(task_id, tiny_cfg)
    with pytest.raises(AgentError, match="the clock allowance is 10 s, under the 30 s"):
        agents.trainer.step()
    assert roles["client"].task(task_id).status == TaskStatus.OPEN
    assert steps_on_disk(agents.trainer.transcript_dir) == 0


def test_termsOutsideTheNodesPolicy_refusedBeforeAccepting_andWithinIt_accepted(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """``vgame node trainer --min-payment/--max-bond/--max-challenge-window``: a task that pays too
    little, bonds too much or holds the pay too long is refused before anything is locked."""
    from dataclasses import replace

    from game.agents import AgentError
    from game.protocol.terms import TermsPolicy

    task_id = post_task(tiny_cfg)
    task = roles["client"].task(task_id)
    agents = make_agents(task_id, tiny_cfg)
    fits = TermsPolicy(
        min_payment=task.payment, max_bond=task.trainer_bond, max_challenge_window=task.challenge_window
    )
    for change, says in (
        ({"min_payment": task.payment + 1}, "the payment is"),
        ({"max_bond": task.trainer_bond - 1}, "the trainer's bond is"),
        ({"max_challenge_window": task.challenge_window - 1}, "the challenge window is"),
    ):
        agents.trainer.policy = replace(fits, **change)
        with pytest.raises(AgentError, match=f"not working on task {task_id}: {says}"):
            agents.trainer.step()
        assert roles["client"].task(task_id).status == TaskStatus.OPEN
    agents.trainer.policy = fits
    assert agents.trainer.step()[0].what == "accept"


def test_commitWindowTooShortForTheTraining_refusedBeforeAccepting_atTheMarginItAsks(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """A trainer that cannot commit within the window loses its bond to the client, however honest
    its work: it times a step first, and takes the task only where the window holds ``commit_margin``
    times its steps' time."""
    from dataclasses import replace

    from game.agents import AgentError

    task_id = post_task(tiny_cfg, commit_window=60)
    agents = make_agents(task_id, tiny_cfg)
    trainer = agents.trainer
    trainer.policy = replace(trainer.policy, commit_margin=10**9)
    with pytest.raises(
        AgentError, match=f"not working on task {task_id}: the commit window is 60 s, and training"
    ):
        trainer.step()
    assert trainer._estimate is not None
    estimate = trainer._estimate.training_s
    assert 0 < estimate < 60
    trainer.policy = replace(trainer.policy, commit_margin=60 / estimate * 1.01)
    with pytest.raises(AgentError, match="the commit window is 60 s"):
        trainer.step()
    assert roles["client"].task(task_id).status == TaskStatus.OPEN
    assert steps_on_disk(trainer.transcript_dir) == 0
    trainer.policy = replace(trainer.policy, commit_margin=60 / estimate * 0.99)
    assert trainer.step()[0].what == "accept"
    assert trainer._estimate.training_s == estimate  # timed once


def test_slowHardware_refusesAWindowTheDefaultMarginDoesNotHold_andOnceBondedTrainsWhateverTheWindow(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer_node.agent as trainer_module
    from game.agents import AgentError
    from game.training.engine.train import StepProbe

    task_id = post_task(tiny_cfg, commit_window=60)
    agents = make_agents(task_id, tiny_cfg)
    timed: list[str] = []

    def slow(cfg: Any, profile: str) -> StepProbe:
        timed.append(profile)
        return StepProbe(4.0, 100)  # 8 steps: 32 s, and the default margin asks for 64

    monkeypatch.setattr(trainer_module, "probe_steps", slow)
    with pytest.raises(AgentError, match="training the task takes this trainer about 32 s: it asks for 2x"):
        agents.trainer.step()
    assert timed == [agents.trainer.profile]
    roles["trainer"].accept(task_id)  # bonded (another process of this trainer accepted it)
    assert [a.what for a in agents.trainer.step()] == ["train", "publish", "commit"]
    assert timed == [agents.trainer.profile]  # not weighed again: the bond is posted


def test_chunksOverTheTrainersCap_refusedBeforeAccepting_asMeasuredOnTheTasksOwnSteps(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """A trainer may cap the chunks it takes a task for (each piece of one is a demand it may have
    to answer on-chain): the cap is weighed against the task's own first steps, before the bond."""
    from dataclasses import replace

    from game.agents import AgentError
    from game.training.transcript.reader import Transcript

    task_id = post_task(tiny_cfg)
    trainer = make_agents(task_id, tiny_cfg).trainer
    assert trainer.policy.max_chunk_bytes is None  # no cap unless asked: any chunk can be answered
    trainer.policy = replace(trainer.policy, max_chunk_bytes=1)
    with pytest.raises(AgentError, match=r"a log chunk of the task is about \d+ bytes, over the 1 bytes"):
        trainer.step()
    assert trainer._estimate is not None
    size = trainer._estimate.chunk_bytes
    trainer.policy = replace(trainer.policy, max_chunk_bytes=size - 1)
    with pytest.raises(AgentError, match=f"about {size} bytes"):
        trainer.step()
    trainer.policy = replace(trainer.policy, max_chunk_bytes=size)
    assert [a.what for a in trainer.step()][:2] == ["accept", "train"]
    t = Transcript(trainer.transcript_dir)
    assert size == max(len(t.chunk_bytes(1)), len(t.chunk_bytes(2)))  # what the training then wrote


def test_chainResetWhileTraining_stopsTheTraining_withTheOneError(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its look at the task in passing swallowed every error (an outage passes): hours more training
    for a task the reset chain no longer holds. A contract gone from its address stops it."""
    import trainer_node.agent as trainer_module
    from game.errors import ContractGone

    cfg = small_config(steps=40)
    task_id = post_task(cfg)
    monkeypatch.setattr(trainer_module, "CANCEL_CHECK_S", 0.0)  # look at the task after every step
    trainer_client = roles["trainer"]

    def progress(label: str, done: int, total: int) -> None:
        if label == "train" and done == 5:  # the contract's address holds no code from here on
            gone = "0x" + "11" * 20
            monkeypatch.setattr(trainer_client, "address", gone)
            contract = trainer_client.chain.w3.eth.contract(
                address=gone, abi=trainer_client.artifact.abi_list
            )
            monkeypatch.setattr(trainer_client, "contract", contract)

    agents = make_agents(task_id, cfg, progress=progress)
    assert agents.trainer.client is trainer_client
    with pytest.raises(ContractGone, match="the game contract is gone from 0x1111"):
        agents.trainer.step()
    assert steps_on_disk(agents.trainer.transcript_dir) == 6  # leaf 0 and steps 1-5: not 40


def test_taskWithAnotherLeafCount_isRefusedBeforeTraining(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """Issue 44 (truncated commitment): the client posted the right spec but a leaf count that is not
    steps + 1. The contract would refuse the trainer's commitment after the training, so the trainer
    refuses the task up front, with a clear error, and trains nothing."""
    from game.agents import AgentError

    task_id = post_task(tiny_cfg, num_leaves=tiny_cfg.num_leaves - 1)
    agents = make_agents(task_id, tiny_cfg)
    with pytest.raises(
        AgentError, match=rf"asks on-chain for {tiny_cfg.num_leaves - 1} leaves, but its config"
    ):
        agents.trainer.step()
    assert steps_on_disk(agents.trainer.transcript_dir) == 0
    assert roles["client"].task(task_id).status == TaskStatus.OPEN
