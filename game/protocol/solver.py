"""The solver: every role's next move as a pure function of chain state and its own data.

Why a separate module: deciding is separate from sending (Optimism's op-challenger splits
``solver/`` from ``responder/``). Everything here is a pure function of the on-chain snapshots
(:mod:`game.chain.types`), the latest block's time, and the party's own leaves or tree; it imports
neither torch nor web3, and is what the protocol tests exercise with a toy step function. The
agents (``trainer_node``, ``auditor_node``, :mod:`game.judge`, :mod:`game.tasks`) ask it for a
move and only turn the small frozen value it returns into a transaction; every time rule they
need comes from :mod:`game.clock`.

Leaf ``i`` is the state hash after step ``i`` (leaf 0: initialisation); see ``docs/contract.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from game import clock
from game.chain.types import Game, Phase, Task, TaskStatus
from game.errors import VGameError
from game.merkle import MerkleTree


class ProtocolError(VGameError, ValueError):
    """A decision was asked for in a state where the party has no move, or inputs disagree."""


# ------------------------------------------------------------------------------ the moves
@dataclass(frozen=True)
class Challenge:
    """The auditor's opening: whether to challenge at all, and whether the initial state is disputed.

    ``dispute_init`` says how a challenge is opened: against the initialisation when leaf 0
    differs, and always over a single leaf (nothing to bisect; the contract refuses a bisection).
    """

    challenge: bool
    dispute_init: bool
    first_divergent_leaf: int | None


@dataclass(frozen=True)
class Reveal:
    """The trainer's bisection move: leaf ``index`` with its inclusion proof."""

    index: int
    leaf: bytes
    proof: tuple[bytes, ...]


@dataclass(frozen=True)
class Respond:
    """The auditor's bisection move: agree or not with the revealed leaf ``index``."""

    index: int
    agree: bool


@dataclass(frozen=True)
class ClaimTimeout:
    """End a game whose mover (``"trainer"``, ``"auditor"``) or judge (``"judge"``) ran out of time."""

    silent: str


@dataclass(frozen=True)
class Rule:
    """The judge's move: re-run step ``step`` (the game's pinned step) and post its post-state."""

    step: int


@dataclass(frozen=True)
class Finalize:
    """Settle the task: the window is over and no game is live."""


@dataclass(frozen=True)
class Withdraw:
    """Collect ``amount`` wei of this account's credit."""

    amount: int


# ------------------------------------------------------------------------------ the auditor
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
    single = num_leaves == 1
    if own_leaves[0] != first_leaf:
        return Challenge(True, True, 0)
    if own_leaves[-1] == last_leaf:
        return Challenge(False, single, None)
    return Challenge(True, single, None)


def challenge_in_time(task: Task, now: int) -> bool:
    """Whether a challenge sent now can still open a game against ``task``."""
    return task.status == TaskStatus.COMMITTED and clock.challenge_in_time(now, task.window_ends)


def decide_response(game: Game, own_leaves: Sequence[bytes]) -> bool:
    """An honest auditor agrees with the revealed leaf exactly when it equals its own."""
    if game.phase != Phase.AWAITING_RESPONSE:
        raise ProtocolError(f"the auditor has no move in phase {game.phase.name}")
    return own_leaves[game.mid] == game.mid_leaf


def auditor_move(
    game: Game, now: int, deadline: int, own_leaves: Sequence[bytes]
) -> Respond | ClaimTimeout | None:
    """An honest auditor's move in a game: its answer while its clock runs, a timeout once the
    trainer's clock (or the judge's window) ran out, else nothing."""
    if game.phase == Phase.AWAITING_RESPONSE:
        if not clock.move_in_time(now, deadline):
            return None  # our clock ran out: the trainer will time us out
        return Respond(game.mid, decide_response(game, own_leaves))
    if game.phase == Phase.AWAITING_REVEAL and clock.clock_ran_out(now, deadline):
        return ClaimTimeout("trainer")
    if game.phase == Phase.PINNED and clock.clock_ran_out(now, deadline):
        return ClaimTimeout("judge")
    return None


# ------------------------------------------------------------------------------ the trainer
def decide_reveal(game: Game, tree: MerkleTree) -> Reveal:
    """The trainer reveals its leaf at the midpoint of the disputed interval, with a proof."""
    if game.phase != Phase.AWAITING_REVEAL:
        raise ProtocolError(f"the trainer has no move in phase {game.phase.name}")
    mid = game.mid
    proof = tree.proof(mid)
    return Reveal(mid, tree.leaf(mid), proof.siblings)


def trainer_move(game: Game, now: int, deadline: int, tree: MerkleTree) -> Reveal | ClaimTimeout | None:
    """The trainer's move in a game: its reveal while its clock runs, a timeout once the
    auditor's clock (or the judge's window) ran out, else nothing."""
    if game.phase == Phase.AWAITING_REVEAL:
        if not clock.move_in_time(now, deadline):
            return None  # our clock ran out: nothing we can do; the auditor will time us out
        return decide_reveal(game, tree)
    if game.phase in (Phase.AWAITING_RESPONSE, Phase.PINNED) and clock.clock_ran_out(now, deadline):
        return ClaimTimeout("auditor" if game.phase == Phase.AWAITING_RESPONSE else "judge")
    return None


# ------------------------------------------------------------------------------ the judge
def pinned_step(game: Game) -> int:
    """The step the judge must re-run: the post-state is leaf ``hi`` (0 means initialisation)."""
    if game.phase != Phase.PINNED:
        raise ProtocolError(f"game is in phase {game.phase.name}, not pinned")
    return game.hi


def initial_state_disputed(game: Game) -> bool:
    """Whether the pinned step is the initialisation (leaf 0): the judge re-runs no training step
    then, only the task's initial state from its config."""
    return game.dispute_init or pinned_step(game) == 0


def judge_move(game: Game, now: int, deadline: int) -> Rule | None:
    """The judge rules on a pinned game while its window is open (after it, the game is void)."""
    if game.phase != Phase.PINNED or not clock.move_in_time(now, deadline):
        return None
    return Rule(pinned_step(game))


# ------------------------------------------------------------------------------ anyone
def decide_finalize(task: Task, now: int, *, closed_for_all: bool = False) -> Finalize | None:
    """Finalize once the window is over and no game is live; None when it is not due (yet).

    ``closed_for_all``: only once the window had closed in the latest block (so that a node
    estimating on the latest block and one estimating on the next agree); otherwise as soon as
    the next block may be past it.
    """
    if task.status != TaskStatus.COMMITTED or task.live_games:
        return None
    closed = clock.window_closed if closed_for_all else clock.finalize_in_time
    return Finalize() if closed(now, task.window_ends) else None


def decide_withdraw(credit: int) -> Withdraw | None:
    """Withdraw (reclaim) this account's credit when there is any."""
    return Withdraw(credit) if credit else None


__all__ = [
    "Challenge",
    "ClaimTimeout",
    "Finalize",
    "ProtocolError",
    "Respond",
    "Reveal",
    "Rule",
    "Withdraw",
    "auditor_move",
    "challenge_in_time",
    "decide_challenge",
    "decide_finalize",
    "decide_response",
    "decide_reveal",
    "decide_withdraw",
    "initial_state_disputed",
    "judge_move",
    "pinned_step",
    "trainer_move",
]
