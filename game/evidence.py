"""What a judge rules from, and what it rules: the evidence of a pinned step (the config, the step's
log chunk with its proof, the pre-state and, for an asynchronous update, the older states it
computes on and any earlier update's chunk that applied one of its micro-batches already, each with
its proof, or the older states replayed from the log on-chain), its check against the chain, the
errors that say which piece the chain does not vouch for, and the ruling. Apart from
:mod:`game.judge` (which gathers and computes) so that the evidence's shape is read and checked in
one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from game.chain.types import Game, Task, TxReceipt
from game.chunkleaf import chunk_leaf
from game.errors import RoundingLogError, VGameError
from game.merkle import InclusionProof, verify_proof
from game.protocol.solver import initial_state_disputed, pinned_step
from game.training.state.leafhash import leaf_of
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


def versions_named(cfg: TaskConfig, chunk: bytes, step: int, *, strict: bool = False) -> tuple[int, ...]:
    """The states an asynchronous task's update ``step`` computes on, as its chunk's schedule names
    them (none for a synchronous task, or, unless ``strict``, for a chunk that does not parse or
    breaks the rules: the ruling says so)."""
    if not cfg.scheduled:
        return ()
    from game.training.engine.scheduled import check_entry
    from game.training.log.schedule import ScheduleError, open_envelope

    try:
        entry, _ = open_envelope(chunk, step=step, spec_hash=cfg.spec_hash())
        check_entry(entry, cfg)
    except RoundingLogError as exc:
        if strict:
            raise ScheduleError(f"update {step}: {exc}") from exc
        return ()
    return entry.versions


@dataclass(frozen=True)
class Evidence:
    """What a ruling is computed from; :meth:`check` verifies it against the chain."""

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

    def check(self, g: Game, task: Task) -> None:
        """Raise the EvidenceError subclass naming the first input that the chain does not vouch for."""
        spec = self.config.spec_hash()
        if spec != task.spec_hash:
            raise ConfigEvidenceError(
                f"the config hashes to {spec.hex()[:16]}..., the task's spec hash is {task.spec_hash.hex()[:16]}..."
            )
        if initial_state_disputed(g):
            return
        step = pinned_step(g)
        chunk_hash = chunk_leaf(self.chunk)
        proof = self.chunk_proof
        if (
            proof is None
            or proof.index != step
            or proof.size != task.num_leaves
            or not verify_proof(task.log_root, chunk_hash, proof)
        ):
            raise ChunkEvidenceError(
                f"the log chunk given for step {step} (hash {chunk_hash.hex()[:16]}...) is not leaf {step} "
                "of the committed log tree"
            )
        if self.pre_state is None:
            raise PreStateEvidenceError(f"no pre-state for step {step}")
        pre = leaf_of(self.pre_state)
        if pre != g.lo_leaf:
            raise PreStateEvidenceError(
                f"the pre-state hashes to {pre.hex()[:16]}..., the agreed leaf {g.lo} is {g.lo_leaf.hex()[:16]}..."
            )
        for v, (data, vproof) in self.versions.items():
            leaf = leaf_of(data)
            if (
                vproof.index != v
                or vproof.size != task.num_leaves
                or not verify_proof(task.state_root, leaf, vproof)
            ):
                raise VersionEvidenceError(
                    f"the state given for version {v} (leaf {leaf.hex()[:16]}...) is not leaf {v} of the "
                    "committed state tree"
                )
        for w, (data, wproof) in self.earlier.items():
            if not (
                1 <= w < step and wproof.index == w and wproof.size == task.num_leaves
            ) or not verify_proof(task.log_root, chunk_leaf(data), wproof):
                raise ChunkEvidenceError(
                    f"the chunk given as update {w}'s is not leaf {w} of the committed log tree"
                )
        given = {*self.versions, *self.replayed}
        missing = [v for v in versions_named(self.config, self.chunk, step) if v != g.lo and v not in given]
        if missing:
            raise VersionEvidenceError(f"update {step} computes on states {missing}, and none was given")


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
    "versions_named",
]
