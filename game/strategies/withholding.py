"""A trainer node that withholds its transcript: it publishes it sealed under a key nobody holds.

Why: the demo's ``withhold`` scenario and its tests need the trainer that issue 44's availability
game is for. It trains (with a deviation or not), publishes a blob that does not open under the
task's key, skips its node's own check of that, commits, and answers every availability demand from
the plaintext it keeps, piece by piece. Withholding gains it nothing: an auditor with the task's
config reads the log off the chain and replays it (:mod:`auditor_node.chainlog`).

The product's :class:`~trainer_node.agent.TrainerAgent` refuses to do this (it opens its own blob
before committing); only this subclass, out of the product's reach, does.
"""

from __future__ import annotations

from typing import Any

from game.store.keys import new_key
from trainer_node.agent import TrainerAgent


class WithholdingTrainer(TrainerAgent):
    """A :class:`~trainer_node.agent.TrainerAgent` whose published transcript nobody can open."""

    def _sealing_key(self) -> bytes:
        """A fresh key, dropped at once: the blob is in the store, and nobody can read it."""
        return new_key()

    def _check_opens(self, *_args: Any) -> None:
        """Skipped: the node's check would refuse to commit a blob that does not open."""


__all__ = ["WithholdingTrainer"]
