"""Gas budgets of the dispute (issue #5): per bisection move and for a whole 2^20-leaf dispute.

Gas is deterministic (same bytecode, same calldata), so these are exact checks, not timings.
The measured numbers are logged and quoted in docs/contract.md "Gas".
"""

from __future__ import annotations

import logging

import pytest

from game.merkle import MerkleTree
from tests.contracts.driver import AUDITOR_WON, PINNED, Env, leaves

log = logging.getLogger(__name__)

DEPTH = 20
MOVE_BUDGET = 60_000
DISPUTE_BUDGET = 3_000_000


@pytest.fixture(scope="module")
def big_trees() -> tuple[list[bytes], MerkleTree]:
    """A 2^20-leaf honest run and a trainer that lies from step 777,777 on (about 5 s to build)."""
    n = 2**DEPTH
    return leaves(n), MerkleTree(leaves(n, diverge_at=777_777))


@pytest.mark.embedded_only
def test_dispute_over_2pow20_leaves_withinBudgets(
    env: Env, big_trees: tuple[list[bytes], MerkleTree]
) -> None:
    honest, tree = big_trees
    task = env.create_task(tree.size)
    env.commit(task, tree)
    env.gas_used.clear()
    game_id = env.challenge(task, env.auditors[0])
    challenge_gas = env.gas_used[-1]
    reveals, responds = [], []
    while env.game_state(game_id).phase != PINNED:
        mid = env.mid(game_id)
        reveals.append(int(env.reveal(game_id, tree)["gasUsed"]))
        responds.append(int(env.respond(game_id, tree.leaf(mid) == honest[mid])["gasUsed"]))
    rule_gas = int(env.rule(game_id, honest[777_777])["gasUsed"])
    assert env.game_state(game_id).outcome == AUDITOR_WON and env.game_state(game_id).hi == 777_777
    total = challenge_gas + sum(reveals) + sum(responds) + rule_gas
    summary = (
        f"challenge {challenge_gas}, reveal {min(reveals)}..{max(reveals)}, "
        f"respond {min(responds)}..{max(responds)}, rule {rule_gas}, {len(reveals)} rounds, total {total}"
    )
    log.info("gas of a 2^20-leaf dispute: %s", summary)
    assert len(reveals) == len(responds) <= DEPTH  # at most 2 x 20 bisection transactions + the ruling
    assert max(reveals) <= MOVE_BUDGET, reveals
    assert max(responds) <= MOVE_BUDGET, responds
    assert total <= DISPUTE_BUDGET
