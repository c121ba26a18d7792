"""The judge: verified evidence only, one re-run step, and no ruling at all without valid evidence."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from game.chain.types import EndReason, Outcome, Phase, TaskStatus
from game.evidencedir import pre_state_path
from game.judge import (
    ChunkEvidenceError,
    ConfigEvidenceError,
    Evidence,
    EvidenceError,
    PreStateEvidenceError,
    TranscriptEvidenceError,
)
from game.merkle import MerkleTree
from game.store.blobs import BlobStore
from game.training.transcript.reader import Transcript
from tests.agents.conftest import PoisonBatch, games, small_config, withdrawn

POISON_STEP = 3


def _pin(agents: Any, client: Any, task_id: int) -> int:
    """Step trainer and auditor (never the judge) until their game is pinned; its id."""
    for _ in range(50):
        agents.trainer.step()
        agents.auditor.step()
        found = games(client, task_id)
        if found and found[0].phase == Phase.PINNED:
            return int(client.get_events("Challenged", 0, task_id=task_id)[0].game_id)
    raise AssertionError("the game was never pinned")


def _no_ruling(client: Any, gid: int) -> None:
    assert client.game(gid).phase == Phase.PINNED
    assert client.get_events("Ruled", 0, game_id=gid) == []


@pytest.fixture
def pinned(roles: dict[str, Any], post_task: Any, make_agents: Any) -> tuple[Any, int, int]:
    cfg = small_config()
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=PoisonBatch(cfg, POISON_STEP))
    gid = _pin(agents, roles["client"], task_id)
    assert roles["client"].game(gid).hi == POISON_STEP
    return agents, task_id, gid


def test_bad_evidence_raises_and_is_never_a_ruling(
    roles: dict[str, Any], pinned: tuple[Any, int, int]
) -> None:
    agents, _task_id, gid = pinned
    judge, client = agents.judge, roles["client"]
    good = judge.gather(gid)
    ruling = judge.evaluate(gid, good)
    assert ruling.step == POISON_STEP and not ruling.trainer_right and ruling.tx is None

    t = agents.trainer
    from game.training.transcript.reader import Transcript

    tr = Transcript(t.transcript_dir)
    other_chunk = tr.chunk_bytes(POISON_STEP + 1)
    bad = {
        "config": (
            dataclasses.replace(good, config=good.config.replace(seed=good.config.seed + 1)),
            ConfigEvidenceError,
        ),
        "chunk of another step": (dataclasses.replace(good, chunk=other_chunk), ChunkEvidenceError),
        "proof of another index": (
            dataclasses.replace(
                good, chunk=other_chunk, chunk_proof=MerkleTree(tr.chunk_hashes()).proof(POISON_STEP + 1)
            ),
            ChunkEvidenceError,
        ),
        "no chunk proof": (dataclasses.replace(good, chunk_proof=None), ChunkEvidenceError),
        "pre-state of another step": (
            dataclasses.replace(good, pre_state=tr.load_checkpoint(0)),
            PreStateEvidenceError,
        ),
        "no pre-state": (dataclasses.replace(good, pre_state=None), PreStateEvidenceError),
    }
    for name, (evidence, error) in bad.items():
        with pytest.raises(error):
            judge.rule_on(gid, evidence)
        _no_ruling(client, gid)
        assert name

    # a forged file in the evidence directory is ignored: the judge rebuilds the pre-state itself
    assert agents.auditor.evidence_dir is not None
    forged = pre_state_path(agents.auditor.evidence_dir, client.game(gid).lo_leaf)
    forged.write_bytes(tr.load_checkpoint(0))
    assert judge.gather(gid).pre_state == good.pre_state

    actions = judge.step()
    assert [a.what for a in actions] == ["rule"]
    g = client.game(gid)
    assert g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING


def test_step_zero_needs_the_right_config(roles: dict[str, Any], post_task: Any, make_agents: Any) -> None:
    from tests.agents.conftest import TamperInit

    cfg = small_config(steps=2)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=TamperInit())
    gid = _pin(agents, roles["client"], task_id)
    g = roles["client"].game(gid)
    assert g.dispute_init and g.hi == 0
    with pytest.raises(ConfigEvidenceError):
        agents.judge.rule_on(gid, Evidence(config=cfg.replace(seed=cfg.seed + 1)))
    _no_ruling(roles["client"], gid)
    ruling = agents.judge.rule_on(gid, Evidence(config=cfg))
    assert ruling.step == 0 and not ruling.trainer_right


def test_judge_without_evidence_does_not_rule_and_the_game_is_void(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_config()
    task_id = post_task(cfg)
    agents = make_agents(
        task_id, cfg, deviation=PoisonBatch(cfg, POISON_STEP), judge_store=BlobStore(tmp_path / "empty")
    )
    gid = _pin(agents, roles["client"], task_id)
    client = roles["client"]
    with pytest.raises(TranscriptEvidenceError):
        agents.judge.gather(gid)
    with caplog.at_level("INFO", logger="game.judge"):
        assert agents.judge.step() == []
        # said, not warned, the first round: evidence left on the step after the pin is still to come
        first = [r for r in caplog.records if "no ruling" in r.getMessage()]
        assert [r.levelname for r in first] == ["INFO"]
        assert agents.judge.step() == []
        again = [r for r in caplog.records if "no ruling" in r.getMessage()][1:]
        assert [r.levelname for r in again] == ["WARNING"]
    assert isinstance(agents.judge.last_errors[gid], EvidenceError)
    _no_ruling(client, gid)

    client.chain.time_travel(client.deadline(gid) - client.chain.now() + 1)
    assert agents.judge.step() == []  # too late to rule
    from tests.agents.conftest import run_game

    run_game(agents, client, task_id)
    g = client.game(gid)
    assert g.outcome == Outcome.VOID and g.reason == EndReason.JUDGE_TIMEOUT
    task = client.task(task_id)
    assert task.status == TaskStatus.FINALIZED and task.any_void and not task.trainer_lost
    assert withdrawn(client, roles["auditor"].me) == task.auditor_bond
    # nobody was shown wrong: the trainer is paid (a silent judge cannot hand the client free training)
    assert withdrawn(client, roles["trainer"].me) == task.payment + task.trainer_bond
    assert client.credit(client.me) == 0


def test_judge_withAKeyThatIsNotTheTasksJudge_saysSo_insteadOfWaiting(
    roles: dict[str, Any], post_task: Any, tmp_path: Path, store: Any, data_key: bytes
) -> None:
    """With another account's key a judge sees no game of its own and would wait out its window."""
    from game.agents import AgentError
    from game.judge import Judge
    from tests.agents.conftest import small_config

    task_id = post_task(small_config(steps=2))
    wrong = Judge(roles["trainer"], profile="cpu-1t", workdir=tmp_path / "j", store=store, data_key=data_key,
                  task_id=task_id)  # fmt: skip
    with pytest.raises(AgentError, match=f"task {task_id}'s judge is {roles['judge'].me}"):
        wrong.step()
    right = Judge(roles["judge"], profile="cpu-1t", workdir=tmp_path / "j2", store=store, data_key=data_key,
                  task_id=task_id)  # fmt: skip
    assert right.step() == []


def test_judge_dropsItsCopyOfATranscript_onceTheTaskIsSettled(
    roles: dict[str, Any], pinned: tuple[Any, int, int]
) -> None:
    """A judge of every task fetched a decrypted copy of each transcript it ruled on and kept them
    all: as large as the training's log each, they filled its disk over time."""
    from game.agents import drive

    agents, task_id, _gid = pinned
    judge, client = agents.judge, roles["client"]
    assert [a.what for a in judge.step()] == ["rule"]
    copy = judge.workdir / "transcripts" / str(task_id)
    assert copy.is_dir() and str(task_id) in judge.state.get("fetched", {})
    judge.step()
    assert copy.is_dir()  # the task is not settled yet: another auditor's game may need it
    drive([agents.trainer, agents.auditor], client, [task_id])
    assert client.task(task_id).status == TaskStatus.FINALIZED
    judge.step()
    assert not copy.exists() and judge.state.get("fetched", {}) == {}
    judge.store.check(client.task(task_id).transcript_id)  # the sealed blob stays in the store


def test_judgeOfEveryTask_asksTheChainAboutAnotherJudgesPinOnce(
    roles: dict[str, Any], pinned: tuple[Any, int, int], tmp_path: Path, store: Any, data_key: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Every round rescans the newest blocks; a judge of every task asked the chain for the task of
    each pin there again, every round, for pins that another judge rules on."""
    from game.judge import Judge

    _agents, task_id, gid = pinned
    other = roles["client"]  # an account that judges nothing here
    judge = Judge(other, profile="cpu-1t", workdir=tmp_path / "other", store=store, data_key=data_key)
    asked: list[int] = []
    real = other.task
    monkeypatch.setattr(other, "task", lambda tid: asked.append(tid) or real(tid))
    assert judge.pinned_games() == [] and asked == [task_id]
    assert judge.pinned_games() == [] and asked == [task_id]  # the same blocks, scanned again
    mine = Judge(roles["judge"], profile="cpu-1t", workdir=tmp_path / "mine", store=store, data_key=data_key)
    assert mine.pinned_games() == [gid] and mine.pinned_games() == [gid]


def test_judge_decryptsAndWritesOnlyTheFilesItsStepNeeds(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judge re-runs one step; it fetched the whole transcript, every checkpoint of which is the
    model's whole state (1.5 GB each at GPT-2 small). It now takes the manifest, the two hash
    files, the step's chunk and, to rebuild the pre-state, the nearest checkpoint before the step
    and the chunks from there, and decrypts only the segments those lie in."""
    import game.store.archive
    import game.store.sealing
    from game.store.sealing import SealedFile

    monkeypatch.setattr(game.store.sealing, "SEGMENT", 4096)  # sealing and reading: a transcript of many
    monkeypatch.setattr(game.store.archive, "SEGMENT", 4096)
    cfg = small_config(steps=12)  # checkpoints at 0, 4, 8 and 12
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=PoisonBatch(cfg, 7), use_evidence=False)
    gid = _pin(agents, roles["client"], task_id)
    assert roles["client"].game(gid).hi == 7
    read: set[int] = set()
    real = SealedFile._segment

    def spy(self: SealedFile, index: int) -> bytes:
        read.add(index)
        return real(self, index)

    monkeypatch.setattr(SealedFile, "_segment", spy)
    assert [a.what for a in agents.judge.step()] == ["rule"]
    g = roles["client"].game(gid)
    assert g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING
    copy = agents.judge.workdir / "transcripts" / str(task_id)
    got = {p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()}
    assert got == {
        ".archive-names.json", "manifest.json", "leaves.bin", "chunk_hashes.bin",
        "checkpoints/state-000000004.bin", "log/step-000000005.bin", "log/step-000000006.bin",
        "log/step-000000007.bin",
    }  # fmt: skip
    blob = agents.judge.store.path(roles["client"].task(task_id).transcript_id)
    segments = -(-(blob.stat().st_size - 21) // (4096 + 16))
    assert 0 < len(read) < segments  # the other checkpoints' segments were never decrypted


def test_judgesCopy_gainsTheFilesALaterGameNeeds_andOneLostToACrashAgain(
    roles: dict[str, Any], pinned: tuple[Any, int, int]
) -> None:
    """Another auditor's game of the same task may pin another step; a crash may cut the copy."""
    agents, task_id, gid = pinned
    judge = agents.judge
    task = roles["client"].task(task_id)
    judge.gather(gid)  # step 3
    copy = judge.workdir / "transcripts" / str(task_id)
    before = {p.relative_to(copy).as_posix() for p in copy.rglob("*.bin")}
    assert "log/step-000000003.bin" in before and "log/step-000000007.bin" not in before
    judge._transcript(task_id, task, 7, rebuild=True)
    have = {p.relative_to(copy).as_posix() for p in copy.rglob("*.bin")}
    assert before | {"checkpoints/state-000000004.bin", "log/step-000000005.bin", "log/step-000000006.bin",
                     "log/step-000000007.bin"} == have  # fmt: skip
    (copy / "log" / "step-000000007.bin").unlink()  # what a crash before its rename leaves
    t = judge._transcript(task_id, task, 7, rebuild=True)
    assert t.chunk_bytes(7) == Transcript(agents.trainer.transcript_dir).chunk_bytes(7)


def test_judge_withAnotherDataKey_saysItIsItsOwn_andDoesNotRule(
    roles: dict[str, Any], pinned: tuple[Any, int, int], tmp_path: Path, store: Any
) -> None:
    """The task's key hash is on-chain: a judge holding another key says that its key is wrong (not
    that the trainer's transcript does not open), and rules nothing from a transcript it cannot read."""
    from game.judge import Judge
    from game.store.keys import new_key

    _agents, task_id, gid = pinned
    stranger = Judge(
        roles["judge"], profile="splitk-16", workdir=tmp_path / "other-judge", store=store,
        data_key=new_key(), evidence_dir=None, task_id=task_id,
    )  # fmt: skip
    with pytest.raises(TranscriptEvidenceError, match=f"this judge's data key is not task {task_id}'s"):
        stranger.gather(gid)
    _no_ruling(roles["client"], gid)


def test_judge_whoseTaskOrTranscriptFails_givesThatGameNoRuling_andGoesOn(
    roles: dict[str, Any], pinned: tuple[Any, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer's manifest naming a task module the judge's machine lacks raised a ConfigError out
    of ``step``: a judge of every task stopped, and every other pinned game went void with it."""
    from game.judge import Judge
    from game.training.task.plugins import PluginError

    agents, _task_id, gid = pinned
    judge, client = agents.judge, roles["client"]

    def plugin_missing(self: Judge, game_id: int) -> Evidence:
        raise PluginError("task 'no_such_module:task': no module named 'no_such_module'")

    with monkeypatch.context() as patched:
        patched.setattr(Judge, "gather", plugin_missing)
        assert judge.step() == []
    assert isinstance(judge.last_errors[gid], PluginError)
    _no_ruling(client, gid)
    (ruled,) = judge.step()  # the cause gone, the game is ruled on
    assert ruled.what == "rule" and client.game(gid).outcome == Outcome.AUDITOR_WON


def test_evidence_underALeafsNameThatDoesNotHashToIt_isReplacedByTheAuditor_andAnUnreadableOneIgnored(
    pinned: tuple[Any, int, int], evidence_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone may write into the evidence directory. A file left under the pre-state's leaf before
    the pin (junk, by the trainer) kept the auditor from writing its state there; and a file too
    large to read (a sparse 1 TiB one) raised MemoryError out of the judge."""
    from game.evidencedir import write_pre_state
    from game.training.state.leafhash import leaf_of

    agents, _task_id, gid = pinned
    judge = agents.judge
    good = judge.gather(gid)
    assert good.pre_state is not None
    path = pre_state_path(evidence_dir, leaf_of(good.pre_state))
    path.write_bytes(b"junk")
    assert write_pre_state(evidence_dir, good.pre_state) == path
    assert path.read_bytes() == good.pre_state

    real = Path.read_bytes

    def too_large(self: Path) -> bytes:
        if self == path:
            raise MemoryError("Unable to allocate 1.00 TiB")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", too_large)
    assert judge._left_state(leaf_of(good.pre_state)) is None  # ignored: the judge rebuilds instead


def test_aConfigLeftForTheJudge_nestedTooDeepToParse_isInvalidEvidence_notACrash(
    roles: dict[str, Any], pinned: tuple[Any, int, int], evidence_dir: Path
) -> None:
    """Anyone may leave a config for a step-0 dispute. JSON nested 200,000 deep ran the C decoder
    off its stack (the chain libraries raise the recursion limit to 100,000): the judge died of a
    segmentation fault, and again on every restart."""
    from game.evidencedir import config_path

    agents, task_id, _gid = pinned
    task = roles["client"].task(task_id)
    config_path(evidence_dir, task.spec_hash).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigEvidenceError, match="cannot be read"):
        agents.judge._config(task, None)


def test_aConfigLeftForTheJudge_namingAModuleOfItsOwn_isNeverImported(
    roles: dict[str, Any],
    pinned: tuple[Any, int, int],
    evidence_dir: Path,
    planted: tuple[str, Path],
) -> None:
    """A config left in the evidence directory was loaded, importing the module its ``task`` names,
    before its spec hash was compared: anyone who may write there ran code of theirs in the judge.
    It is now held to the task's spec hash, with the inputs recorded beside it, before it loads."""
    import json

    from game.evidencedir import config_path

    name, mark = planted
    agents, task_id, _gid = pinned
    task = roles["client"].task(task_id)
    config_path(evidence_dir, task.spec_hash).write_text(
        json.dumps({**small_config().to_dict(), "task": name})
    )
    with pytest.raises(ConfigEvidenceError, match="not a task config"):
        agents.judge._config(task, None)
    assert not mark.exists()


@pytest.mark.parametrize("how", ["missing", "altered"])
def test_judgeWithoutEvidence_rebuildsPastACheckpointTheTrainerLeftOutOrAltered(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """A judge that cannot read the auditor's evidence rebuilds the agreed state from the nearest
    checkpoint. Nothing checks the checkpoints a trainer publishes: with that one altered the judge
    never ruled, the game went void, and the poisoning trainer was paid (one left out was passed
    over already: the archive does not list it). It now fetches every file up to the step and
    replays from further back."""
    from tests.agents.conftest import publish_without_checkpoint

    cfg = small_config()  # 8 steps, checkpoints 0, 4 and 8
    publish_without_checkpoint(monkeypatch, tmp_path, 4, how)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=PoisonBatch(cfg, 6), use_evidence=False)
    gid = _pin(agents, roles["client"], task_id)
    assert roles["client"].game(gid).lo == 5
    (ruled,) = agents.judge.step()
    assert ruled.what == "rule" and roles["client"].game(gid).outcome == Outcome.AUDITOR_WON
