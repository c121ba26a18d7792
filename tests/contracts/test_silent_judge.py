"""Issue 44, exploit 3 (the client's own judge voids honest work): a judge that stays silent cannot
hand the client free training.

Before the fix, a void game (the judge's deadline passed) cost the trainer the payment: the client
named a judge it controlled, challenged its own task, the judge stayed silent, the game ended void,
and ``finalize`` gave the client its payment back while the honest trainer, who had done the work,
got only its bond.

The rule now (docs/contract.md "Money"): a void game shows no fault on either side, so it neither
pays nor stops the trainer. The trainer's leaves were never shown wrong, and the judge is the client's
choice, so the judge's silence is the client's risk: the auditor gets its bond back and the trainer is
paid as if the game had not been played.
"""

from __future__ import annotations

from game.merkle import MerkleTree
from tests.contracts.driver import AUDITOR_BOND, JUDGE_TIMEOUT, PAYMENT, TRAINER_BOND, VOID, Env, leaves

N = 9


def _silent_judge_game(env: Env, tree: MerkleTree, auditor_leaves: list[bytes]) -> tuple[int, int]:
    """The client challenges its own committed task; the game is pinned; the judge stays silent
    past its deadline and the client voids the game. Returns (task, game)."""
    task = env.create_task(N)
    env.commit(task, tree)
    game_id = env.challenge(task, env.client)  # the client may audit its own task
    env.bisect(game_id, tree, auditor_leaves)
    env.at(env.deadline(game_id) + 1)  # the client's judge says nothing
    ev = env.event(env.timeout(game_id, caller=env.client), "GameEnded")
    assert (ev["outcome"], ev["reason"]) == (VOID, JUDGE_TIMEOUT)
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    return task, game_id


def test_clientsSilentJudge_voidsTheGame_honestTrainerStillPaid(env: Env) -> None:
    """The exploit as the adversarial harness played it: an honest trainer, the client challenging
    with made-up leaves, its judge silent. The trainer is paid; the client gets its bond back only."""
    tree = MerkleTree(leaves(N))  # honest work
    made_up = leaves(N, tag="made up", diverge_at=1)
    task, _ = _silent_judge_game(env, tree, made_up)
    trainer_paid = env.event(env.finalize(task), "TaskFinalized")["trainerPaid"]
    client_credit = env.credit(env.client)
    assert trainer_paid and env.credit(env.trainer) == PAYMENT + TRAINER_BOND, (
        f"the honest trainer was credited {env.credit(env.trainer)} wei; the client, whose judge stayed "
        f"silent, {client_credit} wei (its payment was {PAYMENT})"
    )
    assert client_credit == AUDITOR_BOND  # its own auditor bond, nothing of the payment
    assert env.task(task).anyVoid and not env.task(task).trainerLost
    assert env.solvent() and env.burnt() == 0


def test_silentJudge_cannotShowALiarWrongEither_theClientsRisk(env: Env) -> None:
    """The trust that remains: the judge is trusted for liveness by the client that named it. A
    silent judge cannot show a lying trainer wrong either, so the task settles as if the void game
    had not been played (docs/contract.md "Trust assumptions")."""
    liar = MerkleTree(leaves(N, diverge_at=4))
    task, _ = _silent_judge_game(env, liar, leaves(N))
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is True
    assert env.credit(env.client) == AUDITOR_BOND and env.solvent()
