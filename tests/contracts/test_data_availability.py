"""Issue 44, exploit 4 (a transcript nobody can open is still paid): the task commits to the data
key, and an auditor that cannot get or open the transcript demands a log chunk on-chain, which the
trainer must post within its clock or lose the task.

Before the fix nothing on-chain committed to the key and nothing let anyone demand the data: a
trainer that sealed its transcript under another key, withheld it or garbled it was paid once the
window closed, while the auditor, unable to replay, could only stay silent.

Now (docs/contract.md "Availability"): ``createTask`` takes ``keyHash`` (sha256 of the data key);
``challengeData(task, s)`` opens a game in which the trainer must ``provideData`` chunk ``s``, whose
sha256 must be leaf ``s`` of the committed log tree. Answered: the chunk is public in
``DataProvided``, nobody was shown wrong, the auditor's bond goes back. Not answered in time: the
auditor wins, as against a trainer that stops revealing.
"""

from __future__ import annotations

import hashlib

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    ANSWERED,
    AUDITOR_BOND,
    AUDITOR_WON,
    AWAITING_DATA,
    CLOCK,
    DATA_PROVIDED,
    KEY_HASH,
    PAYMENT,
    TIMEOUT,
    TRAINER_BOND,
    Env,
    chunks,
    leaves,
    log_tree,
)

N = 9
ZERO = "0x0000000000000000000000000000000000000000"


def _committed(env: Env) -> tuple[int, list[bytes]]:
    """A committed task whose log tree is over :func:`chunks` (what the trainer holds)."""
    task = env.create_task(N)
    env.commit(task, MerkleTree(leaves(N)))
    return task, chunks(N)


@pytest.mark.parametrize("how", ["withheld", "garbled"])
def test_unavailableTranscript_demandUnanswered_trainerLosesTheTask(env: Env, how: str) -> None:
    """The exploit: the trainer commits and its transcript cannot be had (withheld, or sealed so that
    it does not open: a garbled chunk is what it could post then). The auditor demands chunk 5; the
    trainer cannot post the committed chunk, so its clock runs out; the client gets its payment
    back, the auditor its bond and a reward, and the trainer is not paid."""
    task, held = _committed(env)
    assert env.task(task).keyHash == KEY_HASH  # the task says which key its transcript opens under
    game_id = env.challenge_data(task, env.auditors[0], 5)
    if how == "garbled":
        garbled = env.provide_data_fn(game_id, held, data=held[5] + b"\x00")
        assert env.reverts(garbled, env.trainer) == (
            "InvalidProof",
            (5, hashlib.sha256(held[5] + b"\x00").digest()),
        )
    env.at(env.deadline(game_id) + 1)
    ev = env.event(env.timeout(game_id), "GameEnded")
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    paid = env.event(env.finalize(task), "TaskFinalized")["trainerPaid"]
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (
        AUDITOR_WON,
        TIMEOUT,
        env.auditors[0],
    ) and not paid, (
        f"a trainer whose transcript was {how} was paid: game {ev['outcome']}, trainer credit {env.credit(env.trainer)}"
    )
    env.claim_reward(game_id)
    assert env.credit(env.trainer) == 0 and env.credit(env.client) == PAYMENT
    assert env.credit(env.auditors[0]) == 2 * AUDITOR_BOND and env.solvent()


def test_demandAnswered_chunkPublic_nobodyShownWrong_trainerPaid(env: Env) -> None:
    task, held = _committed(env)
    start = env.now() + 1
    receipt = env.send(env.game.functions.challengeData(task, 3), env.auditors[0], AUDITOR_BOND)
    assert env.event_names(receipt) == ["Challenged", "DataRequested"]
    ch, req = env.event(receipt, "Challenged"), env.event(receipt, "DataRequested")
    game_id = ch["gameId"]
    assert (ch["disputeInit"], ch["lo"], ch["hi"]) == (False, 3, 3)
    assert (req["gameId"], req["taskId"], req["index"], req["deadline"]) == (game_id, task, 3, start + CLOCK)
    g = env.game_state(game_id)
    assert (g.phase, g.availability, g.lo, g.hi, g.auditor) == (AWAITING_DATA, True, 3, 3, env.auditors[0])
    assert env.deadline(game_id) == start + CLOCK and env.task(task).liveGames == 1
    env.at(start + 40)
    assert env.clock_left(game_id) == (CLOCK - 39, CLOCK)
    receipt = env.provide_data(game_id, held)
    assert env.event_names(receipt) == ["DataProvided", "GameEnded", "Credited"]
    ev = env.event(receipt, "DataProvided")
    assert (ev["gameId"], ev["taskId"], ev["index"], ev["data"]) == (game_id, task, 3, held[3])
    ended = env.event(receipt, "GameEnded")
    assert (ended["outcome"], ended["reason"], ended["winner"]) == (ANSWERED, DATA_PROVIDED, ZERO)
    assert env.credit(env.auditors[0]) == AUDITOR_BOND and env.credit(env.trainer) == 0
    assert env.reverts(env.game.functions.challengeData(task, 3), env.auditors[1], AUDITOR_BOND) == (
        "DataAlreadyProvided",
        (task, 3),
    )
    env.at(env.task(task).windowEnds)
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is True
    assert env.credit(env.trainer) == PAYMENT + TRAINER_BOND and env.solvent()


def test_sameChunkDemandedTwice_answeredOnce_bothDemandsMet(env: Env) -> None:
    """Two auditors demand chunk 2 before the trainer answers: it posts it once; the other demand is
    met too (its timeout ends it Answered, not against the trainer)."""
    task, held = _committed(env)
    g1 = env.challenge_data(task, env.auditors[0], 2)
    g2 = env.challenge_data(task, env.auditors[1], 2)
    env.provide_data(g1, held)
    env.at(env.deadline(g2) + 1)
    ev = env.event(env.timeout(g2), "GameEnded")
    assert (ev["outcome"], ev["reason"]) == (ANSWERED, DATA_PROVIDED)
    assert env.credit(env.auditors[1]) == AUDITOR_BOND and not env.task(task).trainerLost


def test_challengeData_reverts(env: Env) -> None:
    fn = env.game.functions.challengeData
    assert env.reverts(fn(4, 0), env.auditors[0], AUDITOR_BOND) == ("TaskNotFound", (4,))
    task, _ = _committed(env)
    assert env.reverts(fn(task, N), env.auditors[0], AUDITOR_BOND) == ("DataIndexOutOfRange", (N, N))
    assert env.reverts(fn(task, 1), env.trainer, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.trainer,))
    assert env.reverts(fn(task, 1), env.judge, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.judge,))
    assert env.reverts(fn(task, 1), env.auditors[0], 1) == ("WrongBond", (1, AUDITOR_BOND))
    ends = env.task(task).windowEnds
    env.at(ends)
    assert env.reverts(fn(task, 1), env.auditors[0], AUDITOR_BOND) == ("WindowClosed", (task, ends))


def test_provideData_reverts(env: Env) -> None:
    task, held = _committed(env)
    fn = env.game.functions.provideData
    assert env.reverts(fn(5, held[0], []), env.trainer) == ("GameNotFound", (5,))
    game_id = env.challenge_data(task, env.auditors[0], 4)
    good = env.provide_data_fn(game_id, held)
    assert env.reverts(good, env.auditors[0]) == ("Unauthorized", (env.auditors[0], env.trainer))
    # another step's chunk, with its own valid proof: not the chunk demanded
    other = fn(game_id, held[3], list(log_tree(held).proof(3).siblings))
    assert env.reverts(other, env.trainer) == ("InvalidProof", (4, hashlib.sha256(held[3]).digest()))
    due = env.deadline(game_id)
    env.at(due + 1)
    assert env.reverts(good, env.trainer) == ("ClockExpired", (game_id, due))
    env.timeout(game_id)
    assert env.reverts(good, env.trainer) == ("GameOver", (game_id, AUDITOR_WON))
    # a bisection game takes no data, and an availability game no leaf
    bisection = env.challenge(task, env.auditors[1])
    assert env.reverts(fn(bisection, held[0], []), env.trainer) == ("NotYourTurn", (bisection, 1))
    data_game = env.challenge_data(task, env.auditors[2], 1)
    reveal = env.game.functions.reveal(data_game, leaves(N)[1], [])
    assert env.reverts(reveal, env.trainer) == ("NotYourTurn", (data_game, AWAITING_DATA))
    assert env.reverts(env.game.functions.respond(data_game, True), env.auditors[2]) == (
        "NotYourTurn",
        (data_game, AWAITING_DATA),
    )


def test_theLargestChunkATrainerNodeTakesATaskFor_isPostedInOneTransactionThatAPoolAccepts(env: Env) -> None:
    """A trainer node refuses a task whose chunks exceed ``TermsPolicy.max_chunk_bytes``: a chunk that
    large (incompressible bytes, the worst case for gas) is one ``provideData`` whose signed
    transaction stays under geth's 128 KiB pool limit and well inside a block."""
    import os

    from game.protocol.terms import TermsPolicy

    size = TermsPolicy.max_chunk_bytes
    assert size is not None
    held = chunks(N)
    held[4] = os.urandom(size)
    task = env.create_task(N)
    env.commit(task, MerkleTree(leaves(N)), log_root=log_tree(held).root)
    game_id = env.challenge_data(task, env.auditors[0], 4)
    fn = env.provide_data_fn(game_id, held)
    calldata = bytes.fromhex(fn._encode_transaction_data()[2:])
    assert (
        len(calldata) + 256 <= 128 * 1024
    )  # 256: nonce, fees, gas, address, value and signature, generously
    receipt = env.provide_data(game_id, held)
    assert env.event(receipt, "DataProvided")["data"] == held[4]
    assert int(receipt["gasUsed"]) < 6_000_000, receipt["gasUsed"]
