"""The client's part of a task: post it, read it, cancel it, settle it, reclaim what it is owed.

Why a module of its own: ``vgame task ...`` and the demo are both clients, and a client script
should need no CLI. A task is posted from a :class:`~game.training.task.config.TaskConfig` (only its
spec hash goes on-chain), the data key's hash and :class:`TaskTerms` (bonds, clocks, windows,
payment); the roles and every term are fixed at creation (``docs/contract.md``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from game.chain.client import MAX_DURATION, VerificationGameClient
from game.chain.errors import GamesLive, WindowOpen
from game.chain.types import Game, Outcome, TxReceipt
from game.errors import ConfigError
from game.protocol.solver import decide_finalize, decide_withdraw

log = logging.getLogger(__name__)

ETHER = 10**18


@dataclass(frozen=True)
class TaskTerms:
    """What a task pays and risks, and how long each party has (seconds)."""

    payment: int = ETHER  # wei escrowed by the client, paid to an unchallenged (or winning) trainer
    trainer_bond: int = ETHER // 2  # wei the trainer locks when it accepts the task
    auditor_bond: int = ETHER // 10  # wei each challenger locks per game
    clock_allowance: int = 3600  # chess-clock seconds per party per game
    challenge_window: int = 86400  # seconds after the commit during which anyone may challenge
    judge_window: int = 3600  # seconds the judge has to rule once a step is pinned
    commit_window: int = 7 * 86400  # seconds the trainer has from its accept to its commit

    def __post_init__(self) -> None:
        if self.payment <= 0:
            raise ConfigError(f"payment: must be positive, got {self.payment}")
        for name in ("trainer_bond", "auditor_bond"):
            if getattr(self, name) < 1:
                # a free claim costs its target, never its maker (the contract refuses it: InvalidBonds)
                raise ConfigError(f"{name}: must be at least 1 wei, got {getattr(self, name)}")
        for name in ("clock_allowance", "challenge_window", "judge_window", "commit_window"):
            value = getattr(self, name)
            if not 0 < value <= MAX_DURATION:
                raise ConfigError(f"{name}: must be 1..{MAX_DURATION} seconds (30 days), got {value}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


#: Short clocks for chains whose time cannot be moved (a testnet): the demo waits them out for real.
REALTIME_TERMS = TaskTerms(
    payment=10**15,
    trainer_bond=5 * 10**14,
    auditor_bond=10**14,
    clock_allowance=90,
    challenge_window=180,
    judge_window=120,
    commit_window=3600,
)


def post_task(
    client: VerificationGameClient,
    spec_hash: bytes,
    *,
    key_hash: bytes,
    num_leaves: int,
    trainer: str,
    judge: str,
    terms: TaskTerms,
) -> TxReceipt:
    """Create the task and escrow the payment; ``receipt.result`` is the new task id.

    ``key_hash`` is the data key's hash (:func:`game.store.keys.key_hash`: every party checks it
    holds the task's key before working). ``num_leaves`` is the config's
    :attr:`~game.training.task.config.TaskConfig.num_leaves` (steps + 1): the contract refuses a
    commitment of any other size, so a trainer cannot be paid for fewer steps than the task asks for.
    """
    receipt = client.create_task(
        spec_hash,
        trainer,
        judge,
        key_hash=key_hash,
        num_leaves=num_leaves,
        payment=terms.payment,
        trainer_bond=terms.trainer_bond,
        auditor_bond=terms.auditor_bond,
        clock_allowance=terms.clock_allowance,
        challenge_window=terms.challenge_window,
        judge_window=terms.judge_window,
        commit_window=terms.commit_window,
    )
    log.info("posted task %s (spec %s...) for trainer %s", receipt.result, spec_hash.hex()[:16], trainer)
    return receipt


def task_game_ids(client: VerificationGameClient, task_id: int) -> list[int]:
    """Ids of every game opened against the task, oldest first (from ``Challenged`` events)."""
    return [int(ev.game_id) for ev in client.get_events("Challenged", task_id=task_id)]  # type: ignore[attr-defined]


def task_games(client: VerificationGameClient, task_id: int) -> list[tuple[int, Game]]:
    """(game id, current state) of every game of the task."""
    return [(gid, client.game(gid)) for gid in task_game_ids(client, task_id)]


def game_winner(game: Game) -> str | None:
    """``"trainer"``, ``"auditor"``, ``"void"`` (the judge silent), ``"answered"`` (a demanded
    chunk posted: nobody was shown wrong), or None while the game is live."""
    return {
        Outcome.TRAINER_WON: "trainer",
        Outcome.AUDITOR_WON: "auditor",
        Outcome.VOID: "void",
        Outcome.ANSWERED: "answered",
    }.get(game.outcome)


def describe_task(client: VerificationGameClient, task_id: int) -> dict[str, Any]:
    """The task and its games as plain JSON-able data (``vgame task show``)."""
    t = client.task(task_id)
    games = []
    for gid, g in task_games(client, task_id):
        games.append(
            {
                "game_id": gid,
                "auditor": g.auditor,
                "phase": g.phase.name.lower(),
                "lo": g.lo,
                "hi": g.hi,
                "dispute_init": g.dispute_init,
                "data_index": g.data_index,
                "data_piece": g.piece if g.availability else None,
                "pinned_step": g.pinned_step,
                "outcome": g.outcome.name.lower(),
                "reason": g.reason.name.lower(),
                "winner": game_winner(g),
                "reward_claimed": g.reward_claimed,
                "deadline": client.deadline(gid),
                "clock_left": dict(zip(("trainer", "auditor"), client.clock_left(gid), strict=True)),
            }
        )
    finalized = client.get_events("TaskFinalized", task_id=task_id)
    return {
        "task_id": task_id,
        "status": t.status.name.lower(),
        "client": t.client,
        "trainer": t.trainer,
        "judge": t.judge,
        "spec_hash": t.spec_hash.hex(),
        "payment": t.payment,
        "trainer_bond": t.trainer_bond,
        "auditor_bond": t.auditor_bond,
        "clock_allowance": t.clock_allowance,
        "challenge_window": t.challenge_window,
        "judge_window": t.judge_window,
        "commit_window": t.commit_window,
        "commit_by": t.commit_by,
        "key_hash": t.key_hash.hex(),
        "num_leaves": t.num_leaves,
        "state_root": t.state_root.hex(),
        "log_root": t.log_root.hex(),
        "transcript_id": t.transcript_id.hex(),
        "window_ends": t.window_ends,
        "live_games": t.live_games,
        "trainer_lost": t.trainer_lost,
        "any_void": t.any_void,
        "auditor_wins": t.auditor_wins,
        "trainer_paid": bool(finalized[0].trainer_paid) if finalized else None,  # type: ignore[attr-defined]
        "reward_share": int(finalized[0].reward_share) if finalized else None,  # type: ignore[attr-defined]
        "games": games,
        "now": client.chain.now(),
    }


def finalize_if_due(client: VerificationGameClient, task_id: int) -> TxReceipt | None:
    """Finalize when the window is over and no game is live; None when it is not due (yet)."""
    # WHY the latest block's time and not the next one's: nodes estimate on either, and only a
    # window already closed in the latest block is closed for both
    if decide_finalize(client.task(task_id), client.chain.now(), closed_for_all=True) is None:
        return None
    try:
        return client.finalize(task_id)
    except (WindowOpen, GamesLive) as exc:  # a race with the clock or a fresh challenge: not yet
        log.debug("finalize of task %d not possible yet: %s", task_id, exc)
        return None


def claim_rewards(client: VerificationGameClient, task_id: int) -> list[TxReceipt]:
    """Claim the reward of every game of a settled task that its auditor won and nobody claimed
    yet (anyone may; each credits the game's auditor). Empty when there is none."""
    from game.protocol.solver import decide_claims

    task = client.task(task_id)
    return [client.claim_reward(c.game_id) for c in decide_claims(task, task_games(client, task_id))]


def reclaim(client: VerificationGameClient) -> TxReceipt | None:
    """Withdraw this account's credit (the payment after a won challenge or a cancel); None if none."""
    if decide_withdraw(client.credit()) is None:
        return None
    return client.withdraw()


__all__ = [
    "ETHER",
    "REALTIME_TERMS",
    "TaskTerms",
    "claim_rewards",
    "describe_task",
    "finalize_if_due",
    "game_winner",
    "post_task",
    "reclaim",
    "task_game_ids",
    "task_games",
]
