"""The pure solver against a toy step function: honest sides always win, whatever the other does.

A Python mirror of the contract's bisection rules drives the decisions, so these run in
milliseconds without a chain or torch; tests/contracts checks the contract itself.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from game.chain.types import EndReason, Game, Outcome, Phase
from game.merkle import MerkleTree
from game.protocol import decide_challenge, decide_response, decide_reveal, first_divergence, moves_needed


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
        auditor="0x" + "00" * 20, task_id=1, dispute_init=False, outcome=Outcome.NONE,
        reason=EndReason.NONE, lo_leaf=first, hi_leaf=last, mid_leaf=b"\x00" * 32,
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
