"""The judge's re-run of a pinned step (:func:`rerun_step`) or of an asynchronous task's update
(:func:`rerun_update`), the same re-run of a transcript's step for anyone (:func:`judged_step`,
``vgame replay-step``), and the states and chunks an update's ruling needs.

One rule for every chunk: the judge never rules for a log chunk that does not decode, does not fit
the step's computation, or breaks the bands. It posts :func:`rejected_log_hash`, which no state
has, whatever the step would compute without the log. A run without the log rounds each value to
its nearest neighbour, and a value near a midpoint rounds so differently on different hardware
(that is what the log is for): had the judge ruled on that run, an honest auditor on other
hardware than the judge's could dispute such a step and lose. An honest trainer's chunk always
fits, so the rule costs no honest trainer anything.

Why apart from :mod:`game.judge`: the rulings are pure functions of inputs the chain vouches for.
An asynchronous update ``u`` computes on its pre-state (leaf ``u - 1``, agreed in the game) and on
older states its chunk's schedule names (:mod:`game.training.log.schedule`); the judge takes each
with the proof of its leaf in the committed state tree (``Evidence.versions``, checked in
``Evidence.check``), re-runs the update from them, and rules against the trainer where the schedule
breaks the task's rules or does not parse. One rule spans updates: a micro-batch is applied once.
An update that applies one an earlier update applied is ruled against the trainer on the earlier
update's chunk, proved against the log root (``Evidence.earlier``, found by :func:`find_witness`):
the auditor pins the first such update, whose pre-state is agreed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from game import untrusted
from game.errors import RoundingLogError, TranscriptError
from game.evidence import versions_named
from game.training.engine.memory import trimmed
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME

if TYPE_CHECKING:
    from game.training.engine.replay import ReplayResult
    from game.training.engine.step import StepEngine
    from game.training.log.schedule import MicroBatchId, ScheduleEntry
    from game.training.state.tensors import TrainState
    from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)


def rejected_log_hash(step: int, reason: str) -> bytes:
    """What the judge posts for a tampered log: domain-separated, so it equals no state hash (those
    hash canonical state bytes, which start with ``vgame-state-v1``)."""
    return hashlib.sha256(b"vgame-rejected-log-v1\0" + step.to_bytes(8, "little") + reason.encode()).digest()


@trimmed()
def judged_step(transcript_dir: Path | str, step: int, profile: str) -> ReplayResult:
    """What a judge on ``profile`` posts for step ``step`` of a transcript (``vgame replay-step``):
    the step re-run from the states before it, rebuilt through the transcript, by the ruling's own
    rules (:func:`rerun_step`, :func:`rerun_update`), so a chunk the judge rules against gives the
    rejected-log hash and says why instead of raising."""
    from game.training.engine.replay import ReplayResult, check_replayable, state_after
    from game.training.engine.scheduled import states_for
    from game.training.engine.step import engine_for
    from game.training.transcript.reader import Transcript

    t = Transcript(transcript_dir)
    check_replayable(t, step)
    engine = engine_for(t.config, profile, checks="rebuild")  # the states before: agreed, rebuilt
    chunk = t.chunk_bytes(step)
    if t.config.scheduled:
        _, found = states_for(t, engine, {step - 1, *versions_named(t.config, chunk, step)})
        witness = find_witness(t, chunk, step)
        earlier = dict([witness]) if witness is not None else {}
        leaf, note = rerun_update(engine, found[step - 1], found, chunk, step, earlier)
    else:
        leaf, note = rerun_step(engine, state_after(t, engine, step - 1), chunk, step)
    return ReplayResult(step=step, state_hash=leaf, matches_transcript=leaf == t.leaf(step), rejected=note)


def rerun_step(
    engine: StepEngine, pre_state: TrainState | bytes, chunk: bytes, step: int
) -> tuple[bytes, str]:
    """A synchronous task's step ``step``, re-run from its pre-state with its log chunk: the leaf of
    the state it reaches, or the rejected-log hash for a chunk that breaks the bands, does not
    decode or does not fit; with a note saying which."""
    from game.training.engine.replay import replay_step

    try:
        with engine.checking("judge"):
            return replay_step(engine, pre_state, step, chunk).leaf, ""
    except RoundingLogError as exc:
        return _rejected(step, exc)


def rerun_update(
    engine: StepEngine,
    pre_state: bytes,
    versions: dict[int, bytes],
    chunk: bytes,
    step: int,
    earlier: Mapping[int, bytes] | None = None,
) -> tuple[bytes, str]:
    """An asynchronous task's update ``step``: re-run from the pre-state and the versions its
    schedule names, with its log. A schedule that breaks the task's rules (or does not parse),
    or applies a micro-batch that one of the ``earlier`` updates' chunks applied, is ruled against
    the trainer with a hash no state has, as a log that breaks the bands, does not decode or does
    not fit is."""
    from game.training.engine.scheduled import replay_update
    from game.training.log.schedule import ScheduleError

    try:
        versions_named(engine.cfg, chunk, step, strict=True)
        for w, data in sorted((earlier or {}).items()):
            again = repeated_micro(engine.cfg, chunk, step, data, w)
            if again is not None:
                raise ScheduleError(f"update {step}: micro-batch {again} was applied by update {w} already")
        with engine.checking("judge"):
            state, _, _ = replay_update(engine, pre_state, step, chunk, versions)
    except ScheduleError as exc:
        log.info("update %d: ruled against the trainer: %s", step, exc)
        return rejected_log_hash(step, str(exc)), f"schedule rejected: {exc}"
    except RoundingLogError as exc:
        return _rejected(step, exc)
    from game.training.state.leaves import state_hash

    return state_hash(state), ""


def _rejected(step: int, exc: RoundingLogError) -> tuple[bytes, str]:
    """The ruling on step ``step``'s chunk that ``exc`` rejects, and its note: never for the
    trainer, whatever the step computes without the log (the module's docstring says why)."""
    from game.training.numerics.bandcheck import LogTamperingError

    # a direction outside its band: the trainer steered its rounding
    what = "log rejected" if isinstance(exc, LogTamperingError) else "log does not decode or fit"
    log.info("step %d: %s (%s); ruling against the trainer", step, what, exc)
    return rejected_log_hash(step, str(exc)), f"{what}: {exc}"


def rebuilt_state(t: Transcript, engine: StepEngine, step: int, want: bytes) -> bytes:
    """The judge's rebuild: state bytes after ``step`` that hash to ``want`` (the agreed leaf, or a
    named version's), replayed through the trainer's chunks from the latest checkpoint the judge's
    copy holds that loads, else the initial state (an asynchronous task's ``states_for`` passes over
    a bad one itself). ``engine`` checks as a rebuild (``checks`` ``rebuild``), so the leaves on the
    way say which steps an auditor ran without their log; the state reached is held to ``want``
    whatever it started from. :class:`~game.evidence.PreStateEvidenceError` where it cannot be."""
    from game.evidence import PreStateEvidenceError
    from game.training.engine.replay import own_start, replayed, state_after
    from game.training.state.canonical import encode_state
    from game.training.state.leafhash import leaf_of

    try:
        if t.config.scheduled:
            state = state_after(t, engine, step, check_leaves=False)
        else:
            state = replayed(t, engine, own_start(t, engine, step), step, check_leaves=False)
    except (TranscriptError, RoundingLogError) as exc:
        raise PreStateEvidenceError(f"cannot rebuild the state after step {step}: {exc}") from exc
    data = encode_state(state)
    if leaf_of(data) != want:
        raise PreStateEvidenceError(f"replaying the transcript does not reproduce the agreed leaf {step}")
    return data


def staleness_of(dest: Path) -> int:
    """The ``max_staleness`` of the task whose transcript files are in ``dest`` (0 until its
    manifest is there, or where it does not say)."""
    try:
        config = untrusted.loads((dest / MANIFEST_NAME).read_bytes())["config"]
        return int(config.get("max_staleness", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _entry(cfg: TaskConfig, chunk: bytes, step: int) -> ScheduleEntry | None:
    """The schedule entry of update ``step``'s chunk (None where it does not parse)."""
    from game.training.log.schedule import open_envelope

    try:
        return open_envelope(chunk, step=step, spec_hash=cfg.spec_hash())[0]
    except RoundingLogError:
        return None


def repeated_micro(cfg: TaskConfig, chunk: bytes, step: int, witness: bytes, w: int) -> MicroBatchId | None:
    """A micro-batch that update ``step`` (its ``chunk``) applies and that an earlier update ``w``
    (its chunk ``witness``) applied: None where there is none, or either chunk does not parse."""
    from game.training.log.schedule import repeated_in

    if not 1 <= w < step:
        return None
    entry, before = _entry(cfg, chunk, step), _entry(cfg, witness, w)
    if entry is None or before is None:
        return None
    return repeated_in(entry, before)


def find_witness(t: Transcript, chunk: bytes, step: int) -> tuple[int, bytes] | None:
    """The first earlier update of transcript ``t`` whose chunk applied a micro-batch that update
    ``step`` (its ``chunk``) applies again: what the judge shows to rule on it."""
    return witness_among(t.config, chunk, step, t.chunk_bytes)


def witness_among(
    cfg: TaskConfig, chunk: bytes, step: int, chunk_of: Callable[[int], bytes]
) -> tuple[int, bytes] | None:
    """:func:`find_witness` over the chunks ``chunk_of`` gives (a transcript's, or the log posted
    on-chain). Reads every earlier chunk of an honest schedule, so only an asynchronous task's
    ruling pays for it."""
    if not cfg.scheduled or _entry(cfg, chunk, step) is None:
        return None
    for w in range(1, step):
        try:
            data = chunk_of(w)
        except (TranscriptError, RoundingLogError):
            continue  # not a witness; the judge rules on what it can show
        if repeated_micro(cfg, chunk, step, data, w) is not None:
            return w, data
    return None


__all__ = [
    "find_witness",
    "judged_step",
    "rebuilt_state",
    "rejected_log_hash",
    "repeated_micro",
    "rerun_step",
    "rerun_update",
    "staleness_of",
    "witness_among",
]
