"""The typed client on the embedded chain: deploy, the happy path, disputes, timeouts, events, views."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import FrozenInstanceError, fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from game.chain import errors as E
from game.chain.artifacts import load_artifact
from game.chain.client import GameHandle
from game.chain.deploy import deploy_contract
from game.chain.events import EVENT_CLASSES, GameEnded, StepPinned
from game.chain.types import ContractEvent, EndReason, Game, Outcome, Phase, Task, TaskStatus, snake
from game.chunkleaf import PIECE_BYTES, chunk_leaf, pieces
from game.merkle import MerkleTree
from game.protocol.solver import decide_reveal
from tests.game.conftest import (
    AUDITOR_BOND,
    CLOCK,
    COMMIT_WINDOW,
    JUDGE_WINDOW,
    KEY_HASH,
    PAYMENT,
    TRAINER_BOND,
    WINDOW,
    Setup,
    chain_leaves,
    log_chunks,
)

ARTIFACT = load_artifact()


# ------------------------------------------------------------------ mirrors of the ABI
def _components(fn: str) -> list[str]:
    return [snake(c["name"]) for c in ARTIFACT.entry("function", fn)["outputs"][0]["components"]]


def test_structMirrors_matchAbiFieldForField() -> None:
    assert [f.name for f in fields(Task)] == _components("task")
    assert [f.name for f in fields(Game)] == _components("game")


def test_eventMirrors_matchAbiNamesOrderAndIndexing() -> None:
    abi_events = ARTIFACT.items("event")
    assert {e["name"] for e in abi_events} == set(EVENT_CLASSES)
    base = {f.name for f in fields(ContractEvent)}
    for entry in abi_events:
        cls = EVENT_CLASSES[entry["name"]]
        assert [f.name for f in fields(cls) if f.name not in base] == [
            snake(i["name"]) for i in entry["inputs"]
        ]
        assert cls.indexed == tuple(snake(i["name"]) for i in entry["inputs"] if i["indexed"])


def test_deploy_holdsArtifactRuntimeCode_withItsDeploymentBlockAsTheImmutable(
    chain: Any, game_address: str
) -> None:
    """The runtime code is the artifact's but for the one immutable, which holds the deployment's
    block: the block nodes start their event scans at when not told one."""
    from game.chain.client import VerificationGameClient

    chain.mine(3)  # the deployment's block is then not one an older deployment could share
    dep = deploy_contract(chain, chain.account(9))
    assert dep.address != game_address
    code = bytes(chain.w3.eth.get_code(dep.address))
    assert ARTIFACT.is_runtime_code(code) and code != ARTIFACT.deployed_bytecode
    [(start, length)] = ARTIFACT.immutable_ranges
    assert int.from_bytes(code[start : start + length]) == dep.block_number
    assert code[:start] + code[start + length :] == (
        ARTIFACT.deployed_bytecode[:start] + ARTIFACT.deployed_bytecode[start + length :]
    )
    client = VerificationGameClient(chain, dep.address, chain.account(9))
    assert client.deployed_in_block() == client.first_block() == dep.block_number
    changed = bytearray(code)
    changed[start - 1] ^= 1  # one byte outside the immutable: another contract
    assert not ARTIFACT.is_runtime_code(bytes(changed)) and not ARTIFACT.is_runtime_code(code[:-1])


# ------------------------------------------------------------------ happy path
def test_happyPath_noChallenge_trainerPaidAndWithdraws(
    committed_task: Callable[[int], Setup], chain: Any
) -> None:
    s = committed_task(33)
    task = s.client.task(s.task_id)
    assert task.status is TaskStatus.COMMITTED and task.num_leaves == 33
    assert task.state_root == s.tree.root and task.last_leaf == s.tree.leaf(32)  # type: ignore[union-attr]
    with pytest.raises(FrozenInstanceError):
        task.payment = 0  # type: ignore[misc]
    with pytest.raises(E.WindowOpen):
        s.client.finalize(s.task_id)
    chain.time_travel(WINDOW + 1)
    rec = s.client.finalize(s.task_id)
    assert rec.event("TaskFinalized").trainer_paid is True  # type: ignore[attr-defined]
    assert s.trainer.credit() == PAYMENT + TRAINER_BOND
    before = chain.balance(s.trainer.me)
    w = s.trainer.withdraw()
    assert w.event("Withdrawn").amount == PAYMENT + TRAINER_BOND  # type: ignore[attr-defined]
    fee = w.gas_used * chain.w3.eth.get_transaction_receipt(w.tx_hash)["effectiveGasPrice"]
    assert chain.balance(s.trainer.me) == before + PAYMENT + TRAINER_BOND - fee
    assert s.trainer.credit() == 0
    assert chain.balance(s.client.address) == 0  # the contract paid out everything it held


def test_cancel_creditsPaymentBack(open_task: Setup) -> None:
    rec = open_task.client.cancel(open_task.task_id)
    assert [e.name for e in rec.events] == ["TaskCancelled", "Credited"]
    assert open_task.client.credit() == PAYMENT
    assert open_task.client.task(open_task.task_id).status is TaskStatus.CANCELLED


# ------------------------------------------------------------------ disputes
def play(s: Setup, trainer_tree: MerkleTree, honest: list[bytes]) -> tuple[int, list[int]]:
    """Bisect with an auditor who agrees exactly where the trainer's leaf matches ``honest``."""
    gid = s.auditor.challenge(s.task_id).result
    assert gid is not None
    handle = s.auditor.handle(gid)
    gas = []
    while handle.phase is not Phase.PINNED:
        rev = decide_reveal(handle.state, trainer_tree)
        gas.append(s.trainer.reveal(gid, rev.leaf, rev.proof).gas_used)
        g = handle.state
        gas.append(s.auditor.respond(gid, g.mid_leaf == honest[g.mid]).gas_used)
    return gid, gas


def test_dispute_honestTrainer_lyingAuditor_trainerWins(open_task: Setup, chain: Any) -> None:
    n, lie_at = 65, 23
    honest = chain_leaves(n)
    tree = MerkleTree(honest)
    open_task.accepted(n).trainer.commit_tree(open_task.task_id, tree, b"\x01" * 32, b"\x02" * 32)
    liar = chain_leaves(n, deviate_at=lie_at)  # the auditor claims the run diverged at lie_at
    gid, gas = play(open_task, tree, liar)
    g = open_task.judge.game(gid)
    assert (g.lo, g.hi) == (lie_at - 1, lie_at) and len(gas) == 2 * 6  # ceil(log2(64)) rounds
    rec = open_task.judge.rule(gid, honest[lie_at])  # the judge re-ran the step honestly
    ended = rec.event("GameEnded")
    assert isinstance(ended, GameEnded)
    assert (ended.outcome, ended.reason, ended.winner) == (
        Outcome.TRAINER_WON,
        EndReason.RULING,
        open_task.trainer.me,
    )
    assert open_task.trainer.credit() == AUDITOR_BOND


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 40), data=st.data())
def test_dispute_dishonestTrainer_pinsFirstDeviation_auditorWins(
    n: int, data: st.DataObject, game_client: Callable[..., Any], chain: Any
) -> None:
    snap = chain.snapshot()
    try:
        deviate = data.draw(st.integers(1, n - 1))
        client, trainer, judge, auditor = (game_client(r) for r in ("client", "trainer", "judge", "auditor"))
        tid = client.create_task(
            b"\x07" * 32,
            trainer.me,
            judge.me,
            key_hash=KEY_HASH,
            num_leaves=n,
            payment=PAYMENT,
            trainer_bond=TRAINER_BOND,
            auditor_bond=AUDITOR_BOND,
            clock_allowance=CLOCK,
            challenge_window=WINDOW,
            judge_window=JUDGE_WINDOW,
            commit_window=COMMIT_WINDOW,
        ).result
        trainer.accept(tid)
        honest = chain_leaves(n)
        bad = MerkleTree(chain_leaves(n, deviate_at=deviate))
        trainer.commit_tree(tid, bad, b"\x01" * 32, b"\x02" * 32)
        s = Setup(tid, client, trainer, judge, auditor)
        gid, _ = play(s, bad, honest)
        g = judge.game(gid)
        assert g.hi == deviate and g.lo == deviate - 1 and g.lo_leaf == honest[deviate - 1]
        pinned = judge.get_events("StepPinned", game_id=gid)
        assert len(pinned) == 1 and isinstance(pinned[0], StepPinned) and pinned[0].step == deviate
        judge.rule(gid, honest[deviate])
        assert judge.game(gid).outcome is Outcome.AUDITOR_WON
        assert auditor.credit() == AUDITOR_BOND  # its share of the trainer's bond comes at finalize
    finally:
        chain.revert(snap)


def test_timeout_trainerSilent_auditorWinsAndWaitingCostsNothing(
    committed_task: Callable[[int], Setup], chain: Any
) -> None:
    s = committed_task(9)
    gid = s.auditor.challenge(s.task_id).result
    handle = s.auditor.handle(gid)
    assert isinstance(handle, GameHandle)
    with pytest.raises(E.ClockRunning):
        s.auditor.timeout(gid)
    chain.time_travel(CLOCK + 1000)  # long after the trainer's clock ran out
    assert handle.clock_left()[0] == 0 and handle.clock_left()[1] == CLOCK
    rec = s.client.timeout(gid)  # anyone may call it
    ended = rec.event("GameEnded")
    assert ended.outcome is Outcome.AUDITOR_WON and ended.reason is EndReason.TIMEOUT  # type: ignore[attr-defined]
    assert handle.phase is Phase.ENDED and handle.deadline() == 0  # the handle reads through
    with pytest.raises(E.GameOver):
        s.auditor.timeout(gid)


# ------------------------------------------------------------------ events
def test_events_queryAndPoll(committed_task: Callable[[int], Setup], chain: Any) -> None:
    s = committed_task(33)  # the open task's own size: one TaskCreated
    poller = s.auditor.poller()
    assert poller.poll() == []
    gid = s.auditor.challenge(s.task_id).result
    rev = decide_reveal(s.trainer.game(gid), s.tree)  # type: ignore[arg-type]
    s.trainer.reveal(gid, rev.leaf, rev.proof)
    got = poller.poll()
    assert [e.name for e in got] == ["Challenged", "LeafRevealed"]
    assert got[0].game_id == gid and got[1].index == 16  # type: ignore[attr-defined]
    assert poller.poll() == []  # nothing new
    only = s.auditor.poller(names=["LeafRevealed"], from_block=0)
    assert [e.name for e in only.poll()] == ["LeafRevealed"]
    created = s.client.get_events("TaskCreated", trainer=s.trainer.me)
    assert [(e.task_id, e.num_leaves) for e in created] == [(s.task_id, 33)]  # type: ignore[attr-defined]
    assert s.client.get_events("TaskCreated", trainer=s.judge.me) == []
    everything = s.client.get_events()
    assert [e.name for e in everything][:3] == ["TaskCreated", "TaskAccepted", "Committed"]
    assert all(a.block_number <= b.block_number for a, b in itertools.pairwise(everything))


def test_views_countsClocksAndVerifyLeaf(committed_task: Callable[[int], Setup]) -> None:
    s = committed_task(12)
    tree = s.tree
    assert tree is not None
    assert s.client.task_count() == s.task_id == 2 and s.client.game_count() == 0  # the open task, then this
    assert s.client.verify_leaf(tree.root, 5, 12, tree.leaf(5), list(tree.proof(5).siblings))
    assert not s.client.verify_leaf(tree.root, 5, 12, tree.leaf(4), list(tree.proof(5).siblings))
    gid = s.auditor.challenge(s.task_id).result
    assert s.client.game_count() == 1
    trainer_left, auditor_left = s.client.clock_left(gid)
    assert 0 < trainer_left <= CLOCK and auditor_left == CLOCK
    with pytest.raises(E.TaskNotFound):
        s.client.task(42)
    with pytest.raises(E.GameNotFound):
        s.client.game(42)


def test_poller_follow_yieldsNewEventsThenStops(committed_task: Callable[[int], Setup]) -> None:
    s = committed_task(5)
    poller = s.auditor.poller(names=["Challenged", "GameEnded"], from_block=0)
    gid = s.auditor.challenge(s.task_id).result
    polls = {"n": 0}

    def stop() -> bool:
        polls["n"] += 1
        return polls["n"] > 3

    seen = list(poller.follow(interval=0.0, stop=stop))
    assert [e.name for e in seen] == ["Challenged"] and seen[0].game_id == gid  # type: ignore[attr-defined]


# ------------------------------------------------------------------ a contract gone from its address
def test_aChainResetToBeforeTheDeployment_isOneClearError_notADecodingTraceback() -> None:
    """anvil started afresh leaves no code at the game's address; the empty reply of every view
    was an ``eth_abi`` InsufficientDataBytes that killed each running node with a traceback."""
    from game.chain.backends import connect
    from game.chain.client import VerificationGameClient
    from game.chain.deploy import deploy
    from game.errors import ChainError, ContractGone

    with connect("embedded") as chain:
        before = chain.snapshot()
        client = VerificationGameClient(chain, deploy(chain, chain.account(0)), chain.account(0))
        assert client.task_count() == 0
        chain.revert(before)  # the chain as it was before the deployment
        for view in (client.task_count, lambda: client.task(1), client.deployed_in_block):
            with pytest.raises(ContractGone) as caught:
                view()
            said = str(caught.value)
            assert said.startswith(f"the game contract is gone from {client.address} on embedded")
            assert "no code at that address (the chain was reset" in said and "address is wrong" in said
            assert isinstance(caught.value, ChainError) and caught.value.no_code


def test_aReplyThatDoesNotDecode_isTheSameError_sayingSomethingElseIsThere(
    game_client: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from game.errors import ContractGone

    client = game_client("client")
    nobody = client.__class__(client.chain, "0x" + "11" * 20, client.account)
    with pytest.raises(ContractGone, match="no code at that address"):
        nobody.task(1)
    monkeypatch.setattr(client.chain, "call", lambda tx, *a, **k: b"\x00" * 5)  # code there, reply cut short
    with pytest.raises(ContractGone, match=r"does not answer task\(\) as the game does") as caught:
        client.task(1)
    assert not caught.value.no_code and "the game contract is gone from" in str(caught.value)


def test_bigChunk_answeredOnePieceAtATime_throughTheClient(
    open_task: Setup, game_client: Callable[..., Any]
) -> None:
    """A chunk of 2.5 pieces: the trainer's client takes the whole chunk and its proof in the log
    tree and posts only the demanded piece (7, reduced modulo the 3 pieces: 1) with its proof in the
    chunk's piece tree; that piece cannot be demanded again; another chunk's bytes are refused
    before anything is sent."""
    n = 9
    chunks = log_chunks(n)
    chunks[4] = random.Random(4).randbytes(PIECE_BYTES * 5 // 2)
    log_tree = MerkleTree([chunk_leaf(c) for c in chunks])
    s = open_task.accepted(n)
    s.trainer.commit_tree(s.task_id, MerkleTree(chain_leaves(n)), log_tree.root, b"\x02" * 32)
    gid = s.auditor.challenge_data(s.task_id, 4, 7).result
    assert s.auditor.game(gid).piece == 7
    provided = s.trainer.provide_data(gid, chunks[4], log_tree.proof(4)).event("DataProvided")
    assert (provided.piece, provided.chunk_length, provided.data) == (  # type: ignore[attr-defined]
        1,
        len(chunks[4]),
        pieces(chunks[4])[1],
    )
    assert s.auditor.game(gid).piece == 1
    with pytest.raises(E.DataAlreadyProvided) as info:
        game_client("auditor2").challenge_data(s.task_id, 4, 4)
    assert info.value == E.DataAlreadyProvided(s.task_id, 4, 1)
    other = s.auditor.challenge_data(s.task_id, 4, 2).result
    with pytest.raises(E.InvalidProof) as refused:
        s.trainer.provide_data(other, chunks[3], log_tree.proof(4))
    assert refused.value == E.InvalidProof(4, chunk_leaf(chunks[3]))
    last = s.trainer.provide_data(other, chunks[4], log_tree.proof(4)).event("DataProvided")
    assert last.data == pieces(chunks[4])[2]  # type: ignore[attr-defined]


def test_availabilityAndReward_throughTheClient_eventsDecoded(
    committed_task: Callable[[int], Setup], game_client: Callable[..., Any], chain: Any
) -> None:
    """A demanded chunk posted (its bytes decoded from ``DataProvided``), a demand left unanswered
    (the trainer loses), the task settled and the winner's share claimed: each through the typed
    client, each event a dataclass with typed fields."""
    s = committed_task(9)
    chunks = log_chunks(9)
    log_tree = MerkleTree([chunk_leaf(c) for c in chunks])
    asked = s.auditor.challenge_data(s.task_id, 4)
    (req,) = asked.events_named("DataRequested")
    assert (req.index, req.piece, req.task_id, req.game_id) == (4, 0, s.task_id, asked.result)  # type: ignore[attr-defined]
    answer = s.trainer.provide_data(asked.result, chunks[4], log_tree.proof(4))  # type: ignore[arg-type]
    provided = answer.event("DataProvided")
    assert (provided.index, provided.piece, provided.chunk_length, provided.data) == (  # type: ignore[attr-defined]
        4,
        0,
        len(chunks[4]),
        chunks[4],
    )
    g = s.auditor.game(asked.result)  # type: ignore[arg-type]
    assert (g.availability, g.data_index, g.piece, g.outcome, g.reason) == (
        True,
        4,
        0,
        Outcome.ANSWERED,
        EndReason.DATA_PROVIDED,
    )
    other = game_client("auditor2")
    unanswered = other.challenge_data(s.task_id, 6).result
    chain.time_travel(CLOCK + 5)
    s.client.timeout(unanswered)
    assert s.client.game(unanswered).outcome is Outcome.AUDITOR_WON  # type: ignore[arg-type]
    chain.time_travel(WINDOW + 5)
    fin = s.client.finalize(s.task_id).event("TaskFinalized")
    task = s.client.task(s.task_id)
    share = min(AUDITOR_BOND, TRAINER_BOND - TRAINER_BOND // 2)  # one winning game
    assert (fin.trainer_paid, fin.auditor_wins, fin.reward_share, fin.burnt) == (  # type: ignore[attr-defined]
        False,
        1,
        share,
        TRAINER_BOND // 2,
    )
    assert (task.auditor_wins, task.trainer_lost, s.client.burnt()) == (1, True, TRAINER_BOND // 2)
    paid = s.client.claim_reward(unanswered).event("RewardPaid")  # type: ignore[arg-type]
    assert (paid.auditor, paid.amount) == (other.me, share)  # type: ignore[attr-defined]
    assert other.credit() == AUDITOR_BOND + share and s.auditor.credit() == AUDITOR_BOND
