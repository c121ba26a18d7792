"""A game over an asynchronous task (issue 45, item 4): a trainer whose parameter server applied
stale gradients, one micro-batch of which it poisoned, is pinned at the first update that applies
a poisoned micro-batch, and the judge re-runs that update from its pre-state and the older states
its schedule names, each proved against the committed state root. A trainer that trains on one
micro-batch twice (and so leaves one out) is pinned at the update that repeats it, and the judge
rules on the earlier update's chunk, proved against the committed log root."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from game.chain.types import EndReason, Outcome, Phase, TaskStatus
from game.evidence import Evidence
from game.judge import ChunkEvidenceError, VersionEvidenceError
from game.merkle import MerkleTree
from game.training.engine.scheduled import train_scheduled
from game.training.log.schedule import ScheduleEntry
from game.training.state.leafhash import leaf_of
from game.training.transcript.reader import Transcript
from tests.agents.conftest import (
    TRAINER_PROFILE,
    PoisonBatch,
    games,
    run_game,
    seal_elsewhere,
    small_config,
    withdrawn,
)
from tests.training.schedules import repeating_schedule, simulated_schedule, write_unchecked

POISON_DATA_STEP = 4


def _schedule(steps: int) -> tuple[list[ScheduleEntry], int]:
    """A simulated asynchronous schedule whose first update applying a micro-batch of the poisoned
    step also computes on a state older than its pre-state (the judge needs a proof for it)."""
    for seed in range(200):
        entries, _, _ = simulated_schedule(steps, 2, 2, workers=3, seed=seed)
        first = min(e.update for e in entries if any(a.micro.step == POISON_DATA_STEP for a in e.applied))
        if first > 1 and entries[first - 1].versions[0] < first - 1:
            return entries, first
    raise AssertionError("no seed gives a stale first poisoned update")


@pytest.fixture
def async_game(roles: dict[str, Any], post_task: Any, make_agents: Any) -> tuple[Any, int, int, list]:
    cfg = small_config(accumulate=2, max_staleness=2)
    entries, first = _schedule(cfg.steps)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    poisoned = PoisonBatch(cfg, POISON_DATA_STEP).batch(POISON_DATA_STEP)
    assert poisoned is not None
    train_scheduled(
        cfg, TRAINER_PROFILE, agents.trainer.transcript_dir, entries, poison={POISON_DATA_STEP: poisoned}
    )
    return agents, task_id, first, entries


def _pinned(agents: Any, client: Any, task_id: int) -> int:
    for _ in range(60):
        agents.trainer.step()
        agents.auditor.step()
        found = games(client, task_id)
        if found and found[0].phase == Phase.PINNED:
            return int(client.get_events("Challenged", 0, task_id=task_id)[0].game_id)
    raise AssertionError("the game was never pinned")


def test_asyncGame_pinsTheFirstPoisonedUpdate_andTheAuditorWins(
    roles: dict[str, Any], async_game: tuple[Any, int, int, list]
) -> None:
    agents, task_id, first, _ = async_game
    client = roles["client"]
    run_game(agents, client, task_id)
    (g,) = games(client, task_id)
    assert g.hi == first and g.lo == first - 1
    assert g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING


def test_asyncJudge_takesEveryNamedStateWithItsProof_andRefusesAnyOther(
    roles: dict[str, Any], async_game: tuple[Any, int, int, list]
) -> None:
    agents, task_id, first, entries = async_game
    client = roles["client"]
    gid = _pinned(agents, client, task_id)
    judge = agents.judge
    good = judge.gather(gid)
    stale = [v for v in entries[first - 1].versions if v != first - 1]
    assert sorted(good.versions) == stale
    ruling = judge.evaluate(gid, good)
    assert ruling.step == first and not ruling.trainer_right

    t = Transcript(agents.trainer.transcript_dir)
    v = stale[0]
    data, proof = good.versions[v]
    other = t.load_checkpoint(0) if v != 0 else t.load_checkpoint(t.checkpoint_steps()[1])
    tree = MerkleTree(t.leaves())
    bad = {
        "a state missing": {},
        "another state under its proof": {**good.versions, v: (other, proof)},
        "a proof of another leaf": {**good.versions, v: (data, tree.proof(v + 1))},
    }
    for name, versions in bad.items():
        with pytest.raises(VersionEvidenceError):
            judge.rule_on(gid, dataclasses.replace(good, versions=versions))
        assert client.get_events("Ruled", 0, game_id=gid) == [], name
    assert [a.what for a in judge.step()] == ["rule"]
    assert client.game(gid).outcome == Outcome.AUDITOR_WON


REPEAT_AT = 6


@pytest.fixture
def repeat_game(roles: dict[str, Any], post_task: Any, make_agents: Any) -> tuple[Any, int, Any, int]:
    cfg = small_config(accumulate=2, max_staleness=2)
    honest, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=3)
    entries, micro, w = repeating_schedule(honest, REPEAT_AT)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    write_unchecked(cfg, TRAINER_PROFILE, agents.trainer.transcript_dir, entries)
    return agents, task_id, micro, w


def test_asyncGame_overAMicroBatchAppliedTwice_pinsTheRepeat_andTheAuditorWins(
    roles: dict[str, Any], repeat_game: tuple[Any, int, Any, int]
) -> None:
    agents, task_id, micro, w = repeat_game
    client = roles["client"]
    gid = _pinned(agents, client, task_id)
    g = client.game(gid)
    assert (g.lo, g.hi) == (REPEAT_AT - 1, REPEAT_AT)
    judge = agents.judge
    good = judge.gather(gid)
    assert sorted(good.earlier) == [w]
    ruling = judge.evaluate(gid, good)
    assert not ruling.trainer_right and f"micro-batch {micro} was applied by update {w}" in ruling.note
    # the witness is what decides: without it the update, re-run alone, is what the trainer committed
    assert judge.evaluate(gid, dataclasses.replace(good, earlier={})).trainer_right
    data, proof = good.earlier[w]
    hashes = Transcript(agents.trainer.transcript_dir).chunk_hashes()
    forged = {
        "another chunk under its proof": {w: (data + b"\0", proof)},
        "a proof of another leaf": {w: (data, MerkleTree(hashes).proof(w + 1))},
        "a later update's chunk": {REPEAT_AT + 1: (data, proof)},
    }
    for name, earlier in forged.items():
        with pytest.raises(ChunkEvidenceError):
            judge.rule_on(gid, dataclasses.replace(good, earlier=earlier))
        assert client.get_events("Ruled", 0, game_id=gid) == [], name
    run_game(agents, client, task_id)
    assert client.game(gid).outcome == Outcome.AUDITOR_WON and client.game(gid).reason == EndReason.RULING


def test_asyncGame_withALaterUpdatesScheduleThatDoesNotParse_stillGivesTheJudgeTheNamedStates(
    async_game: tuple[Any, int, int, list], roles: dict[str, Any]
) -> None:
    """The auditor found the states the pinned update names by parsing every update's entry: one
    that does not parse, anywhere (here the last update's chunk is another update's), left it the
    pre-state alone. The judge, given the pre-state, fetched no checkpoint to rebuild the others
    from, never ruled, and the game went void: the poisoning trainer was paid."""
    from tests.training.test_unfit_chunks import replace_chunks

    agents, task_id, first, _ = async_game
    out = agents.trainer.transcript_dir
    cfg = Transcript(out).config
    replace_chunks(out, {cfg.steps: Transcript(out).chunk_bytes(cfg.steps - 1)})
    _pinned(agents, roles["client"], task_id)
    agents.auditor.step()  # leaves its evidence before the judge first looks
    run_game(agents, roles["client"], task_id)
    (g,) = games(roles["client"], task_id)
    assert g.pinned_step == first and g.outcome == Outcome.AUDITOR_WON and g.reason == EndReason.RULING


@dataclasses.dataclass(frozen=True)
class _AgreeAll:
    """A lying auditor that challenges and agrees with every leaf: the game pins the last update."""

    name: str = "agree-all"
    silent_once_challenged: bool = False

    def challenges(self, honest: bool) -> bool:
        return True

    def answer(self, game: Any, game_id: int, honest: bool) -> bool:
        return True


def test_asyncGame_whereALiarLeavesThePreStateAlone_theJudgeRebuildsTheRest_andTheTrainerWins(
    roles: dict[str, Any], post_task: Any, make_agents: Any, evidence_dir: Any
) -> None:
    """Anyone may leave states for the judge. Given the pre-state alone, the judge fetched no
    checkpoint, could not rebuild the older state the update names, and never ruled: the liar had
    its bond back (invariant 3: the honest trainer wins). It now fetches what it rebuilds from."""
    from game.evidencedir import pre_state_path

    cfg = small_config(accumulate=2, max_staleness=2)
    for seed in range(200):
        entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=seed)
        if entries[-1].versions[0] < cfg.steps - 1:
            break
    else:
        raise AssertionError("no seed gives a last update that computes on an older state")
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    agents.auditor.strategy = _AgreeAll()
    train_scheduled(cfg, TRAINER_PROFILE, agents.trainer.transcript_dir, entries)
    client = roles["client"]
    _pinned(agents, client, task_id)
    agents.auditor.step()  # leaves its evidence
    (g,) = games(client, task_id)
    assert g.pinned_step == cfg.steps
    keep = pre_state_path(evidence_dir, g.lo_leaf)
    for path in evidence_dir.iterdir():
        if path != keep:
            path.unlink()
    assert [p.name for p in evidence_dir.iterdir()] == [keep.name]
    run_game(agents, client, task_id)
    (g,) = games(client, task_id)
    assert g.outcome == Outcome.TRAINER_WON and g.reason == EndReason.RULING


def _gathered(agents: Any, monkeypatch: pytest.MonkeyPatch) -> list[Evidence]:
    """Every evidence the judge gathers from here on, in order."""
    gathered: list[Evidence] = []
    real = agents.judge.gather
    monkeypatch.setattr(agents.judge, "gather", lambda gid: gathered.append(real(gid)) or gathered[-1])
    return gathered


def test_withheldTranscript_anAsyncPoisonedRun_theAuditorReadsTheLogOffTheChain_andWinsAtTheFirstPoisonedUpdate(
    roles: dict[str, Any], async_game: tuple[Any, int, int, list], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An asynchronous task's withheld transcript shielded it: the auditor would not replay its log
    from the chain, and a trainer that poisoned a micro-batch and sealed its transcript under
    another key was paid. Now the auditor reads every piece, replays by the schedule the chunks
    carry, and bisects to the first update that applies a poisoned micro-batch. That update
    computes on an older state, which nobody can prove without the trainer's leaves: the judge
    replays it from the chunks on-chain and rules for the auditor."""
    seal_elsewhere(monkeypatch)  # before the trainer node publishes (its first step)
    agents, task_id, first, entries = async_game
    client = roles["client"]
    gathered = _gathered(agents, monkeypatch)
    actions = run_game(agents, client, task_id)
    said = [(a.actor, a.what, a.detail) for a in actions]
    task = client.task(task_id)
    assert len(client.get_events("DataProvided", task_id=task_id)) >= task.num_leaves
    bisections = [g for g in games(client, task_id) if not g.availability]
    assert [(g.pinned_step, g.outcome, g.reason) for g in bisections] == [
        (first, Outcome.AUDITOR_WON, EndReason.RULING)
    ], said
    assert any(a.what == "replay" and "from the log posted on-chain" in a.detail for a in actions), said
    (ev,) = gathered
    stale = sorted(v for v in entries[first - 1].versions if v != first - 1)
    assert stale and ev.versions == {} and sorted(ev.replayed) == stale
    t = Transcript(agents.trainer.transcript_dir)  # the trainer's own copy: the states it committed
    assert all(leaf_of(ev.replayed[v]) == t.leaf(v) for v in stale)
    assert task.status == TaskStatus.FINALIZED and withdrawn(client, roles["trainer"].me) == 0


def test_withheldTranscript_anHonestAsyncRun_theLogReadOffTheChainMatches_andTheTrainerIsPaid(
    roles: dict[str, Any], post_task: Any, make_agents: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seal_elsewhere(monkeypatch)
    client = roles["client"]
    cfg = small_config(accumulate=2, max_staleness=2)
    entries, _ = _schedule(cfg.steps)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    train_scheduled(cfg, TRAINER_PROFILE, agents.trainer.transcript_dir, entries)
    actions = run_game(agents, client, task_id)
    task = client.task(task_id)
    assert agents.auditor.verdict == "match", [(a.actor, a.what, a.detail) for a in actions]
    assert all(g.availability and g.outcome == Outcome.ANSWERED for g in games(client, task_id))
    assert withdrawn(client, roles["trainer"].me) == task.payment + task.trainer_bond


def test_withheldTranscript_anAsyncRunApplyingAMicroBatchTwice_theJudgeFindsTheWitnessOnChain(
    roles: dict[str, Any], repeat_game: tuple[Any, int, Any, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeat, withheld: the auditor's replay of the chunks on-chain finds the micro-batch
    applied again (its leaves are the rejected-schedule mark from there), and the judge takes the
    earlier update's chunk from the chain as its witness."""
    seal_elsewhere(monkeypatch)
    agents, task_id, _, w = repeat_game
    client = roles["client"]
    gathered = _gathered(agents, monkeypatch)
    actions = run_game(agents, client, task_id)
    bisections = [g for g in games(client, task_id) if not g.availability]
    assert [(g.pinned_step, g.outcome, g.reason) for g in bisections] == [
        (REPEAT_AT, Outcome.AUDITOR_WON, EndReason.RULING)
    ], [(a.actor, a.what, a.detail) for a in actions]
    (ev,) = gathered
    t = Transcript(agents.trainer.transcript_dir)
    assert sorted(ev.earlier) == [w] and ev.earlier[w][0] == t.chunk_bytes(w)
