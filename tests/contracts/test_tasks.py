"""Task life cycle: createTask, accept, cancel, commit, finalize, withdraw, and every revert they have."""

from __future__ import annotations

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    ACCEPTED,
    AUDITOR_BOND,
    CANCELLED,
    CLOCK,
    COMMIT_WINDOW,
    COMMITTED,
    FINALIZED,
    JUDGE_WINDOW,
    KEY_HASH,
    MAX_DURATION,
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
        "key": KEY_HASH,
        "trainer": env.trainer,
        "judge": env.judge,
        "n": 17,
        "tb": TRAINER_BOND,
        "ab": AUDITOR_BOND,
        "clock": CLOCK,
        "window": WINDOW,
        "jw": JUDGE_WINDOW,
        "cw": COMMIT_WINDOW,
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
    assert (ev["numLeaves"], ev["keyHash"], ev["commitWindow"]) == (17, KEY_HASH, COMMIT_WINDOW)
    t = env.task(1)
    assert t.status == OPEN and t.client == env.client and t.payment == PAYMENT and t.specHash == SPEC
    assert t.numLeaves == 17 and t.windowEnds == 0 and t.liveGames == 0
    assert (t.keyHash, t.commitWindow, t.commitBy, t.auditorWins) == (KEY_HASH, COMMIT_WINDOW, 0, 0)
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
    "durations",
    [
        (0, WINDOW, JUDGE_WINDOW, COMMIT_WINDOW),
        (CLOCK, 0, JUDGE_WINDOW, COMMIT_WINDOW),
        (CLOCK, WINDOW, 0, COMMIT_WINDOW),
        (CLOCK, WINDOW, JUDGE_WINDOW, 0),
        (MAX_DURATION + 1, WINDOW, JUDGE_WINDOW, COMMIT_WINDOW),
        (CLOCK, MAX_DURATION + 1, JUDGE_WINDOW, COMMIT_WINDOW),
        (CLOCK, WINDOW, MAX_DURATION + 1, COMMIT_WINDOW),
        (CLOCK, WINDOW, JUDGE_WINDOW, MAX_DURATION + 1),
        (2**32 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1),  # about 136 years each: the finding
    ],
)
def test_createTask_durationOutOfBounds_reverts(env: Env, durations: tuple[int, int, int, int]) -> None:
    """Every clock and window is 1 s to MAX_DURATION (30 days): a silent party holds the money for
    months at most, never for about 136 years."""
    clock, window, jw, cw = durations
    fn = _create(env, clock=clock, window=window, jw=jw, cw=cw)
    assert env.reverts(fn, env.client, PAYMENT) == ("InvalidDurations", durations)


def test_createTask_durationBounds_accepted(env: Env) -> None:
    assert env.game.functions.MAX_DURATION().call() == MAX_DURATION == 30 * 86_400
    for d in (1, MAX_DURATION):
        env.send(_create(env, clock=d, window=d, jw=d, cw=d), env.client, PAYMENT)


@pytest.mark.parametrize("bonds", [(0, AUDITOR_BOND), (TRAINER_BOND, 0), (0, 0)])
def test_createTask_zeroBond_reverts(env: Env, bonds: tuple[int, int]) -> None:
    """A zero bond makes a false claim free: a free challenge costs an honest trainer a game."""
    fn = _create(env, tb=bonds[0], ab=bonds[1])
    assert env.reverts(fn, env.client, PAYMENT) == ("InvalidBonds", bonds)
    env.send(_create(env, tb=1, ab=1), env.client, PAYMENT)  # 1 wei each is a bond


def test_views_unknownIds_revert(env: Env) -> None:
    assert env.reverts(env.game.functions.task(1), env.outsider) == ("TaskNotFound", (1,))
    assert env.reverts(env.game.functions.game(0), env.outsider) == ("GameNotFound", (0,))
    assert env.reverts(env.game.functions.clockLeft(7), env.outsider) == ("GameNotFound", (7,))
    assert env.reverts(env.game.functions.deadline(7), env.outsider) == ("GameNotFound", (7,))


# ---------------------------------------------------------------- accept
def test_accept_locksTask_postsBond_startsCommitWindow(env: Env) -> None:
    task = env.create_task(16, accept=False)
    start = env.now() + 3
    env.at(start)
    receipt = env.accept(task)
    assert env.event_names(receipt) == ["TaskAccepted"]
    assert env.event(receipt, "TaskAccepted")["commitBy"] == start + COMMIT_WINDOW
    t = env.task(task)
    assert (t.status, t.commitBy) == (ACCEPTED, start + COMMIT_WINDOW)
    assert env.balance() == PAYMENT + TRAINER_BOND


def test_accept_reverts(env: Env) -> None:
    accept = env.game.functions.accept
    assert env.reverts(accept(5), env.trainer, TRAINER_BOND) == ("TaskNotFound", (5,))
    task = env.create_task(16, accept=False)
    assert env.reverts(accept(task), env.client, TRAINER_BOND) == ("Unauthorized", (env.client, env.trainer))
    for sent in (0, TRAINER_BOND - 1, TRAINER_BOND + 1):
        assert env.reverts(accept(task), env.trainer, sent) == ("WrongBond", (sent, TRAINER_BOND))
    env.accept(task)
    assert env.reverts(accept(task), env.trainer, TRAINER_BOND) == ("WrongTaskStatus", (task, ACCEPTED))
    cancelled = env.create_task(16, accept=False)
    env.send(env.game.functions.cancel(cancelled), env.client)
    assert env.reverts(accept(cancelled), env.trainer, TRAINER_BOND) == (
        "WrongTaskStatus",
        (cancelled, CANCELLED),
    )


# ---------------------------------------------------------------- cancel
def test_cancel_open_creditsClient(env: Env) -> None:
    task = env.create_task(16, accept=False)
    receipt = env.send(env.game.functions.cancel(task), env.client)
    assert env.event_names(receipt) == ["TaskCancelled", "Credited"]
    assert env.event(receipt, "Credited")["amount"] == PAYMENT
    assert env.task(task).status == CANCELLED and env.credit(env.client) == PAYMENT


def test_cancel_afterAccept_refusedWhileTrainerMayCommit(env: Env) -> None:
    """Issue 44: once the trainer accepted (before training), the client cannot take the task back
    and front-run the commit of work already done, until the commit window has passed."""
    task = env.create_task(4)
    commit_by = env.task(task).commitBy
    cancel = env.game.functions.cancel(task)
    assert env.reverts(cancel, env.client) == ("CommitWindowOpen", (task, commit_by))
    env.at(commit_by)  # the last second the trainer may commit: still refused
    assert env.reverts(cancel, env.client) == ("CommitWindowOpen", (task, commit_by))
    env.commit(task, MerkleTree(leaves(4)))
    assert env.task(task).status == COMMITTED


def test_cancel_afterCommitWindow_creditsPaymentAndTrainerBond(env: Env) -> None:
    """A trainer that accepted and did not commit in time forfeits its bond to the client."""
    task = env.create_task(4)
    commit_by = env.task(task).commitBy
    env.at(commit_by + 1)
    assert env.reverts(env.commit_fn(task, MerkleTree(leaves(4))), env.trainer) == (
        "CommitWindowClosed",
        (task, commit_by),
    )
    assert env.reverts(env.game.functions.cancel(task), env.trainer) == (
        "Unauthorized",
        (env.trainer, env.client),
    )
    receipt = env.send(env.game.functions.cancel(task), env.client)
    assert env.event(receipt, "Credited")["amount"] == PAYMENT + TRAINER_BOND
    assert env.task(task).status == CANCELLED and env.credit(env.trainer) == 0
    assert env.solvent() and env.balance() == PAYMENT + TRAINER_BOND


def test_cancel_reverts(env: Env) -> None:
    assert env.reverts(env.game.functions.cancel(9), env.client) == ("TaskNotFound", (9,))
    task = env.create_task(16, accept=False)
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
    assert env.balance() == PAYMENT + TRAINER_BOND  # the bond came with the accept


def test_commit_reverts(env: Env) -> None:
    tree = MerkleTree(leaves(5))
    assert env.reverts(env.commit_fn(4, tree), env.trainer) == ("TaskNotFound", (4,))
    task = env.create_task(5, accept=False)
    fn = env.commit_fn(task, tree)
    # a trainer that did not accept (and bond) cannot commit: the client could still cancel
    assert env.reverts(fn, env.trainer) == ("WrongTaskStatus", (task, OPEN))
    env.accept(task)
    assert env.reverts(fn, env.client) == ("Unauthorized", (env.client, env.trainer))
    # any leaf count but the task's is refused, before the proofs are looked at
    for n in (0, 1, 4, 6, 9, 2**48 + 1):
        wrong = env.commit_fn(task, tree, num_leaves=n)
        assert env.reverts(wrong, env.trainer) == ("LeafCountMismatch", (5, n))
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
    assert env.reverts(mismatched, env.trainer)[0] == "InvalidProof"
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
    assert env.reverts(bad_last, env.trainer) == ("InvalidProof", (4, tree.leaf(3)))
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
    assert env.reverts(bad_first, env.trainer) == ("InvalidProof", (0, tree.leaf(1)))
    env.commit(task, tree)
    assert env.reverts(fn, env.trainer) == ("WrongTaskStatus", (task, COMMITTED))
    cancelled = env.create_task(5, accept=False)
    env.send(env.game.functions.cancel(cancelled), env.client)
    assert env.reverts(env.commit_fn(cancelled, tree), env.trainer) == (
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
    task = env.create_task(6, accept=False)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == ("WrongTaskStatus", (task, OPEN))
    env.accept(task)
    assert env.reverts(env.game.functions.finalize(task), env.outsider) == (
        "WrongTaskStatus",
        (task, ACCEPTED),
    )
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
    task = env.create_task(16, accept=False)
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
