"""Re-running one committed step: :func:`replay_step`, the judge's primitive, and what is built on it.

A step's inputs are committed on-chain: the state before it (a leaf of the state tree, whose
canonical bytes are a checkpoint or evidence left under their hash) and its rounding-log chunk (a
leaf of the log tree). :func:`replay_step` runs the step from those; every re-run of a committed
step goes through it: the judge's ruling (``game.judge``), a trainer resuming from its last
checkpoint (:func:`replay_forward`), an auditor rebuilding the trainer's state (:func:`state_after`),
and ``vgame replay-step`` (``game.judgeupdate.judged_step``, on :func:`state_after`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from game.errors import RoundingLogError, TranscriptError, UnfitChunkError
from game.training.engine.memory import trimmed
from game.training.engine.scheduled import replay_update, states_for
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine, StepResult, engine_for
from game.training.log.formats import ChunkLog, decode_chunk
from game.training.state.leaves import state_hash
from game.training.state.tensors import TrainState
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of :func:`replay_transcript_step`."""

    step: int
    state_hash: bytes
    matches_transcript: bool
    #: why the judge rules against the step's chunk, where it does (``state_hash`` is then the
    #: rejected-log hash: ``game.judgeupdate.judged_step``); empty where the step ran with its log
    rejected: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "state_hash": self.state_hash.hex(),
            "matches_transcript": self.matches_transcript,
            "rejected": self.rejected,
        }


def replay_step(
    engine: StepEngine,
    pre_state: TrainState | bytes,
    step: int,
    chunk: ChunkLog | bytes | None,
    *,
    hash_state: bool = True,
) -> StepResult:
    """Re-run ``step`` from the committed state before it with the committed log chunk.

    ``pre_state``: the state after ``step - 1``, as canonical bytes (decoded here) or a state
    (run on in place). ``chunk``: the step's log chunk, as its bytes (decoded and bound to the
    task's spec hash and ``step``) or decoded; None runs the step without a log (round mode: what a
    party does when the chunk does not fit the computation). Verifies nothing about where the
    inputs came from (the judge checks them against the committed roots first); a chunk that does
    not decode or fit raises :class:`~game.errors.RoundingLogError` (a tampered one
    :class:`~game.training.numerics.bandcheck.LogTamperingError`)."""
    state = pre_state if isinstance(pre_state, TrainState) else decode_state(pre_state, engine.cfg)
    if chunk is None:
        return engine.run_step(state, step, mode="round", hash_state=hash_state)
    if isinstance(chunk, bytes | bytearray | memoryview):
        chunk = decode_chunk(bytes(chunk), engine.cfg.spec_hash(), step)
    return engine.run_step(state, step, mode="replay", log=chunk, hash_state=hash_state)


def replay_forward(
    t: Transcript,
    engine: StepEngine,
    state: TrainState,
    first: int,
    last: int,
    *,
    check_leaves: bool = True,
    without: Collection[int] = (),
) -> None:
    """Run steps ``first..last`` on ``state`` with the transcript's log chunks, checking every leaf on
    the way (unless ``check_leaves`` is False and ``engine`` does not rebuild: the caller checks the
    last state itself).

    A step whose chunk does not decode, or is in ``without``, runs without the log, as the auditor
    and the judge run a step whose chunk is the trainer's fault; its leaf is checked all the same
    (a trainer may commit a true state with a log that does not fit it). A chunk that decodes but
    does not fit raises :class:`UnfitChunkError` naming its step: the state is then half-updated,
    and :func:`replayed` starts again with that step in ``without``. So does, for an engine that
    rebuilds agreed states (``checks`` ``rebuild``), a step whose state with its log misses its
    leaf: it accepts entries further out than the auditor who agreed did, which leaves the leaf to
    say where that auditor refused the chunk and ran the step without it
    (:mod:`~game.training.numerics.reach`)."""
    rebuilds = engine.checks == "rebuild"
    for step in range(first, last + 1):
        chunk: ChunkLog | None = None
        if step not in without:
            try:
                chunk = t.read_log(step)
            except RoundingLogError as exc:  # nothing ran: the step runs without it at once
                log.info("step %d: the log chunk does not decode (%s); replayed without it", step, exc)
        try:
            result = replay_step(engine, state, step, chunk, hash_state=check_leaves or rebuilds)
        except RoundingLogError as exc:
            if chunk is None:
                raise
            raise UnfitChunkError(f"step {step}: {exc}", step) from exc
        if (check_leaves or rebuilds) and result.state_hash != t.leaf(step):
            if rebuilds and chunk is not None:
                raise UnfitChunkError(f"step {step}: with its log the state is not leaf {step}", step)
            raise TranscriptError(
                f"replaying step {step} with its own log chunk does not reproduce leaf {step}: "
                "the transcript and its checkpoints disagree"
            )


def replayed(
    t: Transcript,
    engine: StepEngine,
    start: Callable[[], TrainState],
    last: int,
    *,
    check_leaves: bool = True,
) -> TrainState:
    """The state after ``last``: ``start()`` (a state at some step before it), replayed forward by
    :func:`replay_forward`, from ``start()`` again without the log of each step whose chunk did not
    fit (once a step, so at most as many starts as such chunks)."""
    without: set[int] = set()
    while True:
        state = start()
        first = state.step + 1
        try:
            replay_forward(t, engine, state, first, last, check_leaves=check_leaves, without=without)
            return state
        except UnfitChunkError as exc:
            log.info("%s; replaying again from step %d, that step without the log", exc, first)
            without.add(exc.step)


def own_start(t: Transcript, engine: StepEngine, step: int) -> Callable[[], TrainState]:
    """Where a party that checked every leaf up to ``step`` against its own replay (an auditor, a
    trainer resuming its own run) starts a rebuild of the state after ``step`` (:func:`replayed`):
    the latest checkpoint at or before it that is there and hashes to its leaf, else the task's
    initial state, ``engine``'s own. A checkpoint missing or altered (nothing checks them before a
    replay) costs time, never the audit or the run."""
    for ckpt in reversed([s for s in t.checkpoint_steps() if s <= step]):
        try:
            data = t.load_checkpoint(ckpt)
        except TranscriptError as exc:
            log.warning("%s; starting the rebuild of step %d from an earlier state", exc, step)
            continue
        return partial(decode_state, data, t.config)
    return engine.init_state


def state_after(t: Transcript, engine: StepEngine, step: int, *, check_leaves: bool = True) -> TrainState:
    """State after ``step``: the nearest checkpoint (verified against its leaf), replayed forward
    (:func:`replayed`; an asynchronous task's by its schedule: :func:`~.scheduled.states_for`)."""
    if t.config.scheduled:
        return states_for(t, engine, [step], check_leaves=check_leaves)[0]
    ckpt = t.nearest_checkpoint(step)
    data = t.load_checkpoint(ckpt)
    return replayed(t, engine, lambda: decode_state(data, t.config), step, check_leaves=check_leaves)


def check_replayable(t: Transcript, step: int) -> None:
    """Refuse a step that transcript ``t`` cannot re-run alone: step 0 (no step made it), or one
    past its last leaf."""
    available = min(t.steps, len(t.leaves()) - 1)
    if not 1 <= step <= available:
        raise TranscriptError(f"step {step} is out of range: replay-step takes a step in 1..{available}")


@trimmed()
def replay_transcript_step(transcript_dir: Path | str, step: int, profile: str) -> ReplayResult:
    """Re-run ``step`` from the state at ``step - 1`` with chunk ``step``; compare with leaf ``step``.
    A chunk that does not decode or fit raises, as the step does: what the judge posts for it is
    ``game.judgeupdate.judged_step``'s."""
    t = Transcript(transcript_dir)
    check_replayable(t, step)
    engine = engine_for(t.config, profile)
    if t.config.scheduled:
        entry = t.schedule()[step - 1]
        state, found = states_for(t, engine, {step - 1, *entry.versions})
        replay_update(engine, state, step, t.chunk_bytes(step), found)
        leaf = state_hash(state)
        return ReplayResult(step=step, state_hash=leaf, matches_transcript=leaf == t.leaf(step))
    state = state_after(t, engine, step - 1)
    result = replay_step(engine, state, step, t.read_log(step))
    return ReplayResult(step=step, state_hash=result.leaf, matches_transcript=result.leaf == t.leaf(step))


__all__ = [
    "ReplayResult",
    "check_replayable",
    "own_start",
    "replay_forward",
    "replay_step",
    "replay_transcript_step",
    "replayed",
    "state_after",
]
