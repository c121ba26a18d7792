"""Issue 44, exploit 4 (a transcript nobody can open is still paid): the task commits to the data
key, and an auditor that cannot get or open the transcript demands a log chunk on-chain, which the
trainer must post within its clock or lose the task.

Before the fix nothing on-chain committed to the key and nothing let anyone demand the data: a
trainer that sealed its transcript under another key, withheld it or garbled it was paid once the
window closed, while the auditor, unable to replay, could only stay silent.

Now (docs/contract.md "Availability"): ``createTask`` takes ``keyHash`` (sha256 of the data key);
``challengeData(task, s, k)`` opens a game in which the trainer must ``provideData`` piece ``k`` of
chunk ``s``: leaf ``s`` of the committed log tree is ``sha256(uint64 length || piece root)``
(game/chunkleaf.py), and the trainer posts the piece with its proof in the chunk's piece tree and the
chunk's leaf with its proof in the log tree. Answered: the piece is public in ``DataProvided``,
nobody was shown wrong, the auditor's bond goes back. Not answered in time: the auditor wins, as
against a trainer that stops revealing.

Pieces (the second half of this file): one transaction carries at most 128 KiB, so a chunk is
answered one piece of ``PIECE_BYTES`` at a time, whatever its size. A demand's piece number is
reduced modulo the chunk's piece count once an answer has shown the chunk's length.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from game import chunkleaf
from game.chunkleaf import PIECE_BYTES, chunk_leaf
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
            "InvalidPieceProof",
            (5, 0, hashlib.sha256(held[5] + b"\x00").digest()),
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
    receipt = env.send(env.game.functions.challengeData(task, 3, 0), env.auditors[0], AUDITOR_BOND)
    assert env.event_names(receipt) == ["Challenged", "DataRequested"]
    ch, req = env.event(receipt, "Challenged"), env.event(receipt, "DataRequested")
    game_id = ch["gameId"]
    assert (ch["disputeInit"], ch["lo"], ch["hi"]) == (False, 3, 3)
    assert (req["gameId"], req["taskId"], req["index"], req["piece"], req["deadline"]) == (
        game_id,
        task,
        3,
        0,
        start + CLOCK,
    )
    g = env.game_state(game_id)
    assert (g.phase, g.availability, g.piece, g.lo, g.hi, g.auditor) == (
        AWAITING_DATA,
        True,
        0,
        3,
        3,
        env.auditors[0],
    )
    assert env.deadline(game_id) == start + CLOCK and env.task(task).liveGames == 1
    env.at(start + 40)
    assert env.clock_left(game_id) == (CLOCK - 39, CLOCK)
    ends = env.task(task).windowEnds
    receipt = env.provide_data(game_id, held)
    assert env.event_names(receipt) == ["DataProvided", "WindowExtended", "GameEnded", "Credited"]
    # the 40 s the trainer took are given back to the window (tests/contracts/test_demand_window.py)
    assert env.event(receipt, "WindowExtended")["windowEnds"] == ends + 40 == env.task(task).windowEnds
    ev = env.event(receipt, "DataProvided")
    assert (ev["gameId"], ev["taskId"], ev["index"], ev["piece"], ev["chunkLength"], ev["data"]) == (
        game_id,
        task,
        3,
        0,
        len(held[3]),
        held[3],
    )
    ended = env.event(receipt, "GameEnded")
    assert (ended["outcome"], ended["reason"], ended["winner"]) == (ANSWERED, DATA_PROVIDED, ZERO)
    assert env.credit(env.auditors[0]) == AUDITOR_BOND and env.credit(env.trainer) == 0
    for piece in (0, 1, 2**32 - 1):  # a one-piece chunk: every piece number names it
        assert env.reverts(
            env.game.functions.challengeData(task, 3, piece), env.auditors[1], AUDITOR_BOND
        ) == (
            "DataAlreadyProvided",
            (task, 3, 0),
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
    assert env.reverts(fn(4, 0, 0), env.auditors[0], AUDITOR_BOND) == ("TaskNotFound", (4,))
    task, _ = _committed(env)
    assert env.reverts(fn(task, N, 0), env.auditors[0], AUDITOR_BOND) == ("DataIndexOutOfRange", (N, N))
    assert env.reverts(fn(task, 1, 0), env.trainer, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.trainer,))
    assert env.reverts(fn(task, 1, 0), env.judge, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.judge,))
    assert env.reverts(fn(task, 1, 0), env.auditors[0], 1) == ("WrongBond", (1, AUDITOR_BOND))
    ends = env.task(task).windowEnds
    env.at(ends)
    assert env.reverts(fn(task, 1, 0), env.auditors[0], AUDITOR_BOND) == ("WindowClosed", (task, ends))


def test_provideData_reverts(env: Env) -> None:
    task, held = _committed(env)
    fn = env.game.functions.provideData
    assert env.reverts(fn(5, 0, bytes(32), held[0], [], []), env.trainer) == ("GameNotFound", (5,))
    game_id = env.challenge_data(task, env.auditors[0], 4)
    good = env.provide_data_fn(game_id, held)
    assert env.reverts(good, env.auditors[0]) == ("Unauthorized", (env.auditors[0], env.trainer))
    # another step's chunk, with its own valid proofs: not the chunk demanded
    three = chunkleaf.answer(held[3], 0)
    other = fn(
        game_id, three.length, three.piece_root, three.data, [], list(log_tree(held).proof(3).siblings)
    )
    assert env.reverts(other, env.trainer) == ("InvalidProof", (4, chunk_leaf(held[3])))
    due = env.deadline(game_id)
    env.at(due + 1)
    assert env.reverts(good, env.trainer) == ("ClockExpired", (game_id, due))
    env.timeout(game_id)
    assert env.reverts(good, env.trainer) == ("GameOver", (game_id, AUDITOR_WON))
    # a bisection game takes no data, and an availability game no leaf
    bisection = env.challenge(task, env.auditors[1])
    assert env.reverts(fn(bisection, 0, bytes(32), held[0], [], []), env.trainer) == (
        "NotYourTurn",
        (bisection, 1),
    )
    data_game = env.challenge_data(task, env.auditors[2], 1)
    reveal = env.game.functions.reveal(data_game, leaves(N)[1], [])
    assert env.reverts(reveal, env.trainer) == ("NotYourTurn", (data_game, AWAITING_DATA))
    assert env.reverts(env.game.functions.respond(data_game, True), env.auditors[2]) == (
        "NotYourTurn",
        (data_game, AWAITING_DATA),
    )


# ---------------------------------------------------------------- pieces

BIG = 4  # the step whose chunk is several pieces long


def _pieces_task(
    env: Env, *, n: int = N, index: int = BIG, size: int = PIECE_BYTES * 5 // 2
) -> tuple[int, list[bytes]]:
    """A committed task whose chunk ``index`` is ``size`` incompressible bytes (the worst case for
    gas; 2.5 pieces by default), the others a few bytes."""
    held = chunks(n)
    held[index] = random.Random(size).randbytes(size)
    task = env.create_task(n)
    env.commit(task, MerkleTree(leaves(n)), log_root=log_tree(held).root)
    return task, held


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def test_chunkOfThreePieces_theDemandedPieceIsPosted_andEachPieceOnce(env: Env) -> None:
    task, held = _pieces_task(env)
    parts = chunkleaf.pieces(held[BIG])
    assert [len(p) for p in parts] == [PIECE_BYTES, PIECE_BYTES, PIECE_BYTES // 2]
    fn = env.game.functions.challengeData
    g1 = env.challenge_data(task, env.auditors[0], BIG, piece=1)
    assert env.game_state(g1).piece == 1
    ev = env.event(env.provide_data(g1, held), "DataProvided")
    assert (ev["index"], ev["piece"], ev["chunkLength"], ev["data"]) == (BIG, 1, len(held[BIG]), parts[1])
    assert (env.game_state(g1).outcome, env.game_state(g1).piece) == (ANSWERED, 1)
    # the piece count is known now: piece 1 + 3 is piece 1, posted already
    assert env.reverts(fn(task, BIG, 1 + 3), env.auditors[1], AUDITOR_BOND) == (
        "DataAlreadyProvided",
        (task, BIG, 1),
    )
    # ... and piece 5 is piece 2, which was not: the demand is reduced when it is made
    receipt = env.send(fn(task, BIG, 5), env.auditors[1], AUDITOR_BOND)
    g2 = env.event(receipt, "Challenged")["gameId"]
    assert env.event(receipt, "DataRequested")["piece"] == 2 and env.game_state(g2).piece == 2
    ev = env.event(env.provide_data(g2, held), "DataProvided")
    assert (ev["piece"], ev["data"]) == (2, parts[2])  # the last piece, the shorter one
    g3 = env.challenge_data(task, env.auditors[2], BIG, piece=0)
    assert env.event(env.provide_data(g3, held), "DataProvided")["data"] == parts[0]
    for piece in (0, 1, 2, 3, 2**32 - 1):
        assert env.reverts(fn(task, BIG, piece), env.auditors[3], AUDITOR_BOND) == (
            "DataAlreadyProvided",
            (task, BIG, piece % 3),
        )
    # the other chunks are still one piece each, and still demandable
    env.provide_data(env.challenge_data(task, env.auditors[3], BIG + 1, piece=2), held)
    assert env.credit(env.trainer) == 0 and not env.task(task).trainerLost


def test_demandBeyondThePieceCount_beforeTheCountIsKnown_isAnsweredWithItsRemainder(env: Env) -> None:
    """An auditor that has never seen the chunk cannot know its piece count: piece 7 of a 3-piece
    chunk is piece 1, and the answer says so."""
    task, held = _pieces_task(env)
    receipt = env.send(env.game.functions.challengeData(task, BIG, 7), env.auditors[0], AUDITOR_BOND)
    game_id = env.event(receipt, "Challenged")["gameId"]
    assert env.event(receipt, "DataRequested")["piece"] == 7 and env.game_state(game_id).piece == 7
    ev = env.event(env.provide_data(game_id, held), "DataProvided")
    assert (ev["piece"], ev["chunkLength"], ev["data"]) == (1, len(held[BIG]), chunkleaf.pieces(held[BIG])[1])
    assert env.game_state(game_id).piece == 1
    assert env.reverts(env.game.functions.challengeData(task, BIG, 1), env.auditors[1], AUDITOR_BOND) == (
        "DataAlreadyProvided",
        (task, BIG, 1),
    )


def test_anotherPieceThanTheDemandedOne_isRefused(env: Env) -> None:
    """The trainer cannot answer with a piece it prefers: not the demanded piece's bytes with the
    proof of another position, nor another piece with its own proof, nor a piece proved in a tree of
    another length (the chunk's leaf binds its length, so that lie fails at the log tree)."""
    task, held = _pieces_task(env)
    game_id = env.challenge_data(task, env.auditors[0], BIG, piece=1)
    tree, parts = chunkleaf.piece_tree(held[BIG]), chunkleaf.pieces(held[BIG])
    length, log_proof = len(held[BIG]), list(log_tree(held).proof(BIG).siblings)

    def post(data: bytes, proof: list[bytes], size: int = length, root: bytes = tree.root) -> object:
        return env.game.functions.provideData(game_id, size, root, data, proof, log_proof)

    def proof_of(k: int, t: MerkleTree = tree) -> list[bytes]:
        return list(t.proof(k).siblings)

    refused = {
        "right bytes, another position's proof": (post(parts[1], proof_of(0)), (BIG, 1, _sha(parts[1]))),
        "piece 0 with its own proof": (post(parts[0], proof_of(0)), (BIG, 1, _sha(parts[0]))),
        "piece 2 with its own proof": (post(parts[2], proof_of(2)), (BIG, 1, _sha(parts[2]))),
        "the whole chunk": (post(held[BIG], []), (BIG, 1, _sha(held[BIG]))),
    }
    for what, (fn, args) in refused.items():
        assert env.reverts(fn, env.trainer) == ("InvalidPieceProof", args), what
    two = MerkleTree([_sha(p) for p in parts[:2]])  # the first two pieces, claimed as the chunk
    for size, root, proof in (
        (2 * PIECE_BYTES, two.root, proof_of(1, two)),
        (4 * PIECE_BYTES, tree.root, proof_of(1)),
    ):
        leaf = chunkleaf.leaf_of_parts(size, root)
        assert env.reverts(post(parts[1], proof, size, root), env.trainer) == ("InvalidProof", (BIG, leaf)), (
            size
        )
    assert env.event(env.send(post(parts[1], proof_of(1)), env.trainer), "DataProvided")["piece"] == 1


def test_demandUnanswered_whosePieceAnotherGamePosted_endsAnswered(env: Env) -> None:
    """Demands for pieces 7 and 4 of a 3-piece chunk both name piece 1: the trainer posts it once, in
    one game; the other's timeout ends it Answered (reduced by the count the answer made known),
    while a demand for piece 2, never posted, is lost by the trainer."""
    task, held = _pieces_task(env)
    g7 = env.challenge_data(task, env.auditors[0], BIG, piece=7)
    g4 = env.challenge_data(task, env.auditors[1], BIG, piece=4)
    g2 = env.challenge_data(task, env.auditors[2], BIG, piece=2)
    assert env.event(env.provide_data(g4, held), "DataProvided")["piece"] == 1
    env.at(max(env.deadline(g7), env.deadline(g2)) + 1)
    ev = env.event(env.timeout(g7), "GameEnded")
    assert (ev["outcome"], ev["reason"]) == (ANSWERED, DATA_PROVIDED)
    ev = env.event(env.timeout(g2), "GameEnded")
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (AUDITOR_WON, TIMEOUT, env.auditors[2])
    assert env.credit(env.auditors[0]) == AUDITOR_BOND and env.credit(env.auditors[1]) == AUDITOR_BOND


def test_theLargestAnswer_aFullPiece_isPostedInOneTransactionThatAPoolAccepts(env: Env) -> None:
    """Whatever a chunk's size, a demand is answered with one piece: a full piece of incompressible
    bytes (the worst case for gas) with its proof in the chunk's piece tree and the chunk leaf's
    proof in a log tree of 1,025 leaves (11 siblings) is one ``provideData`` whose signed transaction
    stays under geth's 128 KiB pool limit and well inside a block."""
    n = 2**10 + 1
    index = n - 2
    task, held = _pieces_task(env, n=n, index=index, size=5 * PIECE_BYTES)
    game_id = env.challenge_data(task, env.auditors[0], index, piece=3)
    fn = env.provide_data_fn(game_id, held)
    calldata = bytes.fromhex(fn._encode_transaction_data()[2:])
    assert len(log_tree(held).proof(index).siblings) == 11
    assert len(calldata) + 256 <= 128 * 1024, len(
        calldata
    )  # 256: nonce, fees, gas, address, value, signature
    receipt = env.provide_data(game_id, held)
    ev = env.event(receipt, "DataProvided")
    assert (ev["piece"], ev["data"]) == (3, chunkleaf.pieces(held[index])[3]) and len(
        ev["data"]
    ) == PIECE_BYTES
    assert int(receipt["gasUsed"]) < 6_000_000, receipt["gasUsed"]
    print(f"provideData of a full piece: {len(calldata)} bytes of calldata, {receipt['gasUsed']} gas")


def test_theLongestProofs_leaveTheAnswerUnder128KiB(env: Env) -> None:
    """The calldata of a full piece with two proofs of the most siblings the contract accepts (64
    each): the bound no answer can pass, whatever the chunk's length and the log's."""
    limit = int(env.game.functions.MAX_PROOF_LENGTH().call())
    assert int(env.game.functions.PIECE_BYTES().call()) == PIECE_BYTES
    sib = [bytes(32)] * limit
    fn = env.game.functions.provideData(1, 2**64 - 1, bytes(32), bytes([1]) * PIECE_BYTES, sib, sib)
    calldata = bytes.fromhex(fn._encode_transaction_data()[2:])
    assert len(calldata) == 4 + 6 * 32 + 3 * 32 + PIECE_BYTES + 2 * limit * 32 == 127_268
    assert len(calldata) + 256 <= 128 * 1024
