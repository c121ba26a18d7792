"""Every deadline and window rule of the contract: the only timestamp arithmetic in the repository.

Why one module: the contract's times are few (a game's ``deadline``, a task's ``windowEnds``) but
the rules about them are subtle, and the same comparison written in thirty places drifts
(``now + 1 > deadline`` in one agent, ``now >= deadline`` in another, each right for its purpose).
Here each rule is named once, with the reason it has its form (``docs/contract.md``, "Clocks").

``now`` is always the latest block's timestamp (``chain.now()``). A transaction sent now lands in a
later block, at least :data:`NEXT_BLOCK_S` second later, so a rule "the next block may still ..."
adds it and a rule "... in the latest block already" does not.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The next block's timestamp is at least this much later than the latest one's.
NEXT_BLOCK_S = 1


# ---------------------------------------------------------------------------- a game's clock
def move_in_time(now: int, deadline: int) -> bool:
    """Whether a move (reveal, respond, rule) sent now can still land by ``deadline``.

    The contract takes a move while ``block.timestamp <= deadline``; the move's block is at least a
    second after the latest, so a move is certainly too late once ``now + 1 > deadline``.
    """
    return now + NEXT_BLOCK_S <= deadline


def clock_ran_out(now: int, deadline: int) -> bool:
    """Whether a ``timeout`` sent now lands after ``deadline`` (it needs ``block.timestamp > deadline``)."""
    return now + NEXT_BLOCK_S > deadline


def deadline_of(last_move_at: int, seconds: int) -> int:
    """A running clock's deadline: the last move's time plus the seconds the mover has left (the
    contract's ``lastMoveAt + clock``)."""
    return last_move_at + seconds


def timeout_from(deadline: int) -> int:
    """The first chain time at which ``timeout`` succeeds: one second past the deadline."""
    return deadline + 1


# ---------------------------------------------------------------------- a task's challenge window
def challenge_in_time(now: int, window_ends: int) -> bool:
    """Whether a challenge sent now lands while the window is open (``block.timestamp < windowEnds``)."""
    return now + NEXT_BLOCK_S < window_ends


def finalize_in_time(now: int, window_ends: int) -> bool:
    """Whether a ``finalize`` sent now may land after the window (``block.timestamp >= windowEnds``):
    the next block may be the first past it (if it is not, the gas estimate says so, for free)."""
    return now + NEXT_BLOCK_S >= window_ends


def window_closed(now: int, window_ends: int) -> bool:
    """Whether the window had closed already in the latest block: closed for every estimate, the
    latest block's and the next one's (``window_ends`` 0, before the commit, counts as closed)."""
    return now >= window_ends


# ---------------------------------------------------------------------------- time ahead
def is_ahead(now: float, when: float) -> bool:
    """Whether the chain time ``when`` is still to come."""
    return when > now


def seconds_until(now: int, when: int) -> int:
    """Seconds from ``now`` to ``when`` (negative once it passed)."""
    return when - now


def after(now: int, seconds: float) -> float:
    """The chain time ``seconds`` after ``now``."""
    return now + seconds


def next_due(now: int, times: Iterable[int]) -> int | None:
    """The earliest of ``times`` still ahead of ``now`` (None when none is)."""
    ahead = [t for t in times if is_ahead(now, t)]
    return min(ahead) if ahead else None


def travel_seconds(now: int, when: int) -> int:
    """How far a chain with time travel jumps to reach ``when`` (at least one second: a new block)."""
    return max(1, when - now)


def age(block_time: int, wall_time: float) -> int:
    """Seconds of wall time since a block's timestamp (how stale a chain's clock is)."""
    return int(wall_time) - block_time


__all__ = [
    "NEXT_BLOCK_S",
    "after",
    "age",
    "challenge_in_time",
    "clock_ran_out",
    "deadline_of",
    "finalize_in_time",
    "is_ahead",
    "move_in_time",
    "next_due",
    "seconds_until",
    "timeout_from",
    "travel_seconds",
    "window_closed",
]
