"""A trainer whose transcript is damaged after its commit (issue 44: "a damaged workdir is a dead
end"): it is restored from the store by the node itself; where the store cannot give it back,
finalize and withdraw still go ahead and the node says how to mend it, and doing what it says
mends it. Every case damages a real transcript directory on disk."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from game.agents import AgentError
from game.chain.types import Outcome, TaskStatus
from game.merkle import MerkleTree
from game.training.transcript.layout import LEAVES_NAME, MANIFEST_NAME
from game.training.transcript.reader import Transcript
from tests.agents.conftest import commit, games, run_game, withdrawn


def _flip_leaf(transcript: Path, step: int) -> None:
    """One bit of leaf ``step`` changed in place: the file is whole, its root is not the committed one."""
    path = transcript / LEAVES_NAME
    data = bytearray(path.read_bytes())
    data[32 * step] ^= 0x01
    path.write_bytes(bytes(data))


def _audited(agents: Any) -> None:
    """Step the auditor until its replay has a verdict (it fetched the blob while the store held it)."""
    for _ in range(10):
        agents.auditor.step()
        if agents.auditor.verdict is not None:
            return
    raise AssertionError("the auditor gave no verdict")


def _trainer_paid(client: Any, task_id: int) -> bool:
    (finalized,) = client.get_events("TaskFinalized", 0, task_id=task_id)
    return bool(finalized.trainer_paid)


def _blob_path(store: Any, roles: dict[str, Any], task_id: int) -> Path:
    path: Path = store.path(roles["client"].task(task_id).transcript_id)
    assert path.is_file()
    return path


def test_transcriptDamagedAfterCommit_isRestoredFromTheStore_andTheTrainerWinsItsGame(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any
) -> None:
    """A lying auditor challenges, so the trainer must prove its leaves with a transcript whose
    leaf file was changed after the commit: before, the node stopped for good."""
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg, strategy="lying", seed=1)
    commit(agents, roles["client"], task_id)
    committed_root = roles["client"].task(task_id).state_root
    _flip_leaf(agents.trainer.transcript_dir, 3)
    restarted = make_agents(task_id, tiny_cfg, strategy="lying", seed=1, actions=agents.actions)
    actions = run_game(restarted, roles["client"], task_id)
    restores = [a for a in actions if (a.actor, a.what) == ("trainer", "restore")]
    assert len(restores) == 1, actions
    assert "not the committed" in restores[0].detail and "from the store" in restores[0].detail
    assert MerkleTree(Transcript(restarted.trainer.transcript_dir).leaves()).root == committed_root
    (game,) = games(roles["client"], task_id)
    assert game.outcome == Outcome.TRAINER_WON
    assert _trainer_paid(roles["client"], task_id)
    assert not list(restarted.trainer.taskdir.glob(".restoring-*"))  # no half-fetched copy left


def test_transcriptDamaged_andNotInTheStore_finalizeAndWithdrawGoAhead_andTheNodeSaysHowToMend(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, store: Any
) -> None:
    """No game comes, so the trainer needs no transcript: it is paid after the window, having said
    once what is wrong and what to do. Its damaged files are left as they were (not deleted)."""
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    commit(agents, roles["client"], task_id)
    _audited(agents)
    assert agents.auditor.verdict == "match"
    manifest = agents.trainer.transcript_dir / MANIFEST_NAME
    manifest.write_text("{ not json")
    blob = _blob_path(store, roles, task_id)
    blob.unlink()
    restarted = make_agents(task_id, tiny_cfg, actions=agents.actions)
    actions = run_game(restarted, roles["client"], task_id)
    said = [a for a in actions if (a.actor, a.what) == ("trainer", "damaged")]
    assert len(said) == 1, actions  # once, not every round
    fix = said[0].detail
    assert str(manifest.parent) in fix and blob.name in fix
    assert f"delete {restarted.trainer.transcript_dir} and run this node again" in fix
    task = roles["client"].task(task_id)
    assert task.status == TaskStatus.FINALIZED and _trainer_paid(roles["client"], task_id)
    assert withdrawn(roles["client"], roles["trainer"].me) == task.payment + task.trainer_bond
    assert restarted.trainer.done
    assert manifest.read_text() == "{ not json"


def test_transcriptDamaged_notInTheStore_withAGameInPlay_stopsWithTheFix_andTheFixMendsIt(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, store: Any, tmp_path: Path
) -> None:
    """A game the trainer cannot answer: it stops with the one error that says how to mend the
    transcript. Doing what it says (deleting the directory, running the node again) trains the
    task into it again, with the committed leaves, and the trainer wins."""
    from game.store.blobs import BlobStore

    task_id = post_task(tiny_cfg)
    judge_store = BlobStore(tmp_path / "judge-store")  # the judge's own copy of the blob: only the
    agents = make_agents(task_id, tiny_cfg, strategy="lying", seed=1, judge_store=judge_store)
    commit(agents, roles["client"], task_id)  # trainer's store loses it
    blob = _blob_path(store, roles, task_id)
    judge_store.path(bytes.fromhex(blob.name)).parent.mkdir(parents=True)
    shutil.copy(blob, judge_store.path(bytes.fromhex(blob.name)))
    _audited(agents)
    agents.auditor.step()  # its challenge
    assert roles["client"].task(task_id).live_games == 1
    _flip_leaf(agents.trainer.transcript_dir, 0)
    blob.unlink()
    restarted = make_agents(task_id, tiny_cfg, strategy="lying", seed=1, judge_store=judge_store)
    with pytest.raises(AgentError) as stopped:
        restarted.trainer.step()
    said = str(stopped.value)
    assert said.startswith(f"a game of task {task_id} is in play and this trainer cannot prove the leaves")
    assert f"delete {restarted.trainer.transcript_dir} and run this node again" in said
    shutil.rmtree(restarted.trainer.transcript_dir)  # what it says to do
    again = make_agents(task_id, tiny_cfg, strategy="lying", seed=1, judge_store=judge_store)
    actions = run_game(again, roles["client"], task_id)
    assert ("trainer", "train") in [(a.actor, a.what) for a in actions]
    (game,) = games(roles["client"], task_id)
    assert game.outcome == Outcome.TRAINER_WON
    assert _trainer_paid(roles["client"], task_id)


@pytest.mark.parametrize("how", ["lost", "damaged"])
def test_aDemandedChunkLostFromTheTrainersDisk_isRestoredFromTheStore_andPosted(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, how: str
) -> None:
    """The node held its transcript to the committed leaves only: a log chunk lost (or damaged) on
    its disk after the commit raised out of every step once an auditor demanded it, on every
    restart, until the trainer lost the task on its clock. The store has the chunk."""
    from game.training.transcript.layout import chunk_relpath

    client = roles["client"]
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    commit(agents, client, task_id)
    chunk = agents.trainer.transcript_dir / chunk_relpath(3)
    if how == "lost":
        chunk.unlink()
    else:
        chunk.write_bytes(b"not the chunk")
    roles["auditor"].challenge_data(task_id, 3)
    agents = make_agents(task_id, tiny_cfg)  # a node started after the loss
    assert [a.what for a in agents.trainer.step()] == ["provide"]
    (g,) = games(client, task_id)
    assert g.outcome == Outcome.ANSWERED and not client.task(task_id).trainer_lost
    assert Transcript(agents.trainer.transcript_dir).chunk_bytes(3)  # whole again
