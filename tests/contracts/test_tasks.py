"""Task life cycle: createTask, cancel, commit, finalize, withdraw, and every revert they have."""

from __future__ import annotations

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    AUDITOR_BOND,
    CANCELLED,
    CLOCK,
    COMMITTED,
    FINALIZED,
    JUDGE_WINDOW,
    OPEN,
    PAYMENT,
    SPEC,
    TRAINER_BOND,
    WINDOW,
    Env,
    leaves,
)

ZERO = "0x0000000000000000000000000000000000000000"


def _create(env: Env, **kw: object) -> object:
    args = {
        "spec": SPEC,
        "trainer": env.trainer,
        "judge": env.judge,
        "n": 17,
        "tb": TRAINER_BOND,
        "ab": AUDITOR_BOND,
        "clock": CLOCK,
        "window": WINDOW,
        "jw": JUDGE_WINDOW,
    }
    args.update(kw)
    return env.game.functions.createTask(*args.values())


# ---------------------------------------------------------------- createTask
def test_createTask_storesEverything_andEmits(env: Env) -> None:
    receipt = env.send(_create(env), env.client, PAYMENT)
    ev = env.event(receipt, "TaskCreated")
    assert ev["taskId"] == 1 and env.game.functions.taskCount().call() == 1
    assert (ev["trainer"], ev["judge"], ev["client"]) == (env.trainer, env.judge, env.client)
    assert (ev["payment"], ev["trainerBond"], ev["auditorBond"]) == (PAYMENT, TRAINER_BOND, AUDITOR_BOND)
    assert (ev["clockAllowance"], ev["challengeWindow"], ev["judgeWindow"]) == (CLOCK, WINDOW, JUDGE_WINDOW)
    assert ev["numLeaves"] == 17
    t = env.task(1)
    assert t.status == OPEN and t.client == env.client and t.payment == PAYMENT and t.specHash == SPEC
    assert t.numLeaves == 17 and t.windowEnds == 0 and t.liveGames == 0
    assert env.balance() == PAYMENT
    assert env.create_task(2) == 2


@pytest.mark.parametrize("n", [0, 1, 2**48 + 1, 2**64 - 1])
def test_createTask_leafCountOutOfRange_reverts(env: Env, n: int) -> None:
    """A task trains at least one step (2 leaves: the initial state and one more) and has at most
    MAX_LEAVES = 2^48 leaves."""
    assert env.reverts(_create(env, n=n), env.client, PAYMENT) == ("InvalidLeafCount", (n,))


@pytest.mark.parametrize("n", [2, 2**48])
def test_createTask_leafCountBounds_accepted(env: Env, n: int) -> None:
    task = env.create_task(n)
    assert env.task(task).numLeaves == n


def test_createTask_zeroPayment_reverts(env: Env) -> None:
    assert env.reverts(_create(env), env.client, 0) == ("ZeroPayment", ())


@pytest.mark.parametrize("case", ["zero trainer", "zero judge", "trainer judges"])
def test_createTask_badRoles_revert(env: Env, case: str) -> None:
    trainer, judge = {
        "zero trainer": (ZERO, env.judge),
        "zero judge": (env.trainer, ZERO),
        "trainer judges": (env.trainer, env.trainer),
    }[case]
    fn = _create(env, trainer=trainer, judge=judge)
    assert env.reverts(fn, env.client, PAYMENT) == ("InvalidRoles", (trainer, judge))


@pytest.mark.parametrize(
    "durations", [(0, WINDOW, JUDGE_WINDOW), (CLOCK, 0, JUDGE_WINDOW), (CLOCK, WINDOW, 0)]
)
def test_createTask_zeroDuration_reverts(env: Env, durations: tuple[int, int, int]) -> None:
    clock, window, jw = durations
    fn = _create(env, clock=clock, window=window, jw=jw)
    assert env.reverts(fn, env.client, PAYMENT) == ("InvalidDurations", durations)


def test_views_unknownIds_revert(env: Env) -> None:
    assert env.reverts(env.game.functions.task(1), env.outsider) == ("TaskNotFound", (1,))
    assert env.reverts(env.game.functions.game(0), env.outsider) == ("GameNotFound", (0,))
    assert env.reverts(env.game.functions.clockLeft(7), env.outsider) == ("GameNotFound", (7,))
    assert env.reverts(env.game.functions.deadline(7), env.outsider) == ("GameNotFound", (7,))


# ---------------------------------------------------------------- cancel
def test_cancel_creditsClient(env: Env) -> None:
    task = env.create_task(16)
    receipt = env.send(env.game.functions.cancel(task), env.client)
    assert env.event_names(receipt) == ["TaskCancelled", "Credited"]
    assert env.event(receipt, "Credited")["amount"] == PAYMENT
    assert env.task(task).status == CANCELLED and env.credit(env.client) == PAYMENT


def test_cancel_reverts(env: Env) -> None:
    assert env.reverts(env.game.functions.cancel(9), env.client) == ("TaskNotFound", (9,))
    task = env.create_task(16)
    assert env.reverts(env.game.functions.cancel(task), env.trainer) == (
        "Unauthorized",
        (env.trainer, env.client),
    )
    env.send(env.game.functions.cancel(task), env.client)
    assert env.reverts(env.game.functions.cancel(task), env.client) == ("WrongTaskStatus", (task, CANCELLED))
    committed = env.create_task(4)
    env.commit(committed, MerkleTree(leaves(4)))
    assert env.reverts(env.game.functions.cancel(committed), env.client) == (
        "WrongTaskStatus",
        (committed, COMMITTED),
    )


# ---------------------------------------------------------------- commit
@pytest.mark.parametrize("n", [2, 3, 7, 16])
def test_commit_storesRootsAndEnds_opensWindow(env: Env, n: int) -> None:
    tree = MerkleTree(leaves(n))
    task = env.create_task(n)
    start = env.now() + 5
    env.at(start)
    ev = env.event(env.commit(task, tree), "Committed")
    assert ev["windowEnds"] == start + WINDOW and ev["numLeaves"] == n and ev["stateRoot"] == tree.root
    assert (ev["firstLeaf"], ev["lastLeaf"]) == (tree.leaf(0), tree.leaf(n - 1))
    t = env.task(task)
    assert t.status == COMMITTED and t.stateRoot == tree.root and t.numLeaves == n
    assert (t.firstLeaf, t.lastLeaf, t.windowEnds) == (tree.leaf(0), tree.leaf(n - 1), start + WINDOW)
    assert env.balance() == PAYMENT + TRAINER_BOND


def test_commit_reverts(env: Env) -> None:
    tree = MerkleTree(leaves(5))
    assert env.reverts(env.commit_fn(4, tree), env.trainer, TRAINER_BOND) == ("TaskNotFound", (4,))
    task = env.create_task(5)
    fn = env.commit_fn(task, tree)
    assert env.reverts(fn, env.client, TRAINER_BOND) == ("Unauthorized", (env.client, env.trainer))
    assert env.reverts(fn, env.trainer, TRAINER_BOND - 1) == ("WrongBond", (TRAINER_BOND - 1, TRAINER_BOND))
    assert env.reverts(fn, env.trainer, TRAINER_BOND + 1) == ("WrongBond", (TRAINER_BOND + 1, TRAINER_BOND))
    # any leaf count but the task's is refused, before the proofs are looked at
    for n in (0, 1, 4, 6, 9, 2**48 + 1):
        wrong = env.commit_fn(task, tree, num_leaves=n)
        assert env.reverts(wrong, env.trainer, TRAINER_BOND) == ("LeafCountMismatch", (5, n))
    # the task's size, but proofs of another tree size: the first leaf's proof fails
    other = MerkleTree(leaves(9))
    mismatched = env.game.functions.commit(
        task,
        other.root,
        b"\x01" * 32,
        5,
        b"\x02" * 32,
        other.leaf(0),
        list(other.proof(0).siblings),
        other.leaf(8),
        list(other.proof(8).siblings),
    )
    assert env.reverts(mismatched, env.trainer, TRAINER_BOND)[0] == "InvalidProof"
    # a wrong last leaf
    bad_last = env.game.functions.commit(
        task,
        tree.root,
        b"\x01" * 32,
        5,
        b"\x02" * 32,
        tree.leaf(0),
        list(tree.proof(0).siblings),
        tree.leaf(3),
        list(tree.proof(4).siblings),
    )
    assert env.reverts(bad_last, env.trainer, TRAINER_BOND) == ("InvalidProof", (4, tree.leaf(3)))
    bad_first = env.game.functions.commit(
        task,
        tree.root,
        b"\x01" * 32,
        5,
        b"\x02" * 32,
        tree.leaf(1),
        list(tree.proof(0).siblings),
        tree.leaf(4),
        list(tree.proof(4).siblings),
    )
    assert env.reverts(bad_first, env.trainer, TRAINER_BOND) == ("InvalidProof", (0, tree.leaf(1)))
    env.commit(task, tree)
    assert env.reverts(fn, env.trainer, TRAINER_BOND) == ("WrongTaskStatus", (task, COMMITTED))
    cancelled = env.create_task(5)
    env.send(env.game.functions.cancel(cancelled), env.client)
    assert env.reverts(env.commit_fn(cancelled, tree), env.trainer, TRAINER_BOND) == (
        "WrongTaskStatus",
        (cancelled, CANCELLED),
    )


# ---------------------------------------------------------------- finalize
def test_finalize_noChallenge_paysTrainer(env: Env) -> None:
    """Invariant 1: an unchallenged honest trainer is paid the payment and gets its bond back."""
    task = env.create_task(6)
    env.commit(task, MerkleTree(leaves(6)))
    env.at(env.task(task).windowEnds)
    receipt = env.finalize(task)
    assert env.event(receipt, "TaskFinalized")["trainerPaid"] is True
    assert env.task(task).status == FINALIZED
    assert env.credit(env.trainer) == PAYMENT + TRAINER_BOND and env.credit(env.client) == 0
    assert env.balance() == env.credits()


def test_finalize_reverts(env: Env) -> None:
    assert env.reverts(env.game.functions.finalize(3), env.outsider) == ("TaskNotFound", (3,))
    task = env.create_task(6)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == ("WrongTaskStatus", (task, OPEN))
    env.commit(task, MerkleTree(leaves(6)))
    ends = env.task(task).windowEnds
    env.at(ends - 1)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == ("WindowOpen", (task, ends))
    env.challenge(task, env.auditors[0])
    env.at(ends)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == ("GamesLive", (task, 1))


def test_finalize_twice_reverts(env: Env) -> None:
    task = env.create_task(2)
    env.commit(task, MerkleTree(leaves(2)))
    env.at(env.task(task).windowEnds)
    env.finalize(task)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == (
        "WrongTaskStatus",
        (task, FINALIZED),
    )


# ---------------------------------------------------------------- withdraw
def test_withdraw_paysOnce(env: Env) -> None:
    task = env.create_task(16)
    env.send(env.game.functions.cancel(task), env.client)
    before = env.w3.eth.get_balance(env.client)
    receipt = env.send(env.game.functions.withdraw(), env.client)
    assert env.event(receipt, "Withdrawn")["amount"] == PAYMENT
    fee = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert env.w3.eth.get_balance(env.client) == before + PAYMENT - fee
    assert env.credit(env.client) == 0 and env.balance() == 0
    assert env.reverts(env.game.functions.withdraw(), env.client) == ("NothingToWithdraw", (env.client,))


def test_withdraw_receiverReverts_keepsCredit(env: Env) -> None:
    rejecter = env.rejecter
    env.send(rejecter.functions.createAndCancel(env.game.address, env.trainer, env.judge), env.client, 5)
    assert env.credit(rejecter.address) == 5
    assert env.reverts(rejecter.functions.withdrawFrom(env.game.address), env.client) == (
        "TransferFailed",
        (rejecter.address, 5),
    )
    assert env.credit(rejecter.address) == 5 and env.balance() == 5
