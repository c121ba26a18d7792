"""The pure solver against a toy step function: honest sides always win, whatever the other does.

A Python mirror of the contract's bisection rules drives the decisions, so these run in
milliseconds without a chain or torch; tests/contracts checks the contract itself.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game import clock
from game.chain.types import EndReason, Game, Outcome, Phase, Task, TaskStatus
from game.merkle import MerkleTree, verify_proof
from game.protocol.payouts import forfeit_split
from game.protocol.solver import (
    MISSING_GRACE_FRACTION,
    Accept,
    ClaimReward,
    ClaimTimeout,
    DemandData,
    Finalize,
    ProtocolError,
    ProvideData,
    Respond,
    Reveal,
    Rule,
    Withdraw,
    auditor_move,
    data_probe_index,
    data_probe_piece,
    decide_accept,
    decide_challenge,
    decide_claims,
    decide_data_demand,
    decide_finalize,
    decide_response,
    decide_reveal,
    decide_withdraw,
    judge_move,
    pinned_step,
    trainer_move,
    window_over,
)
from game.protocol.terms import TermsPolicy, terms_problems


def first_divergence(theirs: list[bytes], ours: list[bytes]) -> int | None:
    """Index of the first leaf where the two lists differ (None when equal): slow and obvious."""
    for i in range(min(len(theirs), len(ours))):
        if theirs[i] != ours[i]:
            return i
    return None if len(theirs) == len(ours) else min(len(theirs), len(ours))


def moves_needed(num_leaves: int) -> int:
    """Bisection rounds (each a reveal and a response) for a dispute over ``num_leaves`` leaves."""
    span = num_leaves - 1
    rounds = 0
    while span > 1:
        span = (span + 1) // 2
        rounds += 1
    return rounds


def toy_step(pre: bytes, step: int, poison: bool = False) -> bytes:
    """The toy 'training step': a hash chain; a poisoned step mixes in something else."""
    return hashlib.sha256(pre + step.to_bytes(8, "big") + (b"poison" if poison else b"")).digest()


def run(n_leaves: int, deviate_at: int | None) -> list[bytes]:
    leaves = [hashlib.sha256(b"init").digest()]
    for s in range(1, n_leaves):
        leaves.append(toy_step(leaves[-1], s, poison=(deviate_at is not None and s >= deviate_at)))
    return leaves


def new_game(n: int, first: bytes, last: bytes) -> Game:
    return Game(
        lo=0, hi=n - 1, last_move_at=0, trainer_clock=60, auditor_clock=60, phase=Phase.AWAITING_REVEAL,
        auditor="0x" + "00" * 20, task_id=1, dispute_init=False, availability=False, piece=0, window_left=0,
        outcome=Outcome.NONE,
        reason=EndReason.NONE, reward_claimed=False, lo_leaf=first, hi_leaf=last, mid_leaf=b"\x00" * 32,
    )  # fmt: skip


def play(trainer_leaves: list[bytes], answer: object) -> tuple[Game, int]:
    """Bisect like the contract does; ``answer(game) -> bool`` is the auditor's strategy."""
    tree = MerkleTree(trainer_leaves)
    n = len(trainer_leaves)
    g = new_game(n, trainer_leaves[0], trainer_leaves[-1])
    rounds = 0
    if g.hi == g.lo + 1:
        return replace(g, phase=Phase.PINNED), rounds
    while True:
        rev = decide_reveal(g, tree)
        assert rev.index == g.mid and tree.leaf(rev.index) == rev.leaf
        g = replace(g, phase=Phase.AWAITING_RESPONSE, mid_leaf=rev.leaf)
        agree = answer(g)  # type: ignore[operator]
        g = replace(g, lo=g.mid, lo_leaf=g.mid_leaf) if agree else replace(g, hi=g.mid, hi_leaf=g.mid_leaf)
        g = replace(g, phase=Phase.AWAITING_REVEAL)
        rounds += 1
        if g.hi == g.lo + 1:
            return replace(g, phase=Phase.PINNED), rounds


def judge_says_trainer_right(g: Game) -> bool:
    return toy_step(g.lo_leaf, g.hi) == g.hi_leaf


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 600), data=st.data())
def test_honest_auditor_pins_exactly_the_first_deviating_step(n: int, data: st.DataObject) -> None:
    s = data.draw(st.integers(1, n - 1))
    trainer = run(n, deviate_at=s)
    auditor = run(n, deviate_at=None)
    assert first_divergence(trainer, auditor) == s
    opening = decide_challenge(trainer[0], trainer[-1], n, auditor)
    assert opening.challenge and not opening.dispute_init
    g, rounds = play(trainer, lambda g: decide_response(g, auditor))
    assert g.hi == s and g.lo == s - 1
    assert rounds <= moves_needed(n)
    assert not judge_says_trainer_right(g)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(4, 600), data=st.data())
def test_honestAuditor_pinsItsFirstDivergentStep_thoughItsLeavesMeetTheTrainersAgainLater(
    n: int, data: st.DataObject
) -> None:
    """A trainer lies about leaf ``s`` alone and goes on computing from its true state. After ``s``
    the auditor runs without the trainer's log, so its leaves meet the trainer's again until step
    ``k``, where a value the log rounds one way rounds the other. An auditor that agreed where they
    met could see the game pin ``k``, whose log is valid: the judge would find for the trainer. It
    disagrees from ``s`` on, so the game pins ``s``."""
    s = data.draw(st.integers(1, n - 3))
    k = data.draw(st.integers(s + 2, n - 1))
    honest = run(n, None)
    trainer = [*honest[:s], hashlib.sha256(b"a lie").digest(), *honest[s + 1 :]]
    auditor = honest[:k] + [hashlib.sha256(b"own rounding" + bytes([i % 256])).digest() for i in range(k, n)]
    assert decide_challenge(trainer[0], trainer[-1], n, auditor).challenge
    g, rounds = play(trainer, lambda g: decide_response(g, auditor, first_divergent=s))
    assert (g.lo, g.hi) == (s - 1, s) and rounds <= moves_needed(n)
    assert not judge_says_trainer_right(g)
    met = [i for i in range(s + 1, k) if trainer[i] == auditor[i]]
    assert met == list(range(s + 1, k))  # where the old answer agreed


def test_decideChallenge_whereOwnFinalLeafIsNoState_challengesATrainerThatCommittedTheSameMark() -> None:
    """An asynchronous task's broken schedule: the auditor's leaves from it on are a public mark, which
    a trainer can commit too. Equal final leaves then say nothing: it challenges."""
    leaves = run(9, None)
    mark = hashlib.sha256(b"mark").digest()
    own = [*leaves[:5], *[mark] * 4]
    assert not decide_challenge(own[0], own[-1], 9, own).challenge
    assert decide_challenge(own[0], own[-1], 9, own, final_is_state=False).challenge


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 600), seed=st.integers(0, 2**32))
def test_honest_trainer_wins_whatever_path_a_lying_auditor_takes(n: int, seed: int) -> None:
    trainer = run(n, deviate_at=None)
    rng = random.Random(seed)
    g, rounds = play(trainer, lambda g: rng.random() < 0.5)
    assert g.hi == g.lo + 1 and rounds <= moves_needed(n)
    assert judge_says_trainer_right(g)


def test_no_challenge_when_roots_agree_and_init_dispute_when_leaf0_differs() -> None:
    leaves = run(9, None)
    assert not decide_challenge(leaves[0], leaves[-1], 9, leaves).challenge
    other = [hashlib.sha256(b"other init").digest(), *leaves[1:]]
    opening = decide_challenge(leaves[0], leaves[-1], 9, other)
    assert opening.challenge and opening.dispute_init


def test_moves_needed_for_2_pow_20_leaves_is_20() -> None:
    assert moves_needed(2**20) == 20
    assert moves_needed(2) == 0 and moves_needed(3) == 1 and moves_needed(1025) == 10


# ------------------------------------------------------------------ moves against the clock
def test_trainerMove_revealsWhileItsClockRuns_claimsTimeoutOnceTheOtherRanOut() -> None:
    leaves = run(9, None)
    tree = MerkleTree(leaves)
    g = new_game(9, leaves[0], leaves[-1])
    move = trainer_move(g, now=99, deadline=100, tree=tree)
    assert isinstance(move, Reveal) and move.index == g.mid == 4 and move.leaf == leaves[4]
    assert trainer_move(g, now=100, deadline=100, tree=tree) is None  # lands after the deadline
    waiting = replace(g, phase=Phase.AWAITING_RESPONSE)
    assert trainer_move(waiting, now=99, deadline=100, tree=tree) is None
    assert trainer_move(waiting, now=100, deadline=100, tree=tree) == ClaimTimeout("auditor")
    pinned = replace(g, phase=Phase.PINNED)
    assert trainer_move(pinned, now=100, deadline=100, tree=tree) == ClaimTimeout("judge")
    assert trainer_move(replace(g, phase=Phase.ENDED), now=10**9, deadline=100, tree=tree) is None


def test_auditorMove_answersWithItsOwnLeaf_andTimesOutASilentTrainerOrJudge() -> None:
    ours = run(9, None)
    theirs = run(9, deviate_at=6)
    g = replace(new_game(9, ours[0], theirs[-1]), phase=Phase.AWAITING_RESPONSE, mid_leaf=theirs[4])
    assert auditor_move(g, now=99, deadline=100, own_leaves=ours) == Respond(4, True)
    bad = replace(g, lo=4, mid_leaf=theirs[6])
    assert auditor_move(bad, now=99, deadline=100, own_leaves=ours) == Respond(6, False)
    assert auditor_move(g, now=99, deadline=100, own_leaves=ours, first_divergent=4) == Respond(4, False)
    assert auditor_move(g, now=99, deadline=100, own_leaves=ours, first_divergent=5) == Respond(4, True)
    assert auditor_move(g, now=100, deadline=100, own_leaves=ours) is None
    reveal = replace(g, phase=Phase.AWAITING_REVEAL)
    assert auditor_move(reveal, now=99, deadline=100, own_leaves=ours) is None
    assert auditor_move(reveal, now=100, deadline=100, own_leaves=ours) == ClaimTimeout("trainer")
    pinned = replace(g, phase=Phase.PINNED)
    assert auditor_move(pinned, now=101, deadline=100, own_leaves=ours) == ClaimTimeout("judge")


def test_judgeMove_rulesOnThePinnedStep_untilItsDeadline() -> None:
    leaves = run(3, None)
    g = replace(new_game(3, leaves[0], leaves[-1]), lo=1, hi=2, phase=Phase.PINNED)
    assert pinned_step(g) == 2
    assert judge_move(g, now=99, deadline=100) == Rule(2)
    assert judge_move(g, now=100, deadline=100) is None
    assert judge_move(replace(g, phase=Phase.ENDED), now=0, deadline=100) is None


def _task(status: TaskStatus, window_ends: int, live_games: int = 0) -> Task:
    return Task(
        client="0x" + "01" * 20, trainer="0x" + "02" * 20, judge="0x" + "03" * 20, spec_hash=b"\x00" * 32,
        payment=10, trainer_bond=2, auditor_bond=1, clock_allowance=60, challenge_window=120, judge_window=60,
        window_ends=window_ends, num_leaves=9, state_root=b"\x00" * 32, log_root=b"\x00" * 32,
        transcript_id=b"\x00" * 32, first_leaf=b"\x00" * 32, last_leaf=b"\x00" * 32, status=status,
        live_games=live_games, trainer_lost=False, any_void=False, commit_window=60,
        commit_by=window_ends and 1, auditor_wins=0, key_hash=b"\x00" * 32,
    )  # fmt: skip


def test_decideFinalize_afterTheWindow_withNoLiveGame() -> None:
    t = _task(TaskStatus.COMMITTED, window_ends=100)
    assert decide_finalize(t, now=98) is None
    assert decide_finalize(t, now=99) == Finalize()  # the next block may be past the window
    assert decide_finalize(t, now=99, closed_for_all=True) is None  # not closed in the latest block
    assert decide_finalize(t, now=100, closed_for_all=True) == Finalize()
    assert decide_finalize(_task(TaskStatus.COMMITTED, 100, live_games=1), now=10**9) is None
    assert decide_finalize(_task(TaskStatus.FINALIZED, 100), now=10**9) is None


def test_windowOver_onlyPastItsEnd_withNoGameLive() -> None:
    """A window past its end may open again while a game is live (a met availability demand gives
    the trainer's time back to it), so an auditor that still means to challenge waits then."""
    assert not window_over(_task(TaskStatus.COMMITTED, window_ends=100), now=98)
    assert window_over(_task(TaskStatus.COMMITTED, window_ends=100), now=99)  # nothing lands in time
    assert not window_over(_task(TaskStatus.COMMITTED, 100, live_games=1), now=500)
    assert window_over(_task(TaskStatus.FINALIZED, 100, live_games=1), now=500)


def test_decideWithdraw_onlyWithCredit() -> None:
    assert decide_withdraw(0) is None
    assert decide_withdraw(5) == Withdraw(5)


def test_clock_rulesAtTheirEdges() -> None:
    assert clock.move_in_time(99, 100) and not clock.move_in_time(100, 100)
    assert clock.clock_ran_out(100, 100) and not clock.clock_ran_out(99, 100)
    assert clock.timeout_from(100) == 101
    assert clock.challenge_in_time(98, 100) and not clock.challenge_in_time(99, 100)
    assert clock.finalize_in_time(99, 100) and not clock.finalize_in_time(98, 100)
    assert clock.window_closed(100, 100) and not clock.window_closed(99, 100)
    assert clock.next_due(100, [100, 150, 120]) == 120 and clock.next_due(100, [90]) is None
    assert clock.travel_seconds(100, 100) == 1 and clock.travel_seconds(100, 130) == 30
    assert clock.seconds_until(100, 90) == -10 and clock.age(100, 130.7) == 30


def test_decideChallenge_overOneLeaf_disputesTheInitialisation() -> None:
    one = run(1, None)
    assert decide_challenge(one[0], one[0], 1, one).dispute_init  # nothing to bisect
    assert not decide_challenge(one[0], one[0], 1, one).challenge
    assert not decide_challenge(run(9, None)[0], run(9, None)[-1], 9, run(9, None)).dispute_init


# ------------------------------------------------------------------ availability, accept, rewards
def _data_game(index: int) -> Game:
    g = new_game(9, b"\x00" * 32, b"\x00" * 32)
    return replace(g, lo=index, hi=index, phase=Phase.AWAITING_DATA, availability=True)


def test_trainerMove_availability_postsTheDemandedChunkWithItsProof() -> None:
    chunks = [hashlib.sha256(b"chunk %d" % i).digest() for i in range(9)]
    log_tree = MerkleTree(chunks)
    g = _data_game(5)
    move = trainer_move(g, now=10, deadline=60, tree=MerkleTree(run(9, None)), log_tree=log_tree)
    assert move == ProvideData(5, log_tree.proof(5).siblings) and g.data_index == 5
    assert verify_proof(log_tree.root, chunks[5], log_tree.proof(5))
    assert trainer_move(g, now=60, deadline=60, tree=MerkleTree(run(9, None)), log_tree=log_tree) is None
    with pytest.raises(ProtocolError):  # no log tree to prove from: a bug, said at once
        trainer_move(g, now=10, deadline=60, tree=MerkleTree(run(9, None)))


def test_auditorMove_availability_claimsTheTimeoutOnceTheTrainersClockRanOut() -> None:
    g = _data_game(3)
    assert auditor_move(g, now=10, deadline=60, own_leaves=[]) is None
    assert auditor_move(g, now=60, deadline=60, own_leaves=[]) == ClaimTimeout("trainer")


def test_decideDataDemand_unreadableAtOnce_missingAfterTheGrace_oncePerAuditor() -> None:
    me = "0x" + "0a" * 20
    t = replace(_task(TaskStatus.COMMITTED, window_ends=1_120), challenge_window=1_000)  # committed at 120
    grace = 120 + 1_000 // MISSING_GRACE_FRACTION
    probe = DemandData(data_probe_index(1, me, t.num_leaves), data_probe_piece(1, me))
    assert 1 <= probe.index <= t.num_leaves - 1 and 0 <= probe.piece < 2**32
    demand = {"task_id": 1, "auditor": me, "demanded": False}
    assert decide_data_demand(t, 200, "unreadable", **demand) == probe
    assert decide_data_demand(t, 200, "ok", **demand) is None
    assert decide_data_demand(t, grace - 1, "missing", **demand) is None  # a synced store may lag
    assert decide_data_demand(t, grace, "missing", **demand) == probe
    assert decide_data_demand(t, 200, "unreadable", task_id=1, auditor=me, demanded=True) is None
    assert decide_data_demand(t, 1_119, "unreadable", **demand) is None  # would land after the window
    # another auditor probes (most likely) another step; the same one always the same
    others = {data_probe_index(1, "0x" + (bytes([i]) * 20).hex(), 9) for i in range(40)}
    assert len(others) > 1 and data_probe_index(1, me, 9) == probe.index
    # and another piece of a large chunk: over 40 auditors, a 3-piece chunk's every piece is drawn
    pieces = {data_probe_piece(1, "0x" + (bytes([i]) * 20).hex()) % 3 for i in range(40)}
    assert pieces == {0, 1, 2} and data_probe_piece(1, me) == probe.piece


def test_decideAccept_onlyAnOpenTask() -> None:
    assert decide_accept(_task(TaskStatus.OPEN, 0)) == Accept()
    assert decide_accept(_task(TaskStatus.ACCEPTED, 0)) is None


def test_termsProblems_keyAndPolicy() -> None:
    t = _task(TaskStatus.OPEN, 0)
    assert terms_problems(t, b"\x00" * 32) == []
    assert "not the task's" in terms_problems(t, b"\x01" * 32)[0]
    assert (
        "clock allowance is 60 s" in terms_problems(t, b"\x00" * 32, TermsPolicy(min_clock_allowance=61))[0]
    )
    judged_by_client = replace(t, judge=t.client)
    assert "own task's judge" in terms_problems(judged_by_client, b"\x00" * 32)[0]
    assert terms_problems(judged_by_client, b"\x00" * 32, TermsPolicy(judge_may_be_client=True)) == []
    # the trainer's own price, risk and wait: each refused past its limit, each accepted at it
    at_limits = TermsPolicy(min_payment=10, max_bond=2, max_challenge_window=120)
    assert terms_problems(t, b"\x00" * 32, at_limits) == []
    assert terms_problems(t, b"\x00" * 32, replace(at_limits, min_payment=11)) == [
        "the payment is 10 wei, under the 11 wei this trainer asks"
    ]
    assert terms_problems(t, b"\x00" * 32, replace(at_limits, max_bond=1)) == [
        "the trainer's bond is 2 wei, over the 1 wei this trainer locks"
    ]
    assert terms_problems(t, b"\x00" * 32, replace(at_limits, max_challenge_window=119)) == [
        "the challenge window is 120 s, longer than the 119 s this trainer waits to be paid"
    ]


def test_decideClaims_onlyWonUnclaimedGamesOfASettledTask() -> None:
    g = new_game(9, b"\x00" * 32, b"\x00" * 32)
    games = [
        (1, replace(g, outcome=Outcome.AUDITOR_WON)),
        (2, replace(g, outcome=Outcome.AUDITOR_WON, reward_claimed=True)),
        (3, replace(g, outcome=Outcome.TRAINER_WON)),
        (4, replace(g, outcome=Outcome.ANSWERED)),
    ]
    assert decide_claims(_task(TaskStatus.FINALIZED, 100), games) == [ClaimReward(1)]
    assert decide_claims(_task(TaskStatus.COMMITTED, 100), games) == []


@pytest.mark.parametrize("wins", [1, 2, 3, 7])
@pytest.mark.parametrize(("trainer_bond", "auditor_bond"), [(10, 3), (2, 1), (1, 1), (5 * 10**17, 10**17)])
def test_forfeitSplit_addsUp_halfBurnt_equalCappedShares(
    trainer_bond: int, auditor_bond: int, wins: int
) -> None:
    split = forfeit_split(trainer_bond, auditor_bond, wins)
    assert split.burnt + split.share * wins + split.to_client == trainer_bond  # every wei accounted for
    assert split.burnt == trainer_bond // 2 and 0 <= split.share <= auditor_bond
    assert split.share == min(auditor_bond, (trainer_bond - trainer_bond // 2) // wins)
