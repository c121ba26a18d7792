"""Games: challenge, bisection, ruling, timeouts, several games per task, and the money rules."""

from __future__ import annotations

import hashlib

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    ACCEPTED,
    AUDITOR_BOND,
    AUDITOR_WON,
    AWAITING_RESPONSE,
    AWAITING_REVEAL,
    CLOCK,
    COMMITTED,
    ENDED,
    FINALIZED,
    JUDGE_TIMEOUT,
    JUDGE_WINDOW,
    OPEN,
    PAYMENT,
    PINNED,
    RULING,
    SPEC,
    TIMEOUT,
    TRAINER_BOND,
    TRAINER_WON,
    VOID,
    Env,
    leaves,
)

ZERO = "0x0000000000000000000000000000000000000000"


def _setup(env: Env, n: int, diverge_at: int | None = None) -> tuple[int, MerkleTree, list[bytes]]:
    """A committed task: the trainer's tree (lying from ``diverge_at`` on) and the honest leaves."""
    honest = leaves(n)
    tree = MerkleTree(leaves(n, diverge_at=diverge_at))
    task = env.create_task(n)
    env.commit(task, tree)
    return task, tree, honest


def _ceil_log2(x: int) -> int:
    return (x - 1).bit_length()


# ---------------------------------------------------------------- challenge
def test_challenge_opensGame(env: Env) -> None:
    task, tree, _ = _setup(env, 9)
    start = env.now() + 3
    env.at(start)
    receipt = env.send(env.game.functions.challenge(task, False), env.auditors[0], AUDITOR_BOND)
    ev = env.event(receipt, "Challenged")
    assert (ev["taskId"], ev["gameId"], ev["auditor"]) == (task, 1, env.auditors[0])
    assert (ev["disputeInit"], ev["lo"], ev["hi"]) == (False, 0, 8)
    g = env.game_state(1)
    assert (g.lo, g.hi, g.phase, g.taskId, g.auditor) == (0, 8, AWAITING_REVEAL, task, env.auditors[0])
    assert (g.trainerClock, g.auditorClock, g.lastMoveAt) == (CLOCK, CLOCK, start)
    assert (g.loLeaf, g.hiLeaf) == (tree.leaf(0), tree.leaf(8))
    assert env.task(task).liveGames == 1 and env.game.functions.gameCount().call() == 1
    assert env.deadline(1) == start + CLOCK and env.clock_left(1) == (CLOCK, CLOCK)


def test_challenge_byClient_allowed(env: Env) -> None:
    task, _, _ = _setup(env, 4)
    assert env.challenge(task, env.client) == 1


def test_challenge_reverts(env: Env) -> None:
    fn = env.game.functions.challenge
    assert env.reverts(fn(5, False), env.auditors[0], AUDITOR_BOND) == ("TaskNotFound", (5,))
    open_task = env.create_task(16, accept=False)
    assert env.reverts(fn(open_task, False), env.auditors[0], AUDITOR_BOND) == (
        "WrongTaskStatus",
        (open_task, OPEN),
    )
    env.accept(open_task)
    assert env.reverts(fn(open_task, False), env.auditors[0], AUDITOR_BOND) == (
        "WrongTaskStatus",
        (open_task, ACCEPTED),
    )
    task, _, _ = _setup(env, 4)
    assert env.reverts(fn(task, False), env.trainer, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.trainer,))
    assert env.reverts(fn(task, True), env.judge, AUDITOR_BOND) == ("ChallengerNotAllowed", (env.judge,))
    assert env.reverts(fn(task, False), env.auditors[0], 0) == ("WrongBond", (0, AUDITOR_BOND))
    assert env.reverts(fn(task, False), env.auditors[0], AUDITOR_BOND + 1) == (
        "WrongBond",
        (AUDITOR_BOND + 1, AUDITOR_BOND),
    )
    ends = env.task(task).windowEnds
    env.at(ends - 1)
    env.challenge(task, env.auditors[0])  # the last second of the window still counts
    assert env.now() == ends - 1
    assert env.reverts(fn(task, False), env.auditors[1], AUDITOR_BOND) == ("WindowClosed", (task, ends))
    env.at(ends + 10)
    assert env.reverts(fn(task, False), env.auditors[1], AUDITOR_BOND) == ("WindowClosed", (task, ends))


def test_challenge_disputeInit_pinsStepZero(env: Env) -> None:
    task, tree, _ = _setup(env, 6)
    start = env.now() + 1
    receipt = env.send(env.game.functions.challenge(task, True), env.auditors[0], AUDITOR_BOND)
    assert env.event_names(receipt) == ["Challenged", "StepPinned"]
    pin = env.event(receipt, "StepPinned")
    assert (pin["step"], pin["preLeaf"], pin["postLeaf"]) == (0, SPEC, tree.leaf(0))
    assert pin["judgeDeadline"] == start + JUDGE_WINDOW == env.deadline(1)
    # the judge finds a different initial state: the auditor wins
    env.rule(1, hashlib.sha256(b"another init").digest())
    assert env.game_state(1).outcome == AUDITOR_WON


def test_challenge_twoLeaves_pinnedAtOnce(env: Env) -> None:
    task, tree, _ = _setup(env, 2)
    receipt = env.send(env.game.functions.challenge(task, False), env.auditors[0], AUDITOR_BOND)
    pin = env.event(receipt, "StepPinned")
    assert (pin["gameId"], pin["taskId"], pin["step"]) == (1, task, 1)
    assert (pin["preLeaf"], pin["postLeaf"]) == (tree.leaf(0), tree.leaf(1))


# ---------------------------------------------------------------- bisection
@pytest.mark.parametrize(
    ("n", "s"),
    [(3, 1), (3, 2), (4, 3), (5, 1), (8, 5), (13, 7), (13, 12), (16, 1), (1000, 999), (1025, 513)],
)
def test_liarTrainer_gamePinsFirstWrongStep_auditorWins(env: Env, n: int, s: int) -> None:
    """Invariant 2: the trainer deviates first at step s; the honest auditor pins exactly s and wins."""
    task, tree, honest = _setup(env, n, diverge_at=s)
    game_id = env.challenge(task, env.auditors[0])
    rounds = env.bisect(game_id, tree, honest)
    g = env.game_state(game_id)
    assert (g.lo, g.hi, g.phase) == (s - 1, s, PINNED)
    assert rounds <= _ceil_log2(n - 1)
    assert (g.loLeaf, g.hiLeaf) == (honest[s - 1], tree.leaf(s))
    receipt = env.rule(game_id, honest[s])  # the judge re-runs step s from the agreed state
    assert env.event_names(receipt) == ["Ruled", "GameEnded", "Credited"]
    ended = env.event(receipt, "GameEnded")
    assert (ended["outcome"], ended["reason"], ended["winner"]) == (AUDITOR_WON, RULING, env.auditors[0])
    assert env.credit(env.auditors[0]) == AUDITOR_BOND  # its bond now; its reward once the task settles
    env.at(env.task(task).windowEnds)
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is False
    env.claim_reward(game_id)
    assert env.credit(env.auditors[0]) == 2 * AUDITOR_BOND  # alone, an auditor doubles its bond


@pytest.mark.parametrize("n", [3, 4, 5, 8, 13, 100])
@pytest.mark.parametrize("path", ["always agree", "always disagree", "alternate"])
def test_honestTrainer_winsWhateverTheAuditorSays(env: Env, n: int, path: str) -> None:
    """Invariant 3: a lying auditor loses on every path it picks."""
    task, tree, _ = _setup(env, n)
    game_id = env.challenge(task, env.auditors[0])
    k = 0
    while env.game_state(game_id).phase != PINNED:
        env.reveal(game_id, tree)
        agree = {"always agree": True, "always disagree": False, "alternate": k % 2 == 0}[path]
        env.respond(game_id, agree)
        k += 1
    g = env.game_state(game_id)
    assert g.hi == g.lo + 1 and k <= _ceil_log2(n - 1)
    env.rule(game_id, tree.leaf(g.hi))  # re-running an honest step gives the trainer's leaf
    assert env.game_state(game_id).outcome == TRAINER_WON
    assert env.credit(env.trainer) == AUDITOR_BOND
    env.at(env.task(task).windowEnds)
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is True
    assert env.credit(env.trainer) == AUDITOR_BOND + PAYMENT + TRAINER_BOND


def test_reveal_and_respond_updateStateAndEmit(env: Env) -> None:
    task, tree, _ = _setup(env, 10)
    game_id = env.challenge(task, env.auditors[0])
    t0 = env.now()
    env.at(t0 + 30)
    ev = env.event(env.reveal(game_id, tree), "LeafRevealed")
    assert (ev["gameId"], ev["index"], ev["leaf"], ev["trainerClockLeft"]) == (
        game_id,
        4,
        tree.leaf(4),
        CLOCK - 30,
    )
    g = env.game_state(game_id)
    assert (g.phase, g.midLeaf, g.trainerClock, g.lastMoveAt) == (
        AWAITING_RESPONSE,
        tree.leaf(4),
        CLOCK - 30,
        t0 + 30,
    )
    # reveal rewrites slot 0 by hand: every other field of it must be untouched
    assert (g.lo, g.hi, g.auditorClock, g.taskId, g.auditor) == (0, 9, CLOCK, task, env.auditors[0])
    env.at(t0 + 100)
    ev = env.event(env.respond(game_id, True), "Responded")
    assert (ev["agree"], ev["lo"], ev["hi"], ev["auditorClockLeft"]) == (True, 4, 9, CLOCK - 70)
    g = env.game_state(game_id)
    assert (g.lo, g.hi, g.phase, g.loLeaf, g.auditorClock) == (
        4,
        9,
        AWAITING_REVEAL,
        tree.leaf(4),
        CLOCK - 70,
    )
    env.reveal(game_id, tree)  # mid 6
    env.respond(game_id, False)
    g = env.game_state(game_id)
    assert (g.lo, g.hi, g.hiLeaf) == (4, 6, tree.leaf(6))
    env.reveal(game_id, tree)  # mid 5
    receipt = env.respond(game_id, True)
    assert env.event_names(receipt) == ["Responded", "StepPinned"]
    pin = env.event(receipt, "StepPinned")
    assert (pin["step"], pin["preLeaf"], pin["postLeaf"]) == (6, tree.leaf(5), tree.leaf(6))
    assert pin["judgeDeadline"] == env.now() + JUDGE_WINDOW == env.deadline(game_id)


def test_reveal_reverts(env: Env) -> None:
    task, tree, _ = _setup(env, 10)
    fn = env.game.functions.reveal
    assert env.reverts(fn(3, tree.leaf(4), []), env.trainer) == ("GameNotFound", (3,))
    game_id = env.challenge(task, env.auditors[0])
    good = env.reveal_fn(game_id, tree)
    assert env.reverts(good, env.auditors[0]) == ("Unauthorized", (env.auditors[0], env.trainer))
    assert env.reverts(good, env.outsider) == ("Unauthorized", (env.outsider, env.trainer))
    # a valid leaf at the wrong index, a wrong leaf, a proof for another index
    wrong_index = fn(game_id, tree.leaf(3), list(tree.proof(3).siblings))
    assert env.reverts(wrong_index, env.trainer) == ("InvalidProof", (4, tree.leaf(3)))
    forged = hashlib.sha256(b"forged").digest()
    assert env.reverts(fn(game_id, forged, list(tree.proof(4).siblings)), env.trainer) == (
        "InvalidProof",
        (4, forged),
    )
    env.send(good, env.trainer)
    # twice in a row: not the trainer's turn any more
    assert env.reverts(good, env.trainer) == ("NotYourTurn", (game_id, AWAITING_RESPONSE))


def test_respond_reverts(env: Env) -> None:
    task, tree, _ = _setup(env, 10)
    fn = env.game.functions.respond
    assert env.reverts(fn(2, True), env.auditors[0]) == ("GameNotFound", (2,))
    game_id = env.challenge(task, env.auditors[0])
    # before any reveal: the auditor has nothing to answer
    assert env.reverts(fn(game_id, True), env.auditors[0]) == ("NotYourTurn", (game_id, AWAITING_REVEAL))
    env.reveal(game_id, tree)
    assert env.reverts(fn(game_id, True), env.auditors[1]) == (
        "Unauthorized",
        (env.auditors[1], env.auditors[0]),
    )
    assert env.reverts(fn(game_id, False), env.trainer) == ("Unauthorized", (env.trainer, env.auditors[0]))
    env.respond(game_id, True)
    assert env.reverts(fn(game_id, True), env.auditors[0]) == ("NotYourTurn", (game_id, AWAITING_REVEAL))


def test_rule_reverts(env: Env) -> None:
    task, tree, _ = _setup(env, 5)
    fn = env.game.functions.rule
    assert env.reverts(fn(1, b"\x00" * 32), env.judge) == ("GameNotFound", (1,))
    game_id = env.challenge(task, env.auditors[0])
    assert env.reverts(fn(game_id, b"\x00" * 32), env.judge) == ("NotYourTurn", (game_id, AWAITING_REVEAL))
    env.bisect(game_id, tree, leaves(5))
    assert env.reverts(fn(game_id, b"\x00" * 32), env.outsider) == ("Unauthorized", (env.outsider, env.judge))
    assert env.reverts(fn(game_id, b"\x00" * 32), env.trainer) == ("Unauthorized", (env.trainer, env.judge))
    due = env.deadline(game_id)
    env.at(due + 1)
    assert env.reverts(fn(game_id, b"\x00" * 32), env.judge) == ("ClockExpired", (game_id, due))


def test_rule_atDeadline_accepted(env: Env) -> None:
    task, tree, honest = _setup(env, 5)
    game_id = env.challenge(task, env.auditors[0])
    env.bisect(game_id, tree, honest)
    env.at(env.deadline(game_id))
    env.rule(game_id, tree.leaf(env.game_state(game_id).hi))
    assert env.game_state(game_id).outcome == TRAINER_WON


def test_endedGame_acceptsNothing(env: Env) -> None:
    """Invariant 5: no move, ruling or timeout after the end."""
    task, tree, honest = _setup(env, 5, diverge_at=3)
    game_id = env.challenge(task, env.auditors[0])
    env.bisect(game_id, tree, honest)
    env.rule(game_id, honest[3])
    over = ("GameOver", (game_id, AUDITOR_WON))
    g = env.game.functions
    assert env.reverts(g.reveal(game_id, tree.leaf(2), list(tree.proof(2).siblings)), env.trainer) == over
    assert env.reverts(g.respond(game_id, True), env.auditors[0]) == over
    assert env.reverts(g.rule(game_id, honest[3]), env.judge) == over
    assert env.reverts(g.timeout(game_id), env.outsider) == over
    assert env.deadline(game_id) == 0 and env.game_state(game_id).phase == ENDED


# ---------------------------------------------------------------- timeouts
@pytest.mark.parametrize(
    ("moves", "outcome", "reason", "winner"),
    [
        (0, AUDITOR_WON, TIMEOUT, "auditor"),  # the trainer never reveals
        (1, TRAINER_WON, TIMEOUT, "trainer"),  # the auditor never answers
        (2, AUDITOR_WON, TIMEOUT, "auditor"),  # the trainer stops after one round
    ],
)
def test_timeout_moverLoses(env: Env, moves: int, outcome: int, reason: int, winner: str) -> None:
    task, tree, _ = _setup(env, 9)
    game_id = env.challenge(task, env.auditors[0])
    if moves >= 1:
        env.reveal(game_id, tree)
    if moves >= 2:
        env.respond(game_id, True)
    due = env.deadline(game_id)
    env.at(due)
    assert env.reverts(env.game.functions.timeout(game_id), env.outsider) == ("ClockRunning", (game_id, due))
    env.at(due + 1)
    receipt = env.timeout(game_id)
    ev = env.event(receipt, "GameEnded")
    expected = env.auditors[0] if winner == "auditor" else env.trainer
    assert (ev["outcome"], ev["reason"], ev["winner"], ev["taskId"]) == (outcome, reason, expected, task)
    assert env.game_state(game_id).phase == ENDED and env.task(task).liveGames == 0


def test_timeout_unknownGame_reverts(env: Env) -> None:
    assert env.reverts(env.game.functions.timeout(4), env.outsider) == ("GameNotFound", (4,))


def test_judgeMisses_deadline_gameVoid_trainerNotShownWrong_isPaid(env: Env) -> None:
    """The judge's deadline passes: the game is void. Nobody was shown wrong: the auditor gets its
    bond back, and the trainer, whose leaves stand, is paid (issue 44: a silent judge named by the
    client must not hand the client free training; tests/contracts/test_silent_judge.py)."""
    task, tree, honest = _setup(env, 6, diverge_at=4)
    game_id = env.challenge(task, env.auditors[0])
    env.bisect(game_id, tree, honest)
    due = env.deadline(game_id)
    env.at(due)
    assert env.reverts(env.game.functions.timeout(game_id), env.outsider) == ("ClockRunning", (game_id, due))
    env.at(due + 1)
    ev = env.event(env.timeout(game_id), "GameEnded")
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (VOID, JUDGE_TIMEOUT, ZERO)
    assert env.credit(env.auditors[0]) == AUDITOR_BOND
    env.at(env.task(task).windowEnds + 1)
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is True
    assert env.credit(env.client) == 0 and env.credit(env.trainer) == PAYMENT + TRAINER_BOND
    assert env.task(task).anyVoid and not env.task(task).trainerLost
    assert env.balance() == env.credits()


# ---------------------------------------------------------------- several games
def test_severalGames_winnersShareTrainerBond_atFinalize(env: Env) -> None:
    """Two auditors win, one loses: the winners get their bonds back when their games end and share
    half the trainer's bond once the task settles, whichever game ended first; the other half is
    burnt, the loser's bond goes to the trainer (docs/contract.md "Money")."""
    n, s = 12, 7
    task, tree, honest = _setup(env, n, diverge_at=s)
    a, b, c = env.auditors[:3]
    ga, gb, gc = env.challenge(task, a), env.challenge(task, b), env.challenge(task, c)
    assert env.task(task).liveGames == 3
    for game_id in (ga, gb):
        env.bisect(game_id, tree, honest)
        assert env.game_state(game_id).hi == s
    env.rule(gb, honest[s])
    env.rule(ga, honest[s])
    assert env.credit(a) == env.credit(b) == AUDITOR_BOND  # bonds back; the order of endings pays nobody
    # c never answers after the first reveal: it times out and the trainer wins c's bond
    env.reveal(gc, tree)
    env.at(env.deadline(gc) + 1)
    env.timeout(gc)
    assert env.credit(env.trainer) == AUDITOR_BOND
    assert env.reverts(env.game.functions.claimReward(ga), env.outsider) == (
        "WrongTaskStatus",
        (task, COMMITTED),
    )
    env.at(env.task(task).windowEnds)
    ev = env.event(env.finalize(task), "TaskFinalized")
    share = (TRAINER_BOND - TRAINER_BOND // 2) // 2
    assert (ev["trainerPaid"], ev["auditorWins"], ev["rewardShare"], ev["burnt"]) == (
        False,
        2,
        share,
        TRAINER_BOND // 2,
    )
    assert env.credit(env.client) == PAYMENT  # two half-bond shares leave nothing of the pool
    for game_id, auditor in ((ga, a), (gb, b)):
        receipt = env.claim_reward(game_id)
        assert (
            env.event(receipt, "RewardPaid")["amount"] == share
            and env.credit(auditor) == AUDITOR_BOND + share
        )
    assert env.reverts(env.game.functions.claimReward(gc), env.outsider) == ("NoReward", (gc, TRAINER_WON))
    assert env.reverts(env.game.functions.claimReward(ga), env.outsider) == ("RewardAlreadyClaimed", (ga,))
    assert env.task(task).status == FINALIZED and env.task(task).trainerLost
    assert env.burnt() == TRAINER_BOND // 2 and env.solvent()
    assert env.balance() == env.credits() + env.burnt() == PAYMENT + TRAINER_BOND + 3 * AUDITOR_BOND


def test_solvency_throughAGame(env: Env) -> None:
    """Invariant 4: balance == credits + escrow + burnt after every transaction; all paid out at the
    end but the burnt half of the lost bond."""
    task, tree, honest = _setup(env, 7, diverge_at=2)
    assert env.solvent()
    game_id = env.challenge(task, env.auditors[0])
    assert env.solvent() and env.balance() == PAYMENT + TRAINER_BOND + AUDITOR_BOND
    while env.game_state(game_id).phase != PINNED:
        mid = env.mid(game_id)
        env.reveal(game_id, tree)
        env.respond(game_id, tree.leaf(mid) == honest[mid])
        assert env.solvent()
    env.rule(game_id, honest[2])
    assert env.solvent()
    env.at(env.task(task).windowEnds)
    env.finalize(task)
    assert env.solvent() and env.escrow() == env.reward_share(task) > 0
    env.claim_reward(game_id)
    assert env.escrow() == 0 and env.balance() == env.credits() + env.burnt()
    for who in (env.client, env.auditors[0]):
        env.send(env.game.functions.withdraw(), who)
    assert env.balance() == env.burnt() == TRAINER_BOND // 2 and env.credits() == 0
    assert env.task(task).status == FINALIZED and env.task(task).status != COMMITTED
