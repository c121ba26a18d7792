"""Pure decisions of the verification game: game state in, next move out.

Why a separate module: deciding is separate from sending (Optimism's op-challenger splits
``solver/`` from ``responder/``). Everything here is a pure function of on-chain state and the
party's own leaves, imports neither torch nor web3, and is what the protocol tests exercise with a
toy step function. The agents (``trainer_node``, ``auditor_node``) only turn these decisions into
transactions.

Leaf ``i`` is the state hash after step ``i`` (leaf 0: initialisation); see ``docs/contract.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from game.chain.types import Game, Phase
from game.errors import VGameError
from game.merkle import MerkleTree


class ProtocolError(VGameError, ValueError):
    """A decision was asked for in a state where the party has no move, or inputs disagree."""


@dataclass(frozen=True)
class Challenge:
    """The auditor's opening: whether to challenge at all, and whether the initial state is disputed."""

    challenge: bool
    dispute_init: bool
    first_divergent_leaf: int | None


@dataclass(frozen=True)
class Reveal:
    """The trainer's bisection move: leaf ``index`` with its inclusion proof."""

    index: int
    leaf: bytes
    proof: tuple[bytes, ...]


def first_divergence(theirs: Sequence[bytes], ours: Sequence[bytes]) -> int | None:
    """Index of the first leaf where the two lists differ (None when equal)."""
    if len(theirs) != len(ours):
        n = min(len(theirs), len(ours))
        for i in range(n):
            if theirs[i] != ours[i]:
                return i
        return n
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        if a != b:
            return i
    return None


def decide_challenge(
    first_leaf: bytes, last_leaf: bytes, num_leaves: int, own_leaves: Sequence[bytes]
) -> Challenge:
    """An honest auditor's opening move from the committed endpoints and its own replay.

    It challenges only when the committed final state differs from its own (a trainer whose final
    state is right but whose path is not cannot be pinned by bisection and has harmed no one), or
    when the initial state differs (then the dispute is the initialisation itself).
    """
    if len(own_leaves) != num_leaves:
        raise ProtocolError(f"own replay has {len(own_leaves)} leaves, the commitment has {num_leaves}")
    if own_leaves[0] != first_leaf:
        return Challenge(True, True, 0)
    if own_leaves[-1] == last_leaf:
        return Challenge(False, False, None)
    return Challenge(True, False, None)


def decide_response(game: Game, own_leaves: Sequence[bytes]) -> bool:
    """An honest auditor agrees with the revealed leaf exactly when it equals its own."""
    if game.phase != Phase.AWAITING_RESPONSE:
        raise ProtocolError(f"the auditor has no move in phase {game.phase.name}")
    return own_leaves[game.mid] == game.mid_leaf


def decide_reveal(game: Game, tree: MerkleTree) -> Reveal:
    """The trainer reveals its leaf at the midpoint of the disputed interval, with a proof."""
    if game.phase != Phase.AWAITING_REVEAL:
        raise ProtocolError(f"the trainer has no move in phase {game.phase.name}")
    mid = game.mid
    proof = tree.proof(mid)
    return Reveal(mid, tree.leaf(mid), proof.siblings)


def pinned_step(game: Game) -> int:
    """The step the judge must re-run: the post-state is leaf ``hi`` (0 means initialisation)."""
    if game.phase != Phase.PINNED:
        raise ProtocolError(f"game is in phase {game.phase.name}, not pinned")
    return game.hi


def moves_needed(num_leaves: int) -> int:
    """Bisection rounds (each a reveal and a response) for a dispute over ``num_leaves`` leaves."""
    span = num_leaves - 1
    rounds = 0
    while span > 1:
        span = (span + 1) // 2
        rounds += 1
    return rounds
