"""Issue 44, exploit 2 (self-challenge bond recovery): a caught liar cannot buy its bond back through
a sybil auditor, and the honest auditor who caught it is rewarded whichever game ends first.

Before the fix, the first game to end AuditorWon took the whole trainer's bond. A trainer caught by
an honest auditor opened a game with its own sybil and lost that one first (it moves at once there,
and stalls in the honest game): the sybil got the trainer's bond, the honest auditor only its own bond
back. Catching a cheat earned nothing, so nobody had a reason to audit.

The rule now (docs/contract.md "Money"): the trainer's bond is settled at ``finalize``, never when a
game ends; half is burnt; every AuditorWon game claims an equal share of the rest, at most one auditor
bond each; the client gets what the shares leave. So the order of endings pays nobody, a self-challenge
always costs the liar at least half its bond, and the honest auditor's share equals every sybil's.
"""

from __future__ import annotations

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import AUDITOR_BOND, AUDITOR_WON, PAYMENT, TRAINER_BOND, Env, leaves

N, S = 12, 7  # the trainer lies from step S on


def _pool() -> int:
    return TRAINER_BOND - TRAINER_BOND // 2


def _win(env: Env, game_id: int, tree: MerkleTree, honest: list[bytes]) -> None:
    """Play ``game_id`` as an honest auditor would, to the judge's ruling against the liar."""
    env.bisect(game_id, tree, honest)
    assert env.game_state(game_id).hi == S
    env.rule(game_id, honest[S])
    assert env.game_state(game_id).outcome == AUDITOR_WON


def _settle(env: Env, task: int, games: list[int]) -> None:
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    assert env.event(env.finalize(task), "TaskFinalized")["trainerPaid"] is False
    for game_id in games:
        env.claim_reward(game_id)


@pytest.mark.parametrize("sybils", [1, 3])
def test_selfChallenge_sybilLosesFirst_honestAuditorPaidAsMuchAsAnySybil(env: Env, sybils: int) -> None:
    """The exploit as the adversarial harness played it: the honest auditor challenges first, the
    liar opens games with its sybils and loses those first. The honest auditor is paid its bond and a
    share equal to each sybil's; the liar and its sybils together lose at least half the bond."""
    honest_leaves = leaves(N)
    tree = MerkleTree(leaves(N, diverge_at=S))
    task = env.create_task(N)
    env.commit(task, tree)
    honest_auditor, sybil_accounts = env.auditors[0], env.auditors[1 : 1 + sybils]
    honest_game = env.challenge(task, honest_auditor)  # first in, by the contract's own count
    sybil_games = [env.challenge(task, s) for s in sybil_accounts]
    for game_id in sybil_games:  # the liar loses to its sybils before the honest game ends
        _win(env, game_id, tree, honest_leaves)
    _win(env, honest_game, tree, honest_leaves)
    _settle(env, task, [honest_game, *sybil_games])

    honest_gain = env.credit(honest_auditor) - AUDITOR_BOND
    sybil_gains = [env.credit(s) - AUDITOR_BOND for s in sybil_accounts]
    coalition_loss = TRAINER_BOND - sum(sybil_gains)  # what the liar and its sybils lost, gas aside
    assert honest_gain > 0, f"the honest auditor who caught the liar gained {honest_gain} wei"
    assert all(g == honest_gain for g in sybil_gains), (
        f"the honest auditor gained {honest_gain} wei, its {sybils} sybil(s) {sybil_gains}: "
        "the liar's sybils were paid ahead of the auditor who caught it"
    )
    assert honest_gain == min(AUDITOR_BOND, _pool() // (sybils + 1))
    assert coalition_loss >= TRAINER_BOND // 2 + honest_gain, (
        f"the liar and its sybils lost {coalition_loss} wei of a {TRAINER_BOND} wei bond"
    )
    assert env.credit(env.trainer) == 0 and env.burnt() == TRAINER_BOND // 2
    assert env.credit(env.client) == PAYMENT + _pool() - (sybils + 1) * honest_gain
    assert env.solvent()


@pytest.mark.parametrize("honest_ends", ["first", "last"])
def test_orderOfEndings_changesNobodysPay(env: Env, honest_ends: str) -> None:
    """Two winning games: each auditor's pay is the same whichever game the trainer lets end first."""
    honest_leaves = leaves(N)
    tree = MerkleTree(leaves(N, diverge_at=S))
    task = env.create_task(N)
    env.commit(task, tree)
    a, b = env.auditors[:2]
    ga, gb = env.challenge(task, a), env.challenge(task, b)
    for game_id in (ga, gb) if honest_ends == "first" else (gb, ga):
        _win(env, game_id, tree, honest_leaves)
    _settle(env, task, [ga, gb])
    share = min(AUDITOR_BOND, _pool() // 2)
    assert env.credit(a) == env.credit(b) == AUDITOR_BOND + share
    assert env.solvent()


def test_aloneTheHonestAuditorDoublesItsBond_andTheClientGetsTheRest(env: Env) -> None:
    """No sybil: the auditor's share is a whole auditor bond (the bond is at least twice that here),
    the client gets the payment and what is left of the unburnt half."""
    honest_leaves = leaves(N)
    tree = MerkleTree(leaves(N, diverge_at=S))
    task = env.create_task(N, trainer_bond=5 * AUDITOR_BOND)
    env.commit(task, tree)
    game_id = env.challenge(task, env.auditors[0])
    _win(env, game_id, tree, honest_leaves)
    _settle(env, task, [game_id])
    bond = 5 * AUDITOR_BOND
    assert env.credit(env.auditors[0]) == 2 * AUDITOR_BOND
    assert env.credit(env.client) == PAYMENT + (bond - bond // 2 - AUDITOR_BOND)
    assert env.burnt() == bond // 2 and env.solvent()


def test_claimReward_reverts(env: Env) -> None:
    honest_leaves = leaves(N)
    tree = MerkleTree(leaves(N, diverge_at=S))
    task = env.create_task(N)
    env.commit(task, tree)
    claim = env.game.functions.claimReward
    assert env.reverts(claim(1), env.outsider) == ("GameNotFound", (1,))
    game_id = env.challenge(task, env.auditors[0])
    assert env.reverts(claim(game_id), env.outsider) == ("NoReward", (game_id, 0))  # live: no outcome yet
    _win(env, game_id, tree, honest_leaves)
    assert env.reverts(claim(game_id), env.outsider) == ("WrongTaskStatus", (task, 3))  # not settled
    _settle(env, task, [game_id])
    assert env.reverts(claim(game_id), env.auditors[0]) == ("RewardAlreadyClaimed", (game_id,))
    assert env.game_state(game_id).rewardClaimed
