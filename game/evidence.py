"""What a judge rules from, and what it rules: the evidence of a pinned step (the config, the step's
log chunk with its proof, the pre-state and, for an asynchronous update, the older states it
computes on and any earlier update's chunk that applied one of its micro-batches already, each with
its proof, or the older states replayed from the log on-chain), the errors that say which piece the chain does not vouch for,
and the ruling. Apart from :mod:`game.judge` (which gathers, checks and computes) so that the
evidence's shape is read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from game.chain.types import TxReceipt
from game.errors import VGameError
from game.merkle import InclusionProof
from game.training.task.config import TaskConfig


class EvidenceError(VGameError, ValueError):
    """Evidence for a ruling is missing or does not match what the chain committed."""


class ConfigEvidenceError(EvidenceError):
    """The task config does not hash to the task's spec hash."""


class ChunkEvidenceError(EvidenceError):
    """The log chunk of the pinned step, or an earlier update's given as a witness, is not its leaf
    of the committed log tree."""


class PreStateEvidenceError(EvidenceError):
    """The pre-state bytes do not hash to the game's agreed leaf (or cannot be rebuilt)."""


class VersionEvidenceError(EvidenceError):
    """A state an asynchronous update computes on is missing, or not proved against the state root."""


class TranscriptEvidenceError(EvidenceError):
    """The published transcript is unavailable or disagrees with the committed roots."""


@dataclass(frozen=True)
class Evidence:
    """What a ruling is computed from; :meth:`Judge.check` verifies it against the chain."""

    config: TaskConfig
    chunk: bytes = b""  # the log chunk of the pinned step (unused at step 0)
    chunk_proof: InclusionProof | None = None  # its proof in the log tree (None at step 0)
    pre_state: bytes | None = None  # canonical state bytes after step - 1 (None at step 0)
    #: an asynchronous task's update computes on older states too (its chunk's schedule names
    #: them): each one's canonical bytes, with the proof of its leaf in the committed state tree
    versions: dict[int, tuple[bytes, InclusionProof]] = field(default_factory=dict)
    #: an asynchronous update that applies a micro-batch again: the log chunk of an earlier update
    #: that applied it (its witness), with the chunk's proof in the committed log tree
    earlier: dict[int, tuple[bytes, InclusionProof]] = field(default_factory=dict)
    #: where the transcript cannot be had, nobody holds the trainer's leaves to prove an older state
    #: by: the judge replays those states itself from the log posted on-chain
    #: (:mod:`game.chainevidence`). The replay is bit-exact, so they are the states of whichever
    #: side replayed that log honestly, and a ruling on them is that side's
    replayed: dict[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Ruling:
    """A ruling as computed (and sent, when ``tx`` is set)."""

    game_id: int
    step: int
    computed: bytes  # the post-state hash the judge computed
    trainer_leaf: bytes  # the trainer's committed post-state (the game's hi leaf)
    trainer_right: bool
    tx: TxReceipt | None = None
    note: str = ""  # why, when the judge did not simply replay the step (a rejected log)


__all__ = [
    "ChunkEvidenceError",
    "ConfigEvidenceError",
    "Evidence",
    "EvidenceError",
    "PreStateEvidenceError",
    "Ruling",
    "TranscriptEvidenceError",
    "VersionEvidenceError",
]
