"""A receiver that calls back into the game from its ``receive`` (contracts/Reenterer.sol).

``withdraw`` zeroes the credit before it sends (checks-effects-interactions), so a re-entering
receiver cannot be paid a credit twice, and whatever else it does mid-transfer (cancel, create a
task with the ether just received, challenge, finalize) leaves the books balanced: the contract's
balance is exactly what it escrows plus every credit, and the receiver gets exactly what it is owed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import (
    AUDITOR_BOND,
    CANCELLED,
    CLOCK,
    COMMIT_WINDOW,
    FINALIZED,
    JUDGE_WINDOW,
    KEY_HASH,
    OPEN,
    PAYMENT,
    SPEC,
    TRAINER_BOND,
    WINDOW,
    Env,
    leaves,
)


def _data(fn: Any) -> bytes:
    return bytes.fromhex(fn._encode_transaction_data()[2:])


def _as_reenterer(env: Env, fn: Any, value: int = 0) -> Any:
    """Call ``fn`` on the game with the re-entering contract as ``msg.sender`` (sent by the client)."""
    return env.send(env.reenterer.functions.forward(env.game.address, _data(fn)), env.client, value)


def _create_task(env: Env) -> Any:
    return env.game.functions.createTask(
        SPEC,
        KEY_HASH,
        env.trainer,
        env.judge,
        16,
        TRAINER_BOND,
        AUDITOR_BOND,
        CLOCK,
        WINDOW,
        JUDGE_WINDOW,
        COMMIT_WINDOW,
    )


def _own_task(env: Env) -> int:
    """A task whose client is the re-entering contract; returns its id."""
    _as_reenterer(env, _create_task(env), PAYMENT)
    return int(env.game.functions.taskCount().call())


def _credit_reenterer(env: Env) -> int:
    """Give the re-entering contract a credit of PAYMENT (a cancelled task of its own)."""
    task = _own_task(env)
    _as_reenterer(env, env.game.functions.cancel(task))
    assert env.credit(env.reenterer.address) == PAYMENT
    return task


def _arm(env: Env, fn: Any, value: int = 0, times: int = 1) -> None:
    env.send(env.reenterer.functions.arm(env.game.address, _data(fn), value, times), env.client)


def _attempts(env: Env) -> list[tuple[bool, tuple[str, tuple[Any, ...]] | None]]:
    out: list[tuple[bool, tuple[str, tuple[Any, ...]] | None]] = []
    for i in range(env.reenterer.functions.attemptCount().call()):
        ok, ret = env.reenterer.functions.attempt(i).call()
        out.append((ok, None if ok else env.errors.decode(bytes(ret))))
    return out


def _received(env: Env) -> tuple[int, int]:
    r = env.reenterer.functions
    return int(r.received().call()), int(r.receipts().call())


def _solvent(env: Env) -> None:
    assert env.solvent()


def test_withdraw_reentered_paysTheCreditOnce(env: Env) -> None:
    """The receiver re-enters withdraw on every receipt; it gets its credit once and no more, while
    the contract holds other people's money it could have taken (another client's payment)."""
    env.create_task(16, accept=False)  # someone else's escrow: a double payment would have ether to take
    _credit_reenterer(env)
    _arm(env, env.game.functions.withdraw(), times=5)
    receipt = _as_reenterer(env, env.game.functions.withdraw())
    assert env.event(receipt, "Withdrawn")["amount"] == PAYMENT
    assert _received(env) == (PAYMENT, 1)
    assert _attempts(env) == [(False, ("NothingToWithdraw", (env.reenterer.address,)))]
    assert env.credit(env.reenterer.address) == 0
    assert env.w3.eth.get_balance(env.reenterer.address) == PAYMENT
    assert env.balance() == PAYMENT  # the other client's payment, untouched
    _solvent(env)
    assert env.reverts(
        env.reenterer.functions.forward(env.game.address, _data(env.game.functions.withdraw())), env.client
    ) == ("NothingToWithdraw", (env.reenterer.address,))


def _committed(env: Env, n: int = 9) -> tuple[int, MerkleTree]:
    tree = MerkleTree(leaves(n))
    task = env.create_task(n)
    env.commit(task, tree)
    return task, tree


def _reentry_cancel(env: Env) -> tuple[Any, int, Callable[[], None]]:
    """Mid-transfer, cancel another open task of its own: credited (owed) and paid by a later withdraw."""
    task = _own_task(env)

    def check() -> None:
        assert env.task(task).status == CANCELLED
        assert env.credit(env.reenterer.address) == PAYMENT

    return env.game.functions.cancel(task), 0, check


def _reentry_create(env: Env) -> tuple[Any, int, Callable[[], None]]:
    """Mid-transfer, escrow the ether just received in a new task of its own."""

    def check() -> None:
        task = int(env.game.functions.taskCount().call())
        t = env.task(task)
        assert t.status == OPEN and t.client == env.reenterer.address and t.payment == PAYMENT

    return _create_task(env), PAYMENT, check


def _reentry_challenge(env: Env) -> tuple[Any, int, Callable[[], None]]:
    """Mid-transfer, challenge a committed task with part of the ether just received."""
    task, _ = _committed(env)

    def check() -> None:
        g = env.game_state(int(env.game.functions.gameCount().call()))
        assert g.auditor == env.reenterer.address and g.taskId == task
        assert env.task(task).liveGames == 1

    return env.game.functions.challenge(task, False), AUDITOR_BOND, check


def _reentry_finalize(env: Env) -> tuple[Any, int, Callable[[], None]]:
    """Mid-transfer, finalize a task whose window is over: the trainer is credited, nothing else."""
    task, _ = _committed(env)
    env.at(env.task(task).windowEnds + 1)

    def check() -> None:
        assert env.task(task).status == FINALIZED
        assert env.credit(env.trainer) == PAYMENT + TRAINER_BOND

    return env.game.functions.finalize(task), 0, check


REENTRIES = {
    "cancel": _reentry_cancel,
    "createTask": _reentry_create,
    "challenge": _reentry_challenge,
    "finalize": _reentry_finalize,
}


@pytest.mark.parametrize("name", sorted(REENTRIES))
def test_withdraw_reenteredWithOtherCalls_booksBalance(env: Env, name: str) -> None:
    """Other state-changing calls from inside the transfer take effect like any call would, and the
    receiver ends up with exactly what it put in or was owed, never more."""
    _credit_reenterer(env)
    fn, value, check = REENTRIES[name](env)
    _arm(env, fn, value)
    balance_before = env.balance()
    _as_reenterer(env, env.game.functions.withdraw())
    assert _attempts(env) == [(True, None)]
    check()
    assert env.balance() == balance_before - PAYMENT + value
    _solvent(env)
    # Whatever the re-entry credited it is paid once by a plain withdraw, then nothing more.
    owed = env.credit(env.reenterer.address)
    if owed:
        _as_reenterer(env, env.game.functions.withdraw())
    assert _received(env) == (PAYMENT + owed, 2 if owed else 1)
    assert env.w3.eth.get_balance(env.reenterer.address) == PAYMENT + owed - value
    assert env.credit(env.reenterer.address) == 0
    _solvent(env)


def test_reenterer_asWinningAuditor_withdrawsItsWinningsOnce(env: Env) -> None:
    """A re-entering auditor that wins a game (the trainer times out) takes its bond, then its
    reward, each once, re-entering claimReward as well, and the task still settles for the client."""
    task, _ = _committed(env)
    receipt = _as_reenterer(env, env.game.functions.challenge(task, False), AUDITOR_BOND)
    game_id = int(env.event(receipt, "Challenged")["gameId"])
    env.at(env.deadline(game_id) + 1)
    env.timeout(game_id)
    assert env.credit(env.reenterer.address) == AUDITOR_BOND
    _arm(env, env.game.functions.withdraw(), times=3)
    _as_reenterer(env, env.game.functions.withdraw())
    assert _received(env) == (AUDITOR_BOND, 1)
    assert _attempts(env) == [(False, ("NothingToWithdraw", (env.reenterer.address,)))]
    env.at(env.task(task).windowEnds + 1)
    env.finalize(task)
    share = env.reward_share(task)
    assert env.credit(env.client) == PAYMENT + (TRAINER_BOND - TRAINER_BOND // 2 - share)
    env.claim_reward(game_id)
    _arm(env, env.game.functions.claimReward(game_id), times=2)
    _as_reenterer(env, env.game.functions.withdraw())
    assert _received(env) == (AUDITOR_BOND + share, 2)
    assert _attempts(env)[1:] == [(False, ("RewardAlreadyClaimed", (game_id,)))]
    assert env.credit(env.reenterer.address) == 0
    _solvent(env)
    assert env.task(task).status == FINALIZED
