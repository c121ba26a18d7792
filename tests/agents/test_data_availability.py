"""Issue 44, exploit 4, at the nodes: a transcript nobody can open is no longer paid.

Found as a new user would: a trainer whose node sealed its transcript under a wrong data key
committed and was paid; the auditor could not open the blob and stopped without challenging. Now the
task carries the key's hash, so

* the trainer node refuses a key that is not the task's before it accepts or trains, and opens its
  own blob before committing;
* an auditor that cannot open the blob (with the task's key: its own mistake is refused first)
  demands a piece of a log chunk on-chain; a trainer that does not post it loses the task, and one
  that does holds its data (the piece is public in ``DataProvided``). A chunk larger than one
  transaction takes is answered a piece at a time (``game.chunkleaf``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from game.agents import AgentError, drive
from game.chain.types import EndReason, Outcome, TaskStatus
from game.chunkleaf import PIECE_BYTES, piece_count
from game.store.keys import new_key
from game.training.transcript.reader import Transcript, steps_on_disk
from tests.agents.conftest import commit, games, reward, seal_elsewhere, small_config, withdrawn


def _trainer(roles: dict[str, Any], task_id: int, cfg: Any, store: Any, key: bytes, workdir: Path) -> Any:
    from trainer_node.agent import TrainerAgent

    return TrainerAgent(
        roles["trainer"], task_id, cfg, profile="cpu-1t", workdir=workdir, store=store, data_key=key
    )


def test_trainerGivenAnotherKey_refusesBeforeAcceptingOrTraining(
    roles: dict[str, Any], post_task: Any, tiny_cfg: Any, store: Any, tmp_path: Path
) -> None:
    """The new user's mistake: the trainer node was handed another key than the client's. It used to
    train, seal the transcript under that key, commit and be paid for a transcript nobody could open."""
    task_id = post_task(tiny_cfg)  # under the fixtures' data key
    trainer = _trainer(roles, task_id, tiny_cfg, store, new_key(), tmp_path / "trainer")
    try:
        trainer.step()
    except AgentError as exc:
        assert "the data key given is not the task's" in str(exc)
    trained = steps_on_disk(trainer.transcript_dir)
    status = roles["client"].task(task_id).status
    assert (trained, status) == (0, TaskStatus.OPEN), (
        f"a trainer holding another key than the task's trained {trained} steps; the task is {status.name}"
    )


def test_blobNotOpeningUnderTheKey_trainerRefusesToCommit(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's own check before its commit: it opens the blob it published under the task's key."""
    import trainer_node.agent as trainer_module

    real = trainer_module.publish_directory
    monkeypatch.setattr(
        trainer_module, "publish_directory", lambda st, _k, *a, **kw: real(st, new_key(), *a, **kw)
    )
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    with pytest.raises(AgentError, match="does not open under the task's data key"):
        agents.trainer.step()
    assert roles["client"].task(task_id).status == TaskStatus.ACCEPTED  # bonded, nothing committed


def _sealed_elsewhere(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    cfg: Any,
    monkeypatch: pytest.MonkeyPatch,
    task_options: dict[str, Any] | None = None,
    **agent_options: Any,
) -> tuple[int, Any]:
    """A task whose trainer published its transcript under another key and skipped its node's check
    (a trainer that means it, or a node of an older version): committed, the blob unopenable."""
    seal_elsewhere(monkeypatch)
    task_id = post_task(cfg, **(task_options or {}))
    agents = make_agents(task_id, cfg, **agent_options)
    commit(agents, roles["client"], task_id)
    return task_id, agents


def test_unopenableTranscript_withheld_auditorDemandsAChunk_trainerLosesTheTask(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exploit: the transcript does not open under the task's key and the trainer posts nothing
    on-chain. The auditor demands a chunk instead of stopping; the trainer's clock runs out; the
    client gets its payment back, the auditor its bond and a reward, the trainer nothing."""
    client = roles["client"]
    task_id, agents = _sealed_elsewhere(roles, post_task, make_agents, tiny_cfg, monkeypatch)
    drive([agents.auditor, agents.judge], client, [task_id])  # the trainer no longer answers
    (g,) = games(client, task_id)
    task = client.task(task_id)
    assert (g.availability, g.outcome, g.reason, task.status) == (
        True,
        Outcome.AUDITOR_WON,
        EndReason.TIMEOUT,
        TaskStatus.FINALIZED,
    ), f"the trainer of an unopenable transcript: game {g.outcome.name}, task {task.status.name}"
    assert agents.auditor.verdict == "unavailable"
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond + reward(task)
    assert withdrawn(client, roles["trainer"].me) == 0
    assert client.credit() == task.payment + task.trainer_bond - task.trainer_bond // 2 - reward(task)


def test_unopenableTranscript_trainerPostsTheChunk_itHoldsItsData(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same blob, but the trainer node keeps running: it answers the demand from its transcript
    (the chunk is public, checked against the log root) and nobody is shown wrong. What remains (a
    trainer that trained honestly and sealed the model under another key on purpose) is in
    docs/contract.md "Trust assumptions"."""
    client = roles["client"]
    # an auditor with no config at hand: it cannot read the rest of the log off the chain (below)
    task_id, agents = _sealed_elsewhere(
        roles, post_task, make_agents, tiny_cfg, monkeypatch, auditor_config=False
    )
    actions = drive(agents.all(), client, [task_id])
    (g,) = games(client, task_id)
    assert (g.availability, g.outcome, g.reason) == (True, Outcome.ANSWERED, EndReason.DATA_PROVIDED)
    (provided,) = client.get_events("DataProvided", task_id=task_id)
    chunk = Transcript(agents.trainer.transcript_dir).chunk_bytes(g.lo)
    assert piece_count(len(chunk)) == 1 and provided.data == chunk  # type: ignore[attr-defined]
    assert [a.what for a in actions if a.actor == "auditor"][:2] == ["replay", "demand"]
    assert any(a.what == "provide" and a.leaf_index == g.lo for a in actions)
    task = client.task(task_id)
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond  # its bond back
    assert withdrawn(client, roles["trainer"].me) == task.payment + task.trainer_bond


def test_auditorGivenAnotherKey_stopsWithoutDemanding(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, store: Any, tmp_path: Path
) -> None:
    """Its own mistake is not the trainer's: with a key that is not the task's it fetches nothing
    and demands nothing (a demand would be a false alarm)."""
    from auditor_node.agent import AuditorAgent

    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    commit(agents, roles["client"], task_id)
    auditor = AuditorAgent(
        roles["auditor"],
        task_id,
        profile="noisy",
        workdir=tmp_path / "other",
        store=store,
        data_key=new_key(),
    )
    with pytest.raises(AgentError, match="the data key given is not task"):
        auditor.step()
    assert games(roles["client"], task_id) == []


def test_transcriptMissingFromTheStore_demandedAfterTheGrace_unansweredLoses(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, tmp_path: Path, data_key: bytes
) -> None:
    """A transcript missing from the auditor's store is waited for (a synced store lags), then its
    chunk is demanded a quarter of the window after the commit; a trainer that never publishes nor
    answers loses, and the auditor, which never audited, settles the task and is paid."""
    from auditor_node.agent import AuditorAgent
    from game.agents import NotThereYet
    from game.store.blobs import BlobStore

    client = roles["client"]
    task_id = post_task(tiny_cfg)
    agents = make_agents(task_id, tiny_cfg)
    commit(agents, client, task_id)  # published to the trainer's store only
    auditor = AuditorAgent(
        roles["auditor"], task_id, profile="noisy", workdir=tmp_path / "lagging",
        store=BlobStore(tmp_path / "empty-store"), data_key=data_key,
    )  # fmt: skip
    with pytest.raises(NotThereYet):
        auditor.step()  # within the grace: wait for the store
    task = client.task(task_id)
    client.chain.time_travel(task.challenge_window // 4 + 1)
    demanded = auditor.step()
    assert [a.what for a in demanded] == ["demand"]
    drive([auditor], client, [task_id])  # the trainer is gone: nothing is posted
    (g,) = games(client, task_id)
    assert (g.availability, g.outcome) == (True, Outcome.AUDITOR_WON)
    task = client.task(task_id)
    assert task.status == TaskStatus.FINALIZED and auditor.verdict == "unavailable" and auditor.done
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond + reward(task)


def test_unopenableTranscript_aChunkOfSeveralPieces_theTrainerPostsTheDemandedPieceInOneSmallTransaction(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A packed log of a wider model: each step's chunk is some 330 KB, three pieces, larger than a
    node's pool takes in one transaction (128 KiB). A trainer node used to post a demanded chunk
    whole (and refused such tasks, not to lose its bond). Now the auditor's demand names a piece
    (here 7, which the contract reduces to 1 of 3) and the trainer posts that piece alone."""
    import game.protocol.solver as solver

    monkeypatch.setattr(solver, "data_probe_piece", lambda *_a: 7)
    cfg = small_config(
        log_format="packed", batch_size=512, model={"hidden": 512}, steps=2, checkpoint_interval=2
    )
    client = roles["client"]
    # the one demand alone (an auditor with the config would go on to read the whole log)
    task_id, agents = _sealed_elsewhere(roles, post_task, make_agents, cfg, monkeypatch, auditor_config=False)
    actions = drive(agents.all(), client, [task_id])
    (g,) = games(client, task_id)
    chunk = Transcript(agents.trainer.transcript_dir).chunk_bytes(g.lo)
    assert piece_count(len(chunk)) == 3, f"the chunk of step {g.lo} is {len(chunk)} bytes"
    assert (g.availability, g.outcome, g.reason, g.piece) == (
        True,
        Outcome.ANSWERED,
        EndReason.DATA_PROVIDED,
        1,
    )
    (provided,) = client.get_events("DataProvided", task_id=task_id)
    assert (provided.index, provided.piece, provided.chunk_length) == (g.lo, 1, len(chunk))  # type: ignore[attr-defined]
    assert provided.data == chunk[PIECE_BYTES : 2 * PIECE_BYTES]  # type: ignore[attr-defined]
    (posted,) = [a for a in actions if a.what == "provide"]
    assert "piece 1 of 3" in posted.detail
    tx = client.chain.w3.eth.get_transaction(posted.tx_hash)
    assert len(bytes(tx["input"])) < 128 * 1024  # what geth's pool takes
    task = client.task(task_id)
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond  # nobody was shown wrong
    assert withdrawn(client, roles["trainer"].me) == task.payment + task.trainer_bond


def test_withheldTranscript_aPoisonedRun_theAuditorReadsTheLogOffTheChain_andWinsAtThePoisonedStep(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hole left by a single demand: a trainer that trained step 4 on poisoned examples kept its
    transcript back and answered the demand, and the auditor, having nothing to replay, let it be
    paid. Now the auditor demands every piece of the log, replays the task from the chain, bisects
    to step 4, and the judge (which cannot open the transcript either) rules from the chunk on-chain."""
    from tests.agents.conftest import PoisonBatch

    client = roles["client"]
    task_id, agents = _sealed_elsewhere(
        roles, post_task, make_agents, tiny_cfg, monkeypatch, deviation=PoisonBatch(tiny_cfg, 4)
    )
    actions = drive(agents.all(), client, [task_id])
    task = client.task(task_id)
    posted = client.get_events("DataProvided", task_id=task_id)
    assert sorted(e.index for e in posted) == list(range(task.num_leaves))  # type: ignore[attr-defined]
    bisections = [g for g in games(client, task_id) if not g.availability]
    assert [(g.pinned_step, g.outcome, g.reason) for g in bisections] == [
        (4, Outcome.AUDITOR_WON, EndReason.RULING)
    ], [(a.actor, a.what, a.detail) for a in actions]
    assert any(a.what == "replay" and "from the log posted on-chain" in a.detail for a in actions)
    assert all(g.outcome == Outcome.ANSWERED for g in games(client, task_id) if g.availability)
    assert agents.auditor.verdict == "mismatch" and task.status == TaskStatus.FINALIZED
    assert withdrawn(client, roles["trainer"].me) == 0
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond * len(
        posted
    ) + task.auditor_bond + reward(task)


def test_withheldTranscript_anHonestRun_theLogReadOffTheChainMatches_andTheTrainerIsPaid(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same withholding by a trainer that trained honestly: the log read off the chain replays
    to its root on the auditor's other profile, nobody bisects, every bond goes back, and the
    trainer is paid (having paid a transaction for each piece it withheld)."""
    client = roles["client"]
    task_id, agents = _sealed_elsewhere(roles, post_task, make_agents, tiny_cfg, monkeypatch)
    actions = drive(agents.all(), client, [task_id])
    task = client.task(task_id)
    posted = client.get_events("DataProvided", task_id=task_id)
    assert len(posted) == task.num_leaves
    assert agents.auditor.verdict == "match", [(a.actor, a.what, a.detail) for a in actions]
    assert all(g.availability and g.outcome == Outcome.ANSWERED for g in games(client, task_id))
    assert withdrawn(client, roles["trainer"].me) == task.payment + task.trainer_bond
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond * len(posted)


@pytest.mark.parametrize("why", ["no config", "over the cap"])
def test_withheldTranscript_aLogTheAuditorCannotRead_isNotDemanded_andTheAuditorSaysWhy(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    tiny_cfg: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    why: str,
) -> None:
    """Without the task's config (no --config, none left) nothing can be replayed; over the cap
    its operator set on the pieces it demands (``--max-log-pieces``; one piece a step's chunk here)
    the log is not read. Either way the auditor demands no more than its one piece and says why,
    over the cap naming the log's size and the option that reads it."""
    client = roles["client"]
    pieces = tiny_cfg.num_leaves
    options = {"auditor_config": False} if why == "no config" else {"auditor_max_log_pieces": pieces - 1}
    task_id, agents = _sealed_elsewhere(roles, post_task, make_agents, tiny_cfg, monkeypatch, **options)
    with caplog.at_level("WARNING"):
        drive(agents.all(), client, [task_id])
    assert len(client.get_events("DataProvided", task_id=task_id)) == 1
    said = (
        ["no task config is at hand"]
        if why == "no config"
        else [
            f"the log has about {pieces} pieces, over the {pieces - 1}",
            f"--max-log-pieces {pieces} reads it",
        ]
    )
    assert all(s in caplog.text for s in said), caplog.text


class _AtTheLastSecond:
    """A trainer node that answers each demand at the last seconds of its clock: the chain's clock
    is moved there before the node steps."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.agent, name)

    def step(self) -> Any:
        from game.chain.types import Phase

        client = self.agent.client
        due = [
            client.deadline(gid)
            for gid in self.agent.game_ids()
            if client.game(gid).phase == Phase.AWAITING_DATA
        ]
        if due and min(due) - 2 > client.chain.now():
            client.chain.time_travel(min(due) - 2 - client.chain.now())
        return self.agent.step()


def test_withheldTranscript_aTrainerAnsweringEachDemandAtTheLastSecond_cannotRunTheWindowOut(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tiny_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window against a slow withholder: a window of two trainer clocks, a poisoned step 4, a
    withheld transcript, and a trainer that answers every demand at the last second. The auditor's
    first demand took one clock, the round that reads the log another, and the window had closed
    before the auditor could challenge: the trainer was paid. Now the time the trainer takes to
    answer is given back to the window, and the auditor wins at step 4."""
    from tests.agents.conftest import TASK_DEFAULTS, PoisonBatch

    client = roles["client"]
    clock_s = TASK_DEFAULTS["clock_allowance"]
    task_id, agents = _sealed_elsewhere(
        roles,
        post_task,
        make_agents,
        tiny_cfg,
        monkeypatch,
        task_options={"challenge_window": 2 * clock_s},
        deviation=PoisonBatch(tiny_cfg, 4),
    )
    (committed,) = client.get_events("Committed", task_id=task_id)
    slow = _AtTheLastSecond(agents.trainer)
    actions = drive([slow, agents.auditor, agents.judge], client, [task_id])
    bisections = [g for g in games(client, task_id) if not g.availability]
    assert [(g.pinned_step, g.outcome) for g in bisections] == [(4, Outcome.AUDITOR_WON)], [
        (a.actor, a.what, a.detail) for a in actions
    ]
    assert withdrawn(client, roles["trainer"].me) == 0
    posted = client.get_events("DataProvided", task_id=task_id)
    answered_at = [client.chain.w3.eth.get_block(e.block_number)["timestamp"] for e in posted]
    assert max(answered_at) > committed.window_ends  # the answers ran past the window's first end
    assert client.get_events("WindowExtended", task_id=task_id)
