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

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from game import clock
from game.chain.types import Game, Outcome, Phase, Task, TaskStatus
from game.errors import VGameError
from game.merkle import MerkleTree

#: What an auditor could make of a committed task's transcript: fetched and opened, not in the
#: store (yet: a synced store lags), or there but not openable under the task's key (sealed under
#: another key, garbled, or not what the chain committed to).
TranscriptState = Literal["ok", "missing", "unreadable"]
#: A transcript missing from the store is waited for this fraction of the challenge window before
#: its chunk is demanded on-chain (a store synced between machines lags the chain by minutes).
MISSING_GRACE_FRACTION = 4


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
class DemandData:
    """The auditor's availability challenge: piece ``piece`` of log chunk ``index`` must be posted
    on-chain (the contract reduces ``piece`` by the chunk's piece count: :mod:`game.chunkleaf`)."""

    index: int
    piece: int = 0


@dataclass(frozen=True)
class ProvideData:
    """The trainer's answer to an availability challenge: chunk ``index`` with its proof in the log
    tree (the agent reads the chunk's bytes from its transcript; the client posts the piece the game
    demands, with its proof in the chunk's piece tree)."""

    index: int
    proof: tuple[bytes, ...]


@dataclass(frozen=True)
class Accept:
    """The trainer locks an open task (posting its bond) before it trains."""


@dataclass(frozen=True)
class ClaimReward:
    """Credit game ``game_id``'s auditor its share of the lost trainer's bond."""

    game_id: int


@dataclass(frozen=True)
class Finalize:
    """Settle the task: the window is over and no game is live."""


@dataclass(frozen=True)
class Withdraw:
    """Collect ``amount`` wei of this account's credit."""

    amount: int


# ------------------------------------------------------------------------------ the auditor
def decide_challenge(
    first_leaf: bytes,
    last_leaf: bytes,
    num_leaves: int,
    own_leaves: Sequence[bytes],
    *,
    final_is_state: bool = True,
) -> Challenge:
    """An honest auditor's opening move from the committed endpoints and its own replay.

    It challenges only when the committed final state differs from its own (a trainer whose final
    state is right but whose path is not cannot be pinned by bisection and has harmed no one), or
    when the initial state differs (then the dispute is the initialisation itself). Where its own
    final leaf is no state (``final_is_state`` False: its replay could not go on, an asynchronous
    task's broken schedule), a trainer's equal to it says nothing but that the trainer knows how
    the auditor marks such leaves: it challenges.
    """
    if len(own_leaves) != num_leaves:
        raise ProtocolError(f"own replay has {len(own_leaves)} leaves, the commitment has {num_leaves}")
    single = num_leaves == 1
    if own_leaves[0] != first_leaf:
        return Challenge(True, True, 0)
    if own_leaves[-1] == last_leaf and final_is_state:
        return Challenge(False, single, None)
    return Challenge(True, single, None)


def _probe_seed(task_id: int, auditor: str) -> bytes:
    return hashlib.sha256(
        task_id.to_bytes(32, "big") + bytes.fromhex(auditor.lower().removeprefix("0x"))
    ).digest()


def data_probe_index(task_id: int, auditor: str, num_leaves: int) -> int:
    """The training step whose log chunk an auditor demands when it cannot get the transcript: one
    step of ``1..N-1`` fixed by the task and the auditor's address, so that a node restarted demands
    the same one, and different auditors probe different steps."""
    return 1 + int.from_bytes(_probe_seed(task_id, auditor), "big") % (num_leaves - 1)


def data_probe_piece(task_id: int, auditor: str) -> int:
    """The piece of that chunk it demands: a 32-bit number fixed as the step is, which the contract
    reduces by the chunk's piece count, so that auditors who never saw the chunk probe its pieces
    alike (a trainer keeping back one piece of a large chunk is caught as often as one piece is drawn)."""
    return int.from_bytes(hashlib.sha256(b"piece" + _probe_seed(task_id, auditor)).digest()[:4], "big")


def decide_data_demand(
    task: Task,
    now: int,
    transcript: TranscriptState,
    *,
    task_id: int,
    auditor: str,
    demanded: bool,
) -> DemandData | None:
    """An honest auditor's availability challenge, when it cannot audit because the transcript
    cannot be had (docs/contract.md "Availability").

    A transcript that does not open under the task's key (or is not what the chain committed to)
    is demanded at once; one missing from the store once ``1 / MISSING_GRACE_FRACTION`` of the
    window has passed (a synced store lags; counted as the window left, which another auditor's
    answered demand may have extended). One demand per auditor: a trainer that cannot post it loses
    the task; one that can has the data, and the auditor keeps waiting for the store. None when
    there is nothing to demand, it was demanded already, or no challenge can land any more."""
    if transcript == "ok" or demanded or not challenge_in_time(task, now):
        return None
    if transcript == "missing":
        grace = task.challenge_window // MISSING_GRACE_FRACTION
        if clock.seconds_until(now, task.window_ends) > task.challenge_window - grace:
            return None
    return DemandData(data_probe_index(task_id, auditor, task.num_leaves), data_probe_piece(task_id, auditor))


def decide_log_demands(
    task: Task,
    now: int,
    missing: Sequence[tuple[int, int]],
    open_demands: Sequence[tuple[int, int]],
    *,
    max_open: int,
) -> list[DemandData]:
    """An auditor's next demands while it reads a withheld log off the chain: the (chunk, piece)
    pairs ``missing`` (:meth:`game.onchainlog.OnChainLog.missing`) that none of its open demands
    names, in order, so that no more than ``max_open`` are open at once (each holds a bond). None
    once no challenge can land (docs/contract.md "Availability")."""
    if not challenge_in_time(task, now):
        return []
    room = max(max_open - len(open_demands), 0)
    asked = set(open_demands)
    return [DemandData(i, k) for i, k in missing if (i, k) not in asked][:room]


def challenge_in_time(task: Task, now: int) -> bool:
    """Whether a challenge sent now can still open a game against ``task``."""
    return task.status == TaskStatus.COMMITTED and clock.challenge_in_time(now, task.window_ends)


def window_over(task: Task, now: int) -> bool:
    """Whether no challenge against ``task`` can land now nor ever again.

    Not only the window's end: while a game of the task is live, an availability demand's end can
    extend the window (the contract gives back the time the trainer took to answer, docs/contract.md
    "Availability"), so a window past its end with a game live may open again."""
    return not challenge_in_time(task, now) and not (task.status == TaskStatus.COMMITTED and task.live_games)


def decide_response(game: Game, own_leaves: Sequence[bytes], first_divergent: int | None = None) -> bool:
    """An honest auditor agrees with the revealed leaf exactly when it equals its own and comes
    before its first divergent one (``first_divergent``), so the game pins exactly that step.

    Why not later ones: after its first divergent step an auditor runs without the trainer's log,
    and its states can meet the trainer's again (a trainer that lies about one leaf and goes on
    computing honestly), until a value the log rounds one way rounds the other way. Agreeing where
    they met would move the game past the step it wins and pin that later one, whose log is valid:
    the judge would find for the trainer."""
    if game.phase != Phase.AWAITING_RESPONSE:
        raise ProtocolError(f"the auditor has no move in phase {game.phase.name}")
    if first_divergent is not None and game.mid >= first_divergent:
        return False
    return own_leaves[game.mid] == game.mid_leaf


def auditor_move(
    game: Game, now: int, deadline: int, own_leaves: Sequence[bytes], first_divergent: int | None = None
) -> Respond | ClaimTimeout | None:
    """An honest auditor's move in a game: its answer while its clock runs (:func:`decide_response`),
    a timeout once the trainer's clock (or the judge's window) ran out, else nothing."""
    if game.phase == Phase.AWAITING_RESPONSE:
        if not clock.move_in_time(now, deadline):
            return None  # our clock ran out: the trainer will time us out
        return Respond(game.mid, decide_response(game, own_leaves, first_divergent))
    if game.phase in (Phase.AWAITING_REVEAL, Phase.AWAITING_DATA) and clock.clock_ran_out(now, deadline):
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


def decide_provide(game: Game, log_tree: MerkleTree) -> ProvideData:
    """The trainer posts the demanded chunk: its proof in the tree of the committed chunk hashes."""
    if game.phase != Phase.AWAITING_DATA:
        raise ProtocolError(f"the trainer has no data to post in phase {game.phase.name}")
    return ProvideData(game.lo, log_tree.proof(game.lo).siblings)


def trainer_move(
    game: Game, now: int, deadline: int, tree: MerkleTree, log_tree: MerkleTree | None = None
) -> Reveal | ProvideData | ClaimTimeout | None:
    """The trainer's move in a game: its reveal (or the demanded chunk, ``log_tree`` being the tree
    of its chunk hashes) while its clock runs, a timeout once the auditor's clock (or the judge's
    window) ran out, else nothing."""
    if game.phase in (Phase.AWAITING_REVEAL, Phase.AWAITING_DATA):
        if not clock.move_in_time(now, deadline):
            return None  # our clock ran out: nothing we can do; the auditor will time us out
        if game.phase == Phase.AWAITING_DATA:
            if log_tree is None:
                raise ProtocolError("a demanded chunk is proved from the log tree, and none was given")
            return decide_provide(game, log_tree)
        return decide_reveal(game, tree)
    if game.phase in (Phase.AWAITING_RESPONSE, Phase.PINNED) and clock.clock_ran_out(now, deadline):
        return ClaimTimeout("auditor" if game.phase == Phase.AWAITING_RESPONSE else "judge")
    return None


def decide_accept(task: Task) -> Accept | None:
    """Accept (lock) the task before training, while it is open."""
    return Accept() if task.status == TaskStatus.OPEN else None


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


def decide_claims(task: Task, games: Sequence[tuple[int, Game]]) -> list[ClaimReward]:
    """The rewards due once a lost task is settled: every game its auditor won and nobody claimed."""
    if task.status != TaskStatus.FINALIZED:
        return []
    return [ClaimReward(gid) for gid, g in games if g.outcome == Outcome.AUDITOR_WON and not g.reward_claimed]


def decide_withdraw(credit: int) -> Withdraw | None:
    """Withdraw (reclaim) this account's credit when there is any."""
    return Withdraw(credit) if credit else None


__all__ = [
    "MISSING_GRACE_FRACTION",
    "Accept",
    "Challenge",
    "ClaimReward",
    "ClaimTimeout",
    "DemandData",
    "Finalize",
    "ProtocolError",
    "ProvideData",
    "Respond",
    "Reveal",
    "Rule",
    "TranscriptState",
    "Withdraw",
    "auditor_move",
    "challenge_in_time",
    "data_probe_index",
    "data_probe_piece",
    "decide_accept",
    "decide_challenge",
    "decide_claims",
    "decide_data_demand",
    "decide_finalize",
    "decide_log_demands",
    "decide_provide",
    "decide_response",
    "decide_reveal",
    "decide_withdraw",
    "initial_state_disputed",
    "judge_move",
    "pinned_step",
    "trainer_move",
    "window_over",
]
