"""Dishonest auditors: one that challenges an honest run and answers at random, one that falls silent.

An :class:`~auditor_node.agent.AuditorAgent` is handed one as its ``strategy`` (the
:class:`~auditor_node.agent.AuditorStrategy` hook on the product side); honest play is the agent's
own :class:`~auditor_node.agent.HonestAuditor`. :data:`AUDITORS` names them all, for the demo's
scenarios and ``vgame node auditor --strategy``; :func:`auditor_strategy` makes one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from auditor_node.agent import AuditorStrategy, HonestAuditor
from game.chain.types import Game
from game.registry import Registry


@dataclass(frozen=True)
class LyingAuditor:
    """Challenges whatever the replay says, then agrees or not by a coin of its ``seed`` (the same
    coin for the same seed, game and interval, so a run is repeatable); it loses whatever path it takes."""

    seed: int = 0
    name: str = "lying"
    silent_once_challenged: bool = False

    def challenges(self, honest: bool) -> bool:
        return True

    def answer(self, game: Game, game_id: int, honest: bool) -> bool:
        word = hashlib.sha256(
            f"vgame-lying-auditor:{self.seed}:{game_id}:{game.lo}:{game.hi}".encode()
        ).digest()
        return bool(word[0] & 1)


@dataclass(frozen=True)
class SilentAuditor:
    """Challenges whatever the replay says, then never moves again: it loses on its own clock."""

    name: str = "silent-after-challenge"
    silent_once_challenged: bool = True

    def challenges(self, honest: bool) -> bool:
        return True

    def answer(self, game: Game, game_id: int, honest: bool) -> bool:
        raise AssertionError("a silent auditor answers nothing")


#: Every auditor strategy by name, each made from a seed (only the lying one uses it).
AUDITORS: Registry[Callable[[int], AuditorStrategy]] = Registry(
    "auditor strategy",
    [
        ("honest", lambda seed: HonestAuditor()),
        ("lying", lambda seed: LyingAuditor(seed)),
        ("silent-after-challenge", lambda seed: SilentAuditor()),
    ],
    unknown="{kind} {name!r} is not one of {valid}",
)


def auditor_strategy(name: str, seed: int = 0) -> AuditorStrategy:
    """The auditor strategy called ``name`` (a ConfigError listing the valid names otherwise)."""
    return AUDITORS.get(name)(seed)
