"""Python mirrors of the contract's enums and structs (field for field, in ABI order).

These are *snapshots*: a :class:`Task` or :class:`Game` is what the chain said at one block.
Code that acts on a game should re-read it (``client.game(id)``) or hold a
:class:`game.chain.views.GameHandle`, which reads through to the contract on every access.
Field names are the Solidity names in snake_case; ``docs/contract.md`` is the reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, ClassVar

from eth_utils import to_checksum_address

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake(name: str) -> str:
    """``taskId`` -> ``task_id`` (the Python spelling of a Solidity name)."""
    return _CAMEL.sub("_", name).lower()


class TaskStatus(IntEnum):
    NONE = 0
    OPEN = 1
    ACCEPTED = 2  # the trainer posted its bond: it must commit by commit_by; the client cannot cancel
    COMMITTED = 3
    CANCELLED = 4
    FINALIZED = 5


class Phase(IntEnum):
    NONE = 0
    AWAITING_REVEAL = 1  # the trainer moves
    AWAITING_RESPONSE = 2  # the auditor moves
    PINNED = 3  # the judge rules
    AWAITING_DATA = 4  # an availability challenge: the trainer posts the demanded log chunk
    ENDED = 5


class Outcome(IntEnum):
    NONE = 0
    TRAINER_WON = 1
    AUDITOR_WON = 2
    VOID = 3  # the judge's deadline passed: nobody was shown wrong
    ANSWERED = 4  # an availability challenge the trainer answered: nobody was shown wrong


class EndReason(IntEnum):
    NONE = 0
    RULING = 1
    TIMEOUT = 2
    JUDGE_TIMEOUT = 3
    DATA_PROVIDED = 4


#: Solidity enum name -> Python enum, for decoding ABI ``uint8`` values that carry an enum
ENUMS: dict[str, type[IntEnum]] = {
    "TaskStatus": TaskStatus,
    "Phase": Phase,
    "Outcome": Outcome,
    "EndReason": EndReason,
}


def _from_tuple(cls: Any, values: Sequence[Any]) -> Any:
    """Build a struct mirror from the ABI tuple, converting enum fields by their annotation."""
    names = [f.name for f in fields(cls)]
    if len(values) != len(names):
        raise ValueError(f"{cls.__name__} has {len(names)} fields, the ABI returned {len(values)}")
    kwargs: dict[str, Any] = {}
    for f, v in zip(fields(cls), values, strict=True):
        enum = ENUMS.get(str(f.type))
        if enum is not None:
            v = enum(v)
        elif isinstance(v, bytes | bytearray):
            v = bytes(v)
        elif f.type == "str" and isinstance(v, str):
            v = to_checksum_address(v)  # eth-abi decodes addresses in lower case
        kwargs[f.name] = v
    return cls(**kwargs)


@dataclass(frozen=True)
class Task:
    """``struct Task`` (returned by ``task(taskId)``)."""

    client: str
    clock_allowance: int  # seconds per party per game
    challenge_window: int  # seconds after the commit
    status: TaskStatus
    trainer_lost: bool  # some game ended with the auditor winning
    any_void: bool  # some game ended void
    trainer: str
    num_leaves: int  # fixed at creation (steps + 1): the commitment must have exactly this many
    live_games: int  # games not yet Ended
    judge: str
    judge_window: int  # seconds after the pin
    window_ends: int  # unix time; 0 before the commit
    trainer_bond: int
    auditor_bond: int
    payment: int
    commit_window: int  # seconds the trainer has from its accept to its commit
    commit_by: int  # unix time the accepted trainer must commit by; 0 before the accept
    auditor_wins: int  # games that ended AuditorWon: they share the trainer's forfeited bond
    spec_hash: bytes
    key_hash: bytes  # sha256 of the task's data key (game.store.keys.key_hash)
    state_root: bytes
    log_root: bytes
    transcript_id: bytes
    first_leaf: bytes  # leaf 0 (initial state)
    last_leaf: bytes  # leaf N-1 (final state)

    @classmethod
    def from_abi(cls, values: Sequence[Any]) -> Task:
        task: Task = _from_tuple(cls, values)
        return task

    @property
    def committed(self) -> bool:
        """Whether the trainer has committed (and bonded): the commit sets ``window_ends``. Not
        ``num_leaves``, which the task fixes at creation."""
        return self.window_ends != 0

    @property
    def accepted(self) -> bool:
        """Whether the trainer has accepted (and bonded): the accept sets ``commit_by``."""
        return self.commit_by != 0


@dataclass(frozen=True)
class Game:
    """``struct Game`` (returned by ``game(gameId)``)."""

    lo: int  # agreed leaf index
    hi: int  # disputed leaf index; the pinned step once Pinned
    last_move_at: int  # unix time of the last move (the pin time once Pinned)
    trainer_clock: int  # seconds left at last_move_at
    auditor_clock: int  # seconds left at last_move_at
    phase: Phase
    auditor: str
    task_id: int
    dispute_init: bool
    availability: bool  # an availability challenge: the trainer must post a piece of log chunk ``lo``
    piece: int  # availability: the piece of chunk ``lo`` demanded; once answered, the piece posted
    window_left: int  # availability: seconds of the challenge window left when it was demanded
    outcome: Outcome
    reason: EndReason
    reward_claimed: bool  # an AuditorWon game's share of the trainer's bond was credited
    lo_leaf: bytes  # leaf lo: the pre-state once Pinned
    hi_leaf: bytes  # leaf hi: the post-state once Pinned
    mid_leaf: bytes  # the last revealed leaf (valid in AwaitingResponse)

    @classmethod
    def from_abi(cls, values: Sequence[Any]) -> Game:
        game: Game = _from_tuple(cls, values)
        return game

    @property
    def mid(self) -> int:
        """The leaf the trainer reveals next (floor of the midpoint, as the contract computes it)."""
        return (self.lo + self.hi) // 2

    @property
    def data_index(self) -> int | None:
        """The log chunk an availability challenge demands a piece of (None for a bisection game);
        the piece is :attr:`piece` (reduced modulo the chunk's piece count when the trainer answers,
        :func:`game.chunkleaf.piece_of`)."""
        return self.lo if self.availability else None

    @property
    def pinned_step(self) -> int | None:
        """The disputed step once pinned (also after a ruling or a judge timeout), else None."""
        was_pinned = self.phase == Phase.PINNED or self.reason in (EndReason.RULING, EndReason.JUDGE_TIMEOUT)
        return self.hi if was_pinned else None


@dataclass(frozen=True, kw_only=True)
class ContractEvent:
    """Where an event happened; subclasses add the event's own fields in ABI order."""

    block_number: int = 0
    tx_hash: str = ""
    log_index: int = 0
    address: str = ""

    #: Solidity parameter names that are ``indexed`` (snake_case)
    indexed: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return type(self).__name__

    def args(self) -> dict[str, Any]:
        """The event's own fields (not its location)."""
        skip = {f.name for f in fields(ContractEvent)}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


@dataclass(frozen=True)
class TxReceipt:
    """What one of our transactions did: enough to log, to bench and to act on."""

    function: str  # contract function name ("" for a plain transfer or deployment)
    tx_hash: str
    block_number: int
    gas_used: int
    gas_limit: int  # what we bought: estimate * headroom + margin
    events: tuple[ContractEvent, ...]
    result: int | None = None  # taskId for createTask, gameId for challenge

    def event(self, name: str) -> ContractEvent:
        """The single event ``name`` this transaction emitted."""
        found = [e for e in self.events if e.name == name]
        if len(found) != 1:
            raise LookupError(f"{self.function} emitted {len(found)} {name} events, expected 1")
        return found[0]

    def events_named(self, name: str) -> list[ContractEvent]:
        return [e for e in self.events if e.name == name]
