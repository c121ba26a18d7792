"""The auditor agent: replay on its own profile, challenge, bisect to the first bad step, win the bond."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from game.chain.types import EndReason, Outcome, TaskStatus
from tests.agents.conftest import (
    PoisonBatch,
    TamperInit,
    commit,
    games,
    reward,
    run_game,
    small_config,
    withdrawn,
)


@pytest.mark.parametrize("poison_step", [1, 5, 8])
def test_poisoned_trainer_is_pinned_at_the_poisoned_step(
    roles: dict[str, Any], post_task: Any, make_agents: Any, poison_step: int
) -> None:
    cfg = small_config()
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=PoisonBatch(cfg, poison_step))
    run_game(agents, roles["client"], task_id)

    assert agents.auditor.verdict == "mismatch"
    (g,) = games(roles["client"], task_id)
    assert g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING
    assert g.pinned_step == poison_step
    # leaves before S agree with the trainer's, the one at S does not
    trainer_leaves = agents.trainer.tree()
    own = agents.auditor.leaves
    assert [own[i] for i in range(poison_step)] == [trainer_leaves.leaf(i) for i in range(poison_step)]
    assert own[poison_step] != trainer_leaves.leaf(poison_step)

    task = roles["client"].task(task_id)
    assert task.status == TaskStatus.FINALIZED and task.trainer_lost
    assert withdrawn(roles["client"], roles["auditor"].me) == task.auditor_bond + reward(task)
    assert withdrawn(roles["client"], roles["trainer"].me) == 0
    assert (
        withdrawn(roles["client"], roles["client"].me) == 0
    )  # the client's payment is credited, not yet taken
    split = task.trainer_bond - task.trainer_bond // 2 - reward(task)
    assert roles["client"].credit(roles["client"].me) == task.payment + split


def test_dispute_of_the_initial_state(roles: dict[str, Any], post_task: Any, make_agents: Any) -> None:
    cfg = small_config(steps=4)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=TamperInit())
    actions = run_game(agents, roles["client"], task_id)
    (g,) = games(roles["client"], task_id)
    assert g.dispute_init and g.pinned_step == 0
    assert g.outcome == Outcome.AUDITOR_WON
    assert not any(a.what == "reveal" for a in actions)
    assert any(a.what == "rule" and a.leaf_index == 0 for a in actions)


def test_lying_auditor_loses_whatever_path_it_takes(
    roles: dict[str, Any], post_task: Any, make_agents: Any
) -> None:
    cfg = small_config()
    for seed in range(3):
        task_id = post_task(cfg)
        agents = make_agents(task_id, cfg, strategy="lying", seed=seed)
        run_game(agents, roles["client"], task_id)
        (g,) = games(roles["client"], task_id)
        assert g.outcome == Outcome.TRAINER_WON and g.reason == EndReason.RULING
        assert roles["client"].task(task_id).status == TaskStatus.FINALIZED


def test_silent_auditor_loses_on_its_clock(roles: dict[str, Any], post_task: Any, make_agents: Any) -> None:
    cfg = small_config()
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, strategy="silent-after-challenge")
    run_game(agents, roles["client"], task_id)
    (g,) = games(roles["client"], task_id)
    assert g.outcome == Outcome.TRAINER_WON and g.reason == EndReason.TIMEOUT
    task = roles["client"].task(task_id)
    assert (
        withdrawn(roles["client"], roles["trainer"].me)
        == task.payment + task.trainer_bond + task.auditor_bond
    )


@pytest.mark.parametrize("kind", ["skip-step", "tampered-log"])
def test_deviations_whose_chunk_does_not_fit_are_pinned(
    roles: dict[str, Any], post_task: Any, make_agents: Any, kind: str
) -> None:
    """An empty chunk at S (skip) or a tampered one: the auditor's leaves before S equal the trainer's,
    the step is pinned at S and the judge (replaying with the committed chunk) finds for the auditor."""
    from game.strategies.trainers import SkipStep, TamperedLog

    cfg = small_config()
    step = 4
    deviation = SkipStep(cfg, step) if kind == "skip-step" else TamperedLog(cfg, step)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=deviation)
    run_game(agents, roles["client"], task_id)
    (g,) = games(roles["client"], task_id)
    assert g.pinned_step == step and g.outcome == Outcome.AUDITOR_WON
    tree = agents.trainer.tree()
    assert agents.auditor.leaves[:step] == [tree.leaf(i) for i in range(step)]


def test_trueStateWithAChunkThatDoesNotFit_isPinnedThere_andTheHonestAuditorWins(
    roles: dict[str, Any], post_task: Any, make_agents: Any
) -> None:
    """The trainer computes every step honestly and publishes step 4's chunk short of its last
    record. The auditor (the noisy profile) runs step 4 without the log and lands elsewhere; the
    judge (splitk-16), run without the log, lands on the trainer's leaf, as the trainer's own
    profile does. The judge used to rule on that run, so the honest auditor lost its bond over a
    log that does not fit; now it rules against such a chunk on every profile."""
    from tests.agents.conftest import ShortChunk

    cfg = small_config()
    step = 4
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=ShortChunk(step))
    actions = run_game(agents, roles["client"], task_id)
    (g,) = games(roles["client"], task_id)
    assert g.pinned_step == step and g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING
    (ruled,) = [a for a in actions if a.what == "rule"]
    assert "log does not decode or fit" in ruled.detail
    tree = agents.trainer.tree()
    assert agents.auditor.leaves[:step] == [tree.leaf(i) for i in range(step)]


def test_trainerLyingAboutOneLeaf_isPinnedThere_thoughTheAuditorsLeavesMeetItsAgain(
    roles: dict[str, Any], post_task: Any, make_agents: Any
) -> None:
    """The trainer commits a false leaf 1 and computes every step from its true state, step 6 on
    hardware that rounds otherwise (the noisy profile; its log is valid). The auditor (cpu-2t)
    diverges first at step 1 and runs on without the trainer's log: its leaves meet the trainer's
    again at 2..5 and part at 6. It used to agree where they met, so the game pinned step 6 and the
    judge, re-running it with its valid log, found for the trainer. It disagrees from step 1 on."""
    from game.merkle import merkle_root
    from game.training.engine.step import engine_for
    from game.training.engine.train import Deviation, train
    from game.training.transcript.reader import Transcript

    cfg = small_config()
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    agents.auditor.profile = "cpu-2t"

    class OtherHardwareAt6(Deviation):
        def engine(self, step: int, honest: Any) -> Any:
            return engine_for(cfg, "noisy") if step == 6 else honest

    out = agents.trainer.transcript_dir
    train(cfg, "cpu-1t", out, deviation=OtherHardwareAt6())
    t = Transcript(out)
    leaves = t.leaves()
    leaves[1] = bytes(31) + b"\x01"
    (out / "leaves.bin").write_bytes(b"".join(leaves))
    manifest = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(manifest.replace(t.manifest.state_root, merkle_root(leaves).hex()))
    Transcript(out).verify()

    run_game(agents, roles["client"], task_id)
    own = agents.auditor.leaves
    assert [own[i] == leaves[i] for i in range(len(leaves))] == [i not in (1, 6, 7, 8) for i in range(9)]
    (g,) = games(roles["client"], task_id)
    assert g.pinned_step == 1 and g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING


def test_transcriptNotInTheStoreYet_isWaitedFor_notAFailure(
    roles: dict[str, Any], post_task: Any, make_agents: Any, store: Any, data_key: bytes, tmp_path: Any
) -> None:
    """A store synced between machines may lag the chain: the auditor waits for the blob, then replays."""
    import shutil

    from auditor_node.agent import AuditorAgent
    from game.agents import AgentError, NotThereYet
    from game.store.blobs import BlobStore
    from tests.agents.conftest import AUDITOR_PROFILE

    cfg = small_config(steps=3)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)  # the trainer trains, publishes to its store and commits
    lagging = BlobStore(tmp_path / "lagging")
    auditor = AuditorAgent(
        roles["auditor"], task_id, profile=AUDITOR_PROFILE, workdir=tmp_path / "far-auditor",
        store=lagging, data_key=data_key,
    )  # fmt: skip
    with pytest.raises(NotThereYet, match="not in the store yet") as caught:
        auditor.step()
    assert not isinstance(caught.value, AgentError)  # a node rides it out instead of stopping
    assert auditor.verdict is None
    shutil.copytree(store.root, lagging.root, dirs_exist_ok=True)  # the sync catches up
    auditor.step()
    assert auditor.verdict == "match"


def test_transcriptNeverPublished_stopsTheAuditorOnceTheWindowCloses_sayingNothingWasAudited(
    roles: dict[str, Any], post_task: Any, make_agents: Any, store: Any, data_key: bytes, tmp_path: Any
) -> None:
    """Waiting for a transcript that never comes used to go on after the window closed, for ever
    (or, had it stopped, "done" would have read as "audited"): a trainer that withholds its
    transcript is paid, and the auditor says so once it can no longer challenge."""
    from auditor_node.agent import AuditorAgent
    from game.agents import AgentError, NotThereYet
    from game.store.blobs import BlobStore
    from tests.agents.conftest import AUDITOR_PROFILE

    cfg = small_config(steps=3)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)
    auditor = AuditorAgent(
        roles["auditor"], task_id, profile=AUDITOR_PROFILE, workdir=tmp_path / "far-auditor",
        store=BlobStore(tmp_path / "empty"), data_key=data_key,
    )  # fmt: skip
    with pytest.raises(NotThereYet):  # the window is open: wait
        auditor.step()
    chain = roles["client"].chain
    chain.time_travel(roles["client"].task(task_id).window_ends - chain.now() + 1)
    with pytest.raises(
        AgentError, match="before the trainer's transcript reached the store, so nothing was audited in time"
    ):
        auditor.step()  # the window closed
    roles["client"].finalize(task_id)
    with pytest.raises(
        AgentError, match="before the trainer's transcript reached the store, so nothing was audited in time"
    ):
        auditor.step()  # and the task is settled
    assert auditor.verdict is None
    shutil.copytree(store.root, tmp_path / "empty", dirs_exist_ok=True)  # it comes after all
    auditor.step()
    assert auditor.verdict == "match"  # replayed all the same, too late to challenge


def test_aLargeTranscript_showsItsPublishAndFetch_asBarsInMiB(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishing and fetching a paper-size transcript takes tens of seconds: the node's bars say
    so, in MiB, each ending whole (which is what takes it off the screen)."""
    import game.agents

    monkeypatch.setattr(game.agents, "BYTES_BAR_FROM", 0)  # this transcript is kilobytes
    seen: dict[str, list[tuple[int, int]]] = {}

    def progress(label: str, done: int, total: int) -> None:
        seen.setdefault(label, []).append((done, total))

    cfg = small_config(steps=3)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, progress=progress)
    run_game(agents, roles["client"], task_id)
    assert agents.auditor.verdict == "match"
    for label in ("publish, MiB", "fetch, MiB"):
        assert seen[label][-1] == (1, 1)  # kilobytes round up to one MiB, done at the end
        assert all(done <= total for done, total in seen[label])


def _cut_short(transcript: Path) -> None:
    chunk = sorted((transcript / "log").iterdir())[2]
    chunk.write_bytes(chunk.read_bytes()[:-3])


def _no_manifest(transcript: Path) -> None:
    (transcript / "manifest.json").write_bytes(b"")


def _gone(transcript: Path) -> None:
    shutil.rmtree(transcript)


@pytest.mark.parametrize("damage", [_cut_short, _no_manifest, _gone])
def test_aFetchedTranscriptDamagedOnDisk_isFetchedAgain_byTheRestartedNode(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    store: Any,
    data_key: bytes,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
) -> None:
    """The fetched files are not synced: a machine that stops before they reach its disk leaves
    them cut short or gone, while the node's state says "fetched". Its restart fetched nothing
    again and stopped on "damaged" for ever; the store still holds the blob."""
    from auditor_node.agent import AuditorAgent
    from tests.agents.conftest import AUDITOR_PROFILE

    cfg = small_config(steps=4)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)

    def auditor() -> AuditorAgent:
        return AuditorAgent(
            roles["auditor"], task_id, profile=AUDITOR_PROFILE, workdir=tmp_path / "auditor",
            store=store, data_key=data_key,
        )  # fmt: skip

    first = auditor()
    with (
        mock.patch("game.training.engine.audit.audit", side_effect=RuntimeError("the machine stopped")),
        pytest.raises(RuntimeError, match="the machine stopped"),
    ):
        first.step()  # fetched, then stopped before the replay
    assert first.state.get("fetched") == roles["client"].task(task_id).transcript_id.hex()
    damage(first.transcript_dir)
    restarted = auditor()
    with caplog.at_level(logging.WARNING, logger="auditor_node.replay"):
        restarted.step()
    assert restarted.verdict == "match"
    assert any("no longer verifies" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("time_travel", "window_left", "warned"),
    [(False, 10, True), (False, 10_000, False), (True, 10, False)],  # a test chain's clock is no guide
)
def test_replayTooSlowForTheWindow_isSaidOnce_early(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    time_travel: bool,
    window_left: int,
    warned: bool,
) -> None:
    import time
    from types import SimpleNamespace

    import auditor_node.replay as replay_module

    monkeypatch.setattr(replay_module, "PACE_CHECK_S", 0.0)
    now = 1_800_000_000
    chain = SimpleNamespace(supports_time_travel=time_travel, now=lambda: now)
    pace = replay_module._Pace(
        SimpleNamespace(chain=chain), SimpleNamespace(window_ends=now + window_left), 7
    )  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="auditor_node.replay"):
        for done in range(1, 6):  # some 20 steps a second: 1,000 steps take some 50 s
            pace.step(done, 1000)
            time.sleep(0.05)
    said = [r.getMessage() for r in caplog.records if "too late" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert said[0].startswith("task 7: at ") and "after the challenge window closes 2027-01-15" in said[0]
