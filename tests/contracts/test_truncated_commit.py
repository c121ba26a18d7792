"""Issue 44, exploit 1 (truncated commitment): the task fixes its leaf count at creation, and a
trainer cannot commit fewer (or more) leaves than that.

Before the fix, nothing on-chain tied the committed leaf count to the task: a trainer whose spec asks
for 16 steps (17 leaves) committed N = 1, the initial state alone, with valid proofs. Bisection had
nothing to refuse (N = 1: ``NothingToBisect``), a dispute over the initial state was ruled for the
trainer (its leaf 0 is right), and ``finalize`` paid it for training it never did. N = 3 was the same
lie with a bisection over three leaves that the trainer could win step by step.
"""

from __future__ import annotations

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    ACCEPTED,
    AUDITOR_BOND,
    COMMITTED,
    PAYMENT,
    SPEC,
    TRAINER_BOND,
    TRAINER_WON,
    ContractReverted,
    Env,
    leaves,
)

STEPS = 16
LEAVES = STEPS + 1  # step 0 (the initialisation) and one leaf per step


@pytest.mark.parametrize("n", [1, 3])
def test_truncatedCommitment_refused_andTheClientGetsItsPaymentBack(env: Env, n: int) -> None:
    """The honest run's first ``n`` leaves, committed as a tree of their own with valid proofs:
    refused, the task stays accepted, and once the trainer's commit window has passed the client
    takes its payment back (and the bond of the trainer that did not deliver)."""
    task = env.create_task(LEAVES)
    short = MerkleTree(leaves(n))  # the honest run's first n leaves: every proof verifies
    assert env.reverts(env.commit_fn(task, short), env.trainer) == (
        "LeafCountMismatch",
        (LEAVES, n),
    )
    assert env.task(task).status == ACCEPTED
    env.at(env.task(task).commitBy + 1)
    env.send(env.game.functions.cancel(task), env.client)
    assert env.credit(env.client) == PAYMENT + TRAINER_BOND and env.credit(env.trainer) == 0
    assert env.solvent()


def test_truncatedCommitment_oneLeaf_cannotBePaid(env: Env) -> None:
    """The exploit as the adversarial harness played it: commit N = 1, survive the initial-state
    dispute, finalize. The first move is refused, so nothing after it can happen."""
    task = env.create_task(LEAVES)
    init_only = MerkleTree(leaves(1))
    try:
        env.commit(task, init_only)
    except ContractReverted as refused:  # the fix
        assert (refused.name, refused.args_) == ("LeafCountMismatch", (LEAVES, 1))
    else:  # the old contract: play the rest of the exploit to show what it paid
        game_id = env.challenge(task, env.auditors[0], dispute_init=True)
        env.rule(game_id, init_only.leaf(0))  # leaf 0 is the right initial state
        assert env.game_state(game_id).outcome == TRAINER_WON
        env.at(env.task(task).windowEnds)
        env.finalize(task)
        paid = env.credit(env.trainer)
        pytest.fail(f"a trainer that trained 0 of {STEPS} steps was paid {paid} wei")
    assert env.task(task).status == ACCEPTED and env.credit(env.trainer) == 0


def test_honestCount_accepted_andPaid(env: Env) -> None:
    task = env.create_task(LEAVES)
    assert env.task(task).numLeaves == LEAVES  # fixed at creation, before any commit
    tree = MerkleTree(leaves(LEAVES))
    ev = env.event(env.commit(task, tree), "Committed")
    assert ev["numLeaves"] == LEAVES
    t = env.task(task)
    assert (t.status, t.numLeaves, t.specHash) == (COMMITTED, LEAVES, SPEC)
    # an honest trainer still wins a bisection over its 17 leaves and is paid
    game_id = env.challenge(task, env.auditors[0])
    env.bisect(game_id, tree, leaves(LEAVES, diverge_at=9))
    g = env.game_state(game_id)
    env.rule(game_id, tree.leaf(g.hi))
    assert env.game_state(game_id).outcome == TRAINER_WON
    env.at(env.task(task).windowEnds)
    env.finalize(task)
    assert env.credit(env.trainer) == PAYMENT + TRAINER_BOND + AUDITOR_BOND
    assert env.solvent()
