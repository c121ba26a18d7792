"""Training and re-running by a schedule in one process: the reference trainer of an application
schedule, the states a replay needs, and the judge's re-run of one update.

An asynchronous task's update ``u`` computes each micro-batch on the state its entry names (a
*version*, :mod:`game.training.log.schedule`), so re-running it needs more than state ``u - 1``:
every version it names. A replay keeps those it will still need (:func:`~game.training.log.schedule.
last_uses`) as weights (parameters and buffers), and a transcript keeps a checkpoint of each state
that an update after a later checkpoint computes on (:func:`own_checkpoints`), so a replay from
any checkpoint finds every version it needs at or after that checkpoint, or in a file of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from game.errors import ConfigError, RoundingLogError, TranscriptError, UnfitChunkError
from game.fsio import exclusive_directory
from game.training.engine.memory import trimmed
from game.training.engine.runtime import Batch
from game.training.engine.states import check_reloads, decode_state
from game.training.engine.step import StepEngine, engine_for
from game.training.engine.update import UpdateEngine, Weights, weights_from_bytes, weights_of
from game.training.log.formats import ChunkLog, decode_scheduled, schedule_entry
from game.training.log.schedule import ScheduledLog, ScheduleEntry, ScheduleError, check_schedule, last_uses
from game.training.state.canonical import encode_state
from game.training.state.leaves import state_hash
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.manifest import is_checkpoint_step, make_transcript_dir
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)


def next_checkpoint(step: int, cfg: TaskConfig) -> int:
    """The first checkpoint step after ``step`` (the last step keeps one)."""
    k = cfg.checkpoint_interval
    return min((step // k + 1) * k, cfg.steps)


def own_checkpoints(entries: Iterable[ScheduleEntry], cfg: TaskConfig) -> set[int]:
    """The states a transcript checkpoints besides the interval's: each one an update computes on
    across a checkpoint (version ``v`` used by update ``u`` with a checkpoint step between them)."""
    out: set[int] = set()
    for entry in entries:
        for v in entry.versions:
            if (
                not is_checkpoint_step(v, cfg.checkpoint_interval, cfg.steps)
                and next_checkpoint(v, cfg) < entry.update
            ):
                out.add(v)
    return out


def check_entry(entry: ScheduleEntry, cfg: TaskConfig) -> None:
    """:meth:`ScheduleEntry.check` with the task's numbers; a synchronous task's entry must be the
    synchronous one."""
    entry.check(accumulate=cfg.accumulate, steps=cfg.steps, max_staleness=cfg.max_staleness)
    if not cfg.scheduled and entry != ScheduleEntry.sync(entry.update, cfg.accumulate):
        raise ScheduleError(
            f"update {entry.update}: a synchronous task's update applies its own step's micro-batches"
        )


@trimmed()
def train_scheduled(
    cfg: TaskConfig,
    profile: str,
    out_dir: Path | str,
    schedule: Sequence[ScheduleEntry],
    *,
    poison: Mapping[int, Batch] | None = None,
) -> Transcript:
    """Train ``cfg`` in one process by ``schedule`` (one entry an update) into a new transcript.

    What a parameter server records, without its servers: the reference its transcripts are held
    to, and an asynchronous task's trainer on one machine. ``poison``: data steps whose batch a
    dishonest trainer replaces (tests of the game)."""
    problems = check_schedule(
        schedule, accumulate=cfg.accumulate, steps=cfg.steps, max_staleness=cfg.max_staleness
    )
    if not problems:
        for entry in schedule:
            try:
                check_entry(entry, cfg)
            except ScheduleError as exc:
                problems.append(str(exc))
    if problems:
        raise ConfigError(f"the schedule breaks the task's rules: {'; '.join(problems[:3])}")
    out = Path(out_dir)
    engine = engine_for(cfg, profile)
    make_transcript_dir(out)
    with exclusive_directory(out, f"{out} is being written by another process"):
        return write_scheduled(engine, profile, out, schedule, poison=poison)


def write_scheduled(
    engine: StepEngine,
    profile: str,
    out: Path,
    schedule: Sequence[ScheduleEntry],
    *,
    poison: Mapping[int, Batch] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Transcript:
    """:func:`train_scheduled` in a directory the caller holds (a checked schedule). A transcript
    there that a run left unfinished is gone on with from its last complete update, whose entries
    must be ``schedule``'s."""
    cfg = engine.cfg
    ue = UpdateEngine(engine, dict(poison or {}))
    uses = last_uses(schedule)
    resuming = (out / MANIFEST_NAME).exists()
    writer = TranscriptWriter.resume(out, cfg) if resuming else TranscriptWriter.create(out, cfg, profile)
    writer.extra_checkpoints = own_checkpoints(schedule, cfg)
    with writer:
        done = writer.num_done - 1
        if done < 0:
            state = engine.init_state()
            writer.append_step(0, state_hash(state), _empty(cfg, 0), encode_state(state))
            kept: dict[int, Weights] = {0: weights_of(state)}
            done = 0
        else:
            state, kept = _went_to(engine, out, schedule, done)
        first = done + 1
        for entry in schedule[done:]:
            u = entry.update
            step_log, _, _ = ue.run_update(
                state, [(a, kept[a.version]) for a in entry.applied], mode="record"
            )
            assert step_log is not None
            chunk = ScheduledLog(entry, step_log) if cfg.scheduled else step_log
            data = encode_state(state)
            if u == first:  # the optimizer's state exists now
                check_reloads(data, cfg)
            writer.append_step(u, state_hash(state), chunk, data if writer.wants_checkpoint(u) else None)
            if uses.get(u, 0) > u:
                kept[u] = weights_of(state)
            for v in [v for v in kept if uses.get(v, 0) <= u]:
                del kept[v]
            if progress is not None:
                progress(u, cfg.steps)
        writer.finish()
    return Transcript(out)


def _went_to(
    engine: StepEngine, out: Path, schedule: Sequence[ScheduleEntry], done: int
) -> tuple[TrainState, dict[int, Weights]]:
    """Where an unfinished transcript's run got to: state ``done`` and the weights of every state up
    to it that the rest of ``schedule`` computes on (rebuilt from checkpoints and the log)."""
    t = Transcript(out)
    for u in range(1, done + 1):
        if t.update_entry(u) != schedule[u - 1]:
            raise TranscriptError(
                f"{out} holds a run whose update {u} applied another schedule; delete it and train again"
            )
    needed = {v for e in schedule[done:] for v in e.versions if v <= done} | {done}
    state, found = states_for(t, engine, needed)
    log.info("going on from update %d of %s", done, out)
    return state, {v: weights_from_bytes(found[v]) for v in needed}


def _empty(cfg: TaskConfig, step: int) -> ChunkLog:
    from game.training.log.formats import new_step_log

    return new_step_log(cfg.log_format, step)


def replay_update(
    engine: StepEngine | UpdateEngine,
    pre_state: TrainState | bytes,
    step: int,
    chunk: bytes,
    versions: Mapping[int, Weights | bytes] | None = None,
    *,
    use_log: bool = True,
) -> tuple[TrainState, ScheduleEntry, int]:
    """Re-run update ``step`` from state ``step - 1`` (``pre_state``) and the states its schedule
    names (``versions``, by leaf index: weights or canonical bytes), with the committed chunk: the
    judge's primitive for an asynchronous task. A synchronous task's plain chunk needs no
    versions. ``use_log`` False runs it without the chunk's log (a log that does not fit), which is
    then not decoded: a log that does not decode is run without as one that does not fit is. Raises
    :class:`ScheduleError` for an entry that breaks the task's rules. Returns the state after the
    update (``pre_state`` itself when given as a state), the entry and the corrections applied."""
    ue = engine if isinstance(engine, UpdateEngine) else UpdateEngine(engine)
    state = pre_state if isinstance(pre_state, TrainState) else decode_state(pre_state, ue.cfg)
    spec_hash = ue.cfg.spec_hash()
    if use_log:
        entry, step_log = decode_scheduled(chunk, spec_hash, step)
    else:
        entry, step_log = schedule_entry(chunk, spec_hash, step), None
    entry = entry_for(entry, step, ue.cfg)
    have: dict[int, Weights] = {
        v: weights_from_bytes(w) if isinstance(w, bytes | bytearray) else w
        for v, w in (versions or {}).items()
    }
    return state, entry, run_entry(ue, state, entry, step_log, have)


def entry_for(entry: ScheduleEntry | None, step: int, cfg: TaskConfig) -> ScheduleEntry:
    """The entry update ``step`` runs by: its chunk's (``entry``; None for a plain chunk, which only
    a synchronous task's may be, whose entry is then the sync one), checked against the task's
    rules (:class:`ScheduleError` where it breaks them)."""
    if entry is None:
        if cfg.scheduled:
            raise ScheduleError(f"update {step}: the task is asynchronous but the chunk carries no schedule")
        entry = ScheduleEntry.sync(step, cfg.accumulate)
    check_entry(entry, cfg)
    return entry


def run_entry(
    ue: UpdateEngine,
    state: TrainState,
    entry: ScheduleEntry,
    step_log: ChunkLog | None,
    versions: Mapping[int, Weights],
) -> int:
    """Run update ``entry.update`` on ``state`` (state ``update - 1``, in place) from the weights of
    the states it names (``versions``, which may include the state's own), with ``step_log`` (None: without
    a log, rounding to nearest). Returns the corrections applied."""
    step = entry.update
    have = {step - 1: weights_of(state), **versions}
    missing = [v for v in entry.versions if v not in have]
    if missing:
        raise TranscriptError(f"update {step} computes on states {missing}, which were not given")
    work = [(a, have[a.version]) for a in entry.applied]
    if step_log is not None:
        return ue.run_update(state, work, mode="replay", log=step_log)[2]
    return ue.run_update(state, work, mode="round")[2]


def states_for(
    t: Transcript, engine: StepEngine, wanted: Iterable[int], *, check_leaves: bool = True
) -> tuple[TrainState, dict[int, bytes]]:
    """The state after ``max(wanted)`` and the canonical bytes of every state in ``wanted``, replayed
    from the latest checkpoint that needs nothing before it but states with checkpoints of their own.
    Every leaf on the way is checked against the transcript's (unless ``check_leaves`` is False and
    ``engine`` does not rebuild: an update whose state with its log misses its leaf then runs
    again without the log, as :func:`~.replay.replay_forward` says).
    An update whose log does not decode runs without it, as the auditor and the judge run it; one
    whose log decodes but does not fit leaves the state half-updated, so the replay starts again
    with that update run without its log (once an update). A checkpoint that is missing or does not
    hash to its leaf is passed over, and the task's initial state stands in for checkpoint 0: the
    trainer publishes its checkpoints, and ``Transcript.verify`` checks none."""
    wanted = sorted(set(wanted))
    last = wanted[-1]
    raw: dict[int, ScheduleEntry | None] = {}

    def between(lo: int, hi: int) -> list[ScheduleEntry]:
        """The entries of updates ``lo + 1 .. hi``, read once each (a judge holds only those chunks;
        a plain chunk's is the sync one here, which :func:`entry_for` refuses an asynchronous task)."""
        for u in range(lo + 1, hi + 1):
            if u not in raw:
                raw[u] = t.update_entry(u)
        return [raw[u] or ScheduleEntry.sync(u, t.config.accumulate) for u in range(lo + 1, hi + 1)]

    def load(v: int) -> bytes:
        try:
            return t.load_checkpoint(v)
        except TranscriptError as exc:
            if v == 0:  # the task's own initial state, the same on every machine
                log.warning("%s; starting from the task's initial state", exc)
                return encode_state(engine.init_state())
            raise _PassedOver(v) from exc

    passed_over: set[int] = set()
    while True:
        files = {0, *t.checkpoint_steps()} - passed_over
        start = max(f for f in files if f <= wanted[0])
        while True:
            before = {v for e in between(start, last) for v in e.versions if v < start}
            missing = sorted(before - files)
            if not missing:
                break
            start = max(f for f in files if f <= missing[0])
        try:
            return _replay_from(t, engine, start, before, wanted, raw, load, check_leaves)
        except _PassedOver as exc:
            log.warning("checkpoint %d is missing or altered; starting from an earlier one", exc.step)
            passed_over.add(exc.step)


class _PassedOver(TranscriptError):
    """Checkpoint ``step`` could not be loaded: :func:`states_for` plans again without it."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


def _replay_from(
    t: Transcript,
    engine: StepEngine,
    start: int,
    before: set[int],
    wanted: list[int],
    raw: Mapping[int, ScheduleEntry | None],
    load: Callable[[int], bytes],
    check_leaves: bool,
) -> tuple[TrainState, dict[int, bytes]]:
    """:func:`states_for`'s replay from checkpoint ``start`` (and the checkpoints of ``before``)."""
    last = wanted[-1]
    uses = last_uses(
        [raw[u] or ScheduleEntry.sync(u, t.config.accumulate) for u in range(start + 1, last + 1)]
    )
    ue = UpdateEngine(engine)
    without: set[int] = set()
    rebuilds = engine.checks == "rebuild"  # as replay.replay_forward: the leaves say where a log was not used
    while True:
        state = decode_state(load(start), t.config)
        kept: dict[int, Weights] = {v: weights_from_bytes(load(v)) for v in before}
        kept[start] = weights_of(state)
        found: dict[int, bytes] = {}
        if start in wanted:
            found[start] = encode_state(state)
        try:
            for u in range(start + 1, last + 1):
                _rerun(ue, state, u, entry_for(raw[u], u, t.config), t, kept, u in without)
                if (check_leaves or rebuilds) and state_hash(state) != t.leaf(u):
                    if rebuilds and u not in without:
                        raise UnfitChunkError(f"update {u}: with its log the state is not leaf {u}", u)
                    raise TranscriptError(
                        f"replaying update {u} with its own chunk does not reproduce leaf {u}"
                    )
                if uses.get(u, 0) > u:
                    kept[u] = weights_of(state)
                for v in [v for v in kept if uses.get(v, 0) <= u]:
                    del kept[v]
                if u in wanted:
                    found[u] = encode_state(state)
            return state, found
        except UnfitChunkError as exc:
            log.info("%s; replaying again from update %d, that update without its log", exc, start)
            without.add(exc.step)


def _rerun(
    ue: UpdateEngine,
    state: TrainState,
    u: int,
    entry: ScheduleEntry,
    t: Transcript,
    kept: Mapping[int, Weights],
    without_log: bool,
) -> None:
    """Update ``u`` run on ``state`` for :func:`states_for`: with its log, unless ``without_log`` or
    the log does not decode (nothing ran then); :class:`UnfitChunkError` where it decodes and does
    not fit."""
    step_log: ChunkLog | None = None
    if not without_log:
        try:
            step_log = t.read_log(u)
        except RoundingLogError as exc:
            log.info("update %d: the log does not decode (%s); replayed without it", u, exc)
    try:
        run_entry(ue, state, entry, step_log, kept)
    except RoundingLogError as exc:
        if step_log is None or isinstance(exc, ScheduleError):
            raise
        raise UnfitChunkError(f"update {u}: {exc}", u) from exc


__all__ = [
    "check_entry",
    "entry_for",
    "next_checkpoint",
    "own_checkpoints",
    "replay_update",
    "run_entry",
    "states_for",
    "train_scheduled",
    "write_scheduled",
]
