"""Chess clocks: time spent is really deducted (nitro#331), waiting never hurts the winner (dave#275),
moves are allowed up to and including the deadline, timeouts strictly after it."""

from __future__ import annotations

from game.merkle import MerkleTree
from tests.contracts.driver import (
    AUDITOR_BOND,
    AUDITOR_WON,
    CLOCK,
    PAYMENT,
    TIMEOUT,
    TRAINER_BOND,
    TRAINER_WON,
    Env,
    leaves,
)


def _game(env: Env, n: int = 33) -> tuple[int, MerkleTree]:
    tree = MerkleTree(leaves(n))
    task = env.create_task(n)
    env.commit(task, tree)
    return env.challenge(task, env.auditors[0]), tree


def test_timeLeft_reallyUpdated_acrossTurns(env: Env) -> None:
    """nitro#331: each move deducts exactly the time its mover spent, and the next turn starts from it."""
    game_id, tree = _game(env)
    t = env.game_state(game_id).lastMoveAt
    spent_trainer = spent_auditor = 0
    for trainer_takes, auditor_takes in ((100, 40), (250, 7), (1, 1000)):
        t += trainer_takes
        env.at(t)
        ev = env.event(env.reveal(game_id, tree), "LeafRevealed")
        spent_trainer += trainer_takes
        assert ev["trainerClockLeft"] == CLOCK - spent_trainer == env.game_state(game_id).trainerClock
        assert env.clock_left(game_id)[1] == CLOCK - spent_auditor  # the auditor's clock is running now
        assert env.deadline(game_id) == t + CLOCK - spent_auditor
        t += auditor_takes
        env.at(t)
        ev = env.event(env.respond(game_id, True), "Responded")
        spent_auditor += auditor_takes
        assert ev["auditorClockLeft"] == CLOCK - spent_auditor == env.game_state(game_id).auditorClock
        # the trainer's clock resumes from what it had left, not from the allowance
        assert env.deadline(game_id) == t + CLOCK - spent_trainer


def test_move_oneSecondAfterDeadline_expired(env: Env) -> None:
    game_id, tree = _game(env)
    start = env.game_state(game_id).lastMoveAt
    env.at(start + 500)
    env.reveal(game_id, tree)
    env.at(start + 600)
    env.respond(game_id, False)
    due = env.deadline(game_id)
    assert due == start + 600 + CLOCK - 500
    env.at(due + 1)
    fn = env.reveal_fn(game_id, tree)
    assert env.reverts(fn, env.trainer) == ("ClockExpired", (game_id, due))


def test_move_atDeadline_leavesZero(env: Env) -> None:
    game_id, tree = _game(env)
    due = env.deadline(game_id)
    env.at(due)
    ev = env.event(env.reveal(game_id, tree), "LeafRevealed")
    assert ev["trainerClockLeft"] == 0
    assert env.clock_left(game_id) == (0, CLOCK)
    # the auditor now moves; then the trainer has no time at all for its next reveal
    env.respond(game_id, True)
    assert env.deadline(game_id) == env.now()
    env.at(env.now() + 1)
    assert env.reverts(env.reveal_fn(game_id, tree), env.trainer)[0] == "ClockExpired"


def test_respond_afterClockRanOut_reverts(env: Env) -> None:
    game_id, tree = _game(env)
    env.reveal(game_id, tree)
    due = env.deadline(game_id)
    env.at(due + 1)
    assert env.reverts(env.game.functions.respond(game_id, True), env.auditors[0]) == (
        "ClockExpired",
        (game_id, due),
    )


def test_clockLeft_countsDownOnlyForTheMover(env: Env) -> None:
    game_id, _tree = _game(env)
    start = env.game_state(game_id).lastMoveAt
    env.at(start + 123)
    env.chain.mine()  # a block at start + 123: views now see that time
    assert env.now() == start + 123
    assert env.clock_left(game_id) == (CLOCK - 123, CLOCK)
    env.at(start + CLOCK + 50)
    env.chain.mine()
    assert env.clock_left(game_id) == (0, CLOCK)  # floored at zero, never negative


def test_timeout_afterWinnerWaits_stillPays(env: Env) -> None:
    """dave#275: the auditor's clock runs out; the trainer waits ten allowances before claiming.
    Waiting does not drain the winner's clock and timeout still succeeds."""
    game_id, tree = _game(env)
    start = env.game_state(game_id).lastMoveAt
    env.at(start + 10)
    env.reveal(game_id, tree)  # trainer has CLOCK - 10; auditor's clock runs
    due = env.deadline(game_id)
    env.at(due + 10 * CLOCK)
    env.chain.mine()
    assert env.clock_left(game_id) == (CLOCK - 10, 0)  # the waiting winner's clock is untouched
    ev = env.event(env.timeout(game_id, caller=env.trainer), "GameEnded")
    assert (ev["outcome"], ev["winner"]) == (TRAINER_WON, env.trainer)
    assert env.game_state(game_id).trainerClock == CLOCK - 10


def test_timeout_afterAuditorWaits_stillPays(env: Env) -> None:
    """dave#275, other side: the trainer never reveals; the auditor claims much later and wins."""
    game_id, _ = _game(env)
    env.at(env.deadline(game_id) + 100 * CLOCK)
    ev = env.event(env.timeout(game_id, caller=env.auditors[0]), "GameEnded")
    assert (ev["outcome"], ev["winner"]) == (AUDITOR_WON, env.auditors[0])
    assert (
        env.credit(env.auditors[0]) == AUDITOR_BOND and env.task(env.game_state(game_id).taskId).trainerLost
    )


def test_timeout_byAnyone(env: Env) -> None:
    game_id, _ = _game(env)
    env.at(env.deadline(game_id) + 1)
    env.timeout(game_id, caller=env.client)
    assert env.game_state(game_id).outcome == AUDITOR_WON


# dave#275 with the winner's clock drained: the winner moved at its very deadline (its clock is 0), then
# the loser never moves. The timeout still goes to the winner, never void: the deadline that counts is
# the mover's (the loser's), and a winner with no time left has nothing more to do.
def test_auditorTimesOut_trainerClockDrained_trainerWinsAndIsPaid(env: Env) -> None:
    game_id, tree = _game(env)
    task = env.game_state(game_id).taskId
    env.at(env.deadline(game_id))
    assert env.event(env.reveal(game_id, tree), "LeafRevealed")["trainerClockLeft"] == 0
    revealed_at = env.now()
    due = env.deadline(game_id)
    assert due == revealed_at + CLOCK  # the auditor's clock, not the trainer's empty one
    env.at(due)
    assert env.reverts(env.game.functions.timeout(game_id), env.outsider) == ("ClockRunning", (game_id, due))
    env.estimate(env._tx(env.game.functions.respond(game_id, True), env.auditors[0], 0))  # still in time
    env.at(due + 10 * CLOCK)  # and the winner may wait as long as it likes
    env.chain.mine()
    assert env.clock_left(game_id) == (0, 0)
    ev = env.event(env.timeout(game_id), "GameEnded")
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (TRAINER_WON, TIMEOUT, env.trainer)
    g = env.game_state(game_id)
    assert (g.outcome, g.reason, g.trainerClock) == (TRAINER_WON, TIMEOUT, 0)
    assert env.credit(env.trainer) == AUDITOR_BOND and env.credit(env.auditors[0]) == 0
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is True
    assert env.credit(env.trainer) == AUDITOR_BOND + PAYMENT + TRAINER_BOND
    assert env.balance() == env.credits()


def test_trainerTimesOut_auditorClockDrained_auditorWinsAndIsPaid(env: Env) -> None:
    game_id, tree = _game(env)
    task = env.game_state(game_id).taskId
    env.reveal(game_id, tree)
    env.at(env.deadline(game_id))
    assert env.event(env.respond(game_id, True), "Responded")["auditorClockLeft"] == 0
    due = env.deadline(game_id)
    assert due == env.now() + env.game_state(game_id).trainerClock  # the trainer's clock runs now
    env.at(due)
    assert env.reverts(env.game.functions.timeout(game_id), env.outsider) == ("ClockRunning", (game_id, due))
    env.estimate(env._tx(env.reveal_fn(game_id, tree), env.trainer, 0))  # still in time
    env.at(due + 10 * CLOCK)
    ev = env.event(env.timeout(game_id), "GameEnded")
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (AUDITOR_WON, TIMEOUT, env.auditors[0])
    g = env.game_state(game_id)
    assert (g.outcome, g.reason, g.auditorClock) == (AUDITOR_WON, TIMEOUT, 0)
    assert env.credit(env.auditors[0]) == AUDITOR_BOND and env.credit(env.trainer) == 0
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is False
    env.claim_reward(game_id)
    assert env.credit(env.auditors[0]) == AUDITOR_BOND + env.reward_share(task) > AUDITOR_BOND
    assert env.credit(env.client) == PAYMENT and env.credit(env.trainer) == 0
    assert env.balance() == env.credits() + env.burnt()


def test_bothClocksDrained_theMoverLoses(env: Env) -> None:
    """Both clocks at 0: the trainer revealed and the auditor answered, each at its deadline; the
    trainer, to move with no time, loses one second later (not void, not the auditor)."""
    game_id, tree = _game(env)
    env.at(env.deadline(game_id))
    env.reveal(game_id, tree)
    env.at(env.deadline(game_id))
    env.respond(game_id, False)
    assert env.clock_left(game_id) == (0, 0) and env.deadline(game_id) == env.now()
    env.at(env.now() + 1)
    ev = env.event(env.timeout(game_id), "GameEnded")
    assert (ev["outcome"], ev["reason"], ev["winner"]) == (AUDITOR_WON, TIMEOUT, env.auditors[0])
