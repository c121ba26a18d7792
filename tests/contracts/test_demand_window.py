"""The time a trainer takes to answer an availability demand is given back to the challenge window
(docs/contract.md "Availability").

The hole: an auditor that cannot have the transcript reads the log off the chain piece by piece,
and each demand waits on the trainer. A trainer that answered each one at the last second of its
clock spent the auditors' window: with a window of two clocks, one demand answered late and the next
round of demands came after the window's end, so the auditor could neither read the log nor
challenge, and the trainer that withheld its transcript was paid.

The rule: a demand records what was left of the window when it was made (``windowLeft``); once it
is met (its piece posted, in its game or another), the window ends no sooner than then plus that.
Only the trainer's own delay moves the window: an answer in the next block moves it by a second. An
unanswered demand extends nothing: the trainer has lost the task.
"""

from __future__ import annotations

from game.merkle import MerkleTree
from tests.contracts.driver import (
    ANSWERED,
    AUDITOR_WON,
    CLOCK,
    Env,
    chunks,
    leaves,
)

N = 9


def _committed(env: Env) -> tuple[int, list[bytes], int]:
    """A committed task, the chunks its trainer holds, and its window's end at the commit."""
    task = env.create_task(N)
    env.commit(task, MerkleTree(leaves(N)))
    return task, chunks(N), env.task(task).windowEnds


def _extended(env: Env, receipt: object) -> list[int]:
    return [e["windowEnds"] for e in env.events(receipt, "WindowExtended")]


def test_aDemandAnsweredAtTheLastSecond_leavesTheAuditorsTheWindowTheyHadAtTheDemand(env: Env) -> None:
    """A demand made 100 s before the window's end is answered at the last second of the trainer's
    clock, an hour later: the window ends 100 s after the answer, and a challenge sent then lands
    (before, the window had closed while the trainer took its time, and the challenge reverted)."""
    task, held, ends = _committed(env)
    env.at(ends - 100)
    gid = env.challenge_data(task, env.auditors[0], 5)
    assert env.game_state(gid).windowLeft == 100
    env.at(env.deadline(gid))
    receipt = env.provide_data(gid, held)
    answered = env.now()
    assert answered == ends - 100 + CLOCK
    assert _extended(env, receipt) == [answered + 100]
    assert env.task(task).windowEnds == answered + 100
    env.at(answered + 99)
    game_id = env.challenge(task, env.auditors[1])
    assert env.game_state(game_id).hi == N - 1


def test_aDemandAnsweredInTheNextBlock_movesTheWindowBySecondsOnly(env: Env) -> None:
    """An auditor cannot stretch the window beyond the trainer's own delay: ten demands one after
    the other, each answered a second after it was made, move its end by ten seconds."""
    task, held, ends = _committed(env)
    for index in range(N - 1):
        gid = env.challenge_data(task, env.auditors[index % 2], index)
        env.provide_data(gid, held)
    assert env.task(task).windowEnds == ends + N - 1


def test_whileADemandIsOpenPastTheWindowsEnd_theWindowWaits_thenOpensAgain(env: Env) -> None:
    """Past the window's end with a demand open, a challenge is refused and the task cannot be
    settled; the answer opens the window again for what was left at the demand."""
    task, held, ends = _committed(env)
    env.at(ends - 10)
    gid = env.challenge_data(task, env.auditors[0], 3)
    env.at(ends + 5)
    fn = env.game.functions.challenge(task, False)
    assert env.reverts(fn, env.auditors[1], env.task(task).auditorBond) == ("WindowClosed", (task, ends))
    assert env.reverts(env.game.functions.finalize(task), env.outsider)[0] == "GamesLive"
    env.at(ends + 20)
    env.provide_data(gid, held)
    assert env.task(task).windowEnds == ends + 30
    env.challenge(task, env.auditors[1])


def test_aSecondDemandForAPostedPiece_timedOutLate_extendsOnlyToWhenThePieceWasPosted(env: Env) -> None:
    """Two demands for the same piece: the trainer answers one at once; the other's timeout, an hour
    on, counts from when the piece was posted, so a duplicate demand buys no time."""
    task, held, _ends = _committed(env)
    g1 = env.challenge_data(task, env.auditors[0], 2)
    g2 = env.challenge_data(task, env.auditors[1], 2)
    left = env.game_state(g2).windowLeft
    env.provide_data(g1, held)
    posted = env.now()
    after_answer = env.task(task).windowEnds
    env.at(env.deadline(g2) + 1)
    receipt = env.timeout(g2)
    assert env.event(receipt, "GameEnded")["outcome"] == ANSWERED
    assert env.task(task).windowEnds == max(after_answer, posted + left) == after_answer
    assert _extended(env, receipt) == []


def test_anUnansweredDemand_doesNotExtendTheWindow(env: Env) -> None:
    """A trainer that cannot post a demanded piece loses the task at its deadline; the window is not
    extended then (nobody needs more time, and a piece never posted could be demanded again and
    again to hold everyone's money back): past its end, a late timeout leaves it closed."""
    task, _held, ends = _committed(env)
    env.at(ends - 10)
    gid = env.challenge_data(task, env.auditors[0], 7)
    env.at(env.deadline(gid) + 5_000)
    receipt = env.timeout(gid)
    assert env.event(receipt, "GameEnded")["outcome"] == AUDITOR_WON
    assert env.task(task).windowEnds == ends and _extended(env, receipt) == []
    fn = env.game.functions.challengeData(task, 7, 0)
    assert env.reverts(fn, env.auditors[1], env.task(task).auditorBond) == ("WindowClosed", (task, ends))
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is False
