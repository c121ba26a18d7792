"""The trainer's loop (Algorithm 2): train a task and write its transcript, resuming a killed run.

:func:`train` records every step's rounding log and state hash into a transcript, and resumes a run
that was killed: the steps after the last checkpoint are replayed from the trainer's own log chunks
(:func:`~.replay.replay_forward`), which reproduces the lost state bit for bit, so a resumed
transcript equals an uninterrupted one byte for byte. A :class:`Deviation` makes the trainer
dishonest at chosen steps (the dishonest trainers themselves live in ``game.strategies``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rich import filesize

from game.errors import ConfigError, NonFiniteError, StateReloadError, TranscriptError, VGameError
from game.fsio import exclusive_directory
from game.training.engine.memory import trimmed
from game.training.engine.replay import own_start, replay_forward
from game.training.engine.scheduled import write_scheduled
from game.training.engine.states import check_reloads
from game.training.engine.step import StepEngine, engine_for
from game.training.log.formats import ChunkLog, new_step_log
from game.training.log.schedule import ScheduleEntry
from game.training.state.canonical import (
    encode_state,
    encode_streamed,
    encoded_size,
    hash_streamed,
    state_buffer,
)
from game.training.state.leafhash import leaf_of
from game.training.state.leaves import device_leaf
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig
from game.training.transcript.layout import LOG_DIR_NAME, MANIFEST_NAME
from game.training.transcript.manifest import make_transcript_dir, read_manifest
from game.training.transcript.reader import Transcript, steps_on_disk
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)

#: ``progress(done, total)`` is called after every step (for progress bars).
ProgressFn = Callable[[int, int], None]
#: ``observe(step, loss, state)`` is called after every step it runs (None: a skipped step's loss):
#: what `vgame train` shows as it trains, and where it evaluates the model every N steps.
ObserveFn = Callable[[int, "float | None", TrainState], None]


# ----------------------------------------------------------------------------------------------
# Deviations: how a dishonest trainer departs from the task (tests and demos of Invariant 2)
# ----------------------------------------------------------------------------------------------


class Deviation:
    """The honest trainer; subclass and override one method to deviate at chosen steps.

    Hooks are applied by :func:`train` only while recording (a resumed run replays its own log,
    so a deviation already on disk stays on disk).
    """

    def engine(self, step: int, honest: StepEngine) -> StepEngine:
        """The engine that runs ``step``: return another one for a wrong hyper-parameter."""
        return honest

    def batch(self, step: int) -> Any | None:
        """A batch to use instead of the task's batch (a poisoned batch), or ``None``."""
        return None

    def skip(self, step: int) -> bool:
        """True to skip ``step`` entirely: the state is not updated and the log chunk is empty."""
        return False

    def after_step(self, step: int, state: TrainState) -> None:
        """Change ``state`` in place after ``step`` (tampered weights)."""

    def tamper_log(self, step: int, step_log: ChunkLog) -> ChunkLog:
        """The log chunk actually published for ``step`` (a tampered log)."""
        return step_log


#: The trainer that departs from nothing.
_HONEST = Deviation()


class StepRunner:
    """How :func:`train`'s loop runs a step: in this process (this class), or a step's micro-batches
    on many workers (``game.training.parallel``, which overrides both hooks)."""

    def ready(self, state: TrainState | None, first: int) -> None:
        """Called once the run knows where it starts: the state after step ``first - 1`` (None,
        with ``first`` past the last step, when the transcript was already complete)."""

    def step(
        self, engine: StepEngine, writer: TranscriptWriter, state: TrainState, step: int, dev: Deviation
    ) -> float | None:
        """Run step ``step`` on ``state`` and queue it for the disk; its loss (None: skipped)."""
        return train_step(engine, writer, state, step, dev)


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` produced; roots are the values the trainer commits on-chain."""

    out_dir: Path
    spec_hash: bytes
    profile: str
    steps: int
    state_root: bytes
    log_root: bytes
    num_leaves: int
    steps_run: int  # steps computed by this call (0 when the transcript was already complete)
    resumed_from: int | None  # last complete step found on disk, None for a fresh run
    log_bytes: int  # total size of the log chunks on disk
    final_loss: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "spec_hash": self.spec_hash.hex(),
            "profile": self.profile,
            "steps": self.steps,
            "num_leaves": self.num_leaves,
            "state_root": self.state_root.hex(),
            "log_root": self.log_root.hex(),
            "steps_run": self.steps_run,
            "resumed_from": self.resumed_from,
            "log_bytes": self.log_bytes,
            "final_loss": self.final_loss,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> TrainResult:
        """The inverse of :meth:`to_dict` (a result another process wrote)."""
        return cls(
            out_dir=Path(doc["out_dir"]),
            spec_hash=bytes.fromhex(doc["spec_hash"]),
            profile=str(doc["profile"]),
            steps=int(doc["steps"]),
            state_root=bytes.fromhex(doc["state_root"]),
            log_root=bytes.fromhex(doc["log_root"]),
            num_leaves=int(doc["num_leaves"]),
            steps_run=int(doc["steps_run"]),
            resumed_from=None if doc["resumed_from"] is None else int(doc["resumed_from"]),
            log_bytes=int(doc["log_bytes"]),
            final_loss=None if doc["final_loss"] is None else float(doc["final_loss"]),
        )


# ----------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------


def _non_finite_hint(message: str, step: int) -> str:
    """What to say of NaN or an overflow in step ``step``: past step 1, or in step 1's update, the
    training diverged; in step 1's forward or backward pass, from the model as built, it is more
    likely the model's own arithmetic on values it masks out later."""
    if step > 1 or "aten._foreach_" in message:  # an optimizer's op: the update overflowed
        return (
            f"{message}: the training diverged, and a transcript cannot commit NaN or an overflow; going "
            f"on from step {step - 1} would only diverge again: change the task (a smaller lr first)"
        )
    return (
        f"{message}: at step 1, from the model as built, so more likely the model's own arithmetic than "
        "a divergence (the log of a negative, 0 * inf or inf - inf on values it masks out afterwards): "
        "vgame rounds finite values and lets an inf pass, but a NaN's bits differ by device, so "
        "compute such values only where they are used (torch.where on the input, a clamp before the log)"
    )


@trimmed()  # a node idles on after: give the step's memory back
def train(
    cfg: TaskConfig,
    profile: str,
    out_dir: Path | str,
    *,
    progress: ProgressFn | None = None,
    deviation: Deviation | None = None,
    observe: ObserveFn | None = None,
    runner: StepRunner | None = None,
) -> TrainResult:
    """Algorithm 2: train ``cfg`` on ``profile`` and write (or finish) the transcript in ``out_dir``.

    The directory is this process's alone while it runs: a second `vgame train` (or trainer node)
    on it stops at once with :class:`~game.errors.DirectoryInUse` instead of cutting and appending steps under
    the first one's feet. ``runner``: how a step runs (:class:`StepRunner`: here, by default)."""
    out = Path(out_dir)
    engine = engine_for(cfg, profile)  # an unknown or absent profile is refused before a file is made
    make_transcript_dir(out)
    busy = (
        f"{out} is being written by another process (a `vgame train` or a trainer node); "
        "let it finish, or stop it and run this again to go on from its last step"
    )
    with exclusive_directory(out, busy):
        return _train_alone(
            engine, profile, out, progress=progress, deviation=deviation, observe=observe, runner=runner
        )


def _train_alone(
    engine: StepEngine,
    profile: str,
    out: Path,
    *,
    progress: ProgressFn | None,
    deviation: Deviation | None,
    observe: ObserveFn | None = None,
    runner: StepRunner | None = None,
) -> TrainResult:
    """:func:`train` once the directory is held."""
    cfg = engine.cfg
    dev = deviation or Deviation()
    run = runner or StepRunner()
    resumed_from: int | None = None
    state: TrainState | None = None
    if cfg.scheduled and runner is not None:
        raise ConfigError(
            "an asynchronous task (max_staleness > 0) trains in one process or with `vgame ps train`, "
            "not with --workers"
        )
    created = not (out / MANIFEST_NAME).exists()  # by this run, below
    if cfg.scheduled and created:
        return _train_by_schedule(engine, profile, out, dev, progress)
    if not created:
        existing = read_manifest(out)
        if existing.spec_hash != cfg.spec_hash().hex():
            raise TranscriptError(
                f"{out} holds a transcript of another task (spec {existing.spec_hash[:16]}...); "
                "choose another --out or delete it"
            )
        if existing.complete:
            log.info("transcript at %s is already complete; nothing to do", out)
            run.ready(None, cfg.steps + 1)
            return _result(Transcript(out), existing.profile, steps_run=0, resumed_from=cfg.steps, loss=None)
        if existing.profile != profile:  # its manifest names one profile, and says what ran the steps
            raise TranscriptError(
                f"{out} was started on profile {existing.profile!r}, not {profile!r}: go on with "
                f"--profile {existing.profile}, or train afresh in another --out"
            )
        if cfg.scheduled:  # the synchronous schedule, from its last complete update
            return _train_by_schedule(engine, profile, out, dev, progress)
        writer = TranscriptWriter.resume(out, cfg)
        if writer.num_done > 0:
            resumed_from = writer.num_done - 1
            state = _rebuild_state(out, cfg, engine, writer.leaves)
    else:
        # the model is built before anything is written: a task whose code raises, or whose model
        # is refused, leaves no transcript for a second run (with the code fixed) to trip over; one
        # refused in step 1 has its leaf 0 taken away again (below)
        state = engine.init_state()
        writer = TranscriptWriter.create(out, cfg, profile)
    try:
        return _write_steps(writer, engine, state, out, profile, run, dev, progress, observe, resumed_from)
    except VGameError as exc:
        # refused in step 1 (leaf 0 alone on disk), or by the check after it (and step 1): the run
        # with the code fixed is not refused into this transcript as another task's; a run that
        # failed later keeps the steps it finished
        if created and writer.num_done <= (2 if isinstance(exc, StateReloadError) else 1):
            writer.discard()
        raise


def _write_steps(
    writer: TranscriptWriter,
    engine: StepEngine,
    state: TrainState | None,
    out: Path,
    profile: str,
    run: StepRunner,
    dev: Deviation,
    progress: ProgressFn | None,
    observe: ObserveFn | None,
    resumed_from: int | None,
) -> TrainResult:
    """Leaf 0 where it is not on disk yet, then the steps ``writer`` lacks, and the roots."""
    cfg = engine.cfg
    steps_run = 0
    with writer:  # on any error, the steps already computed still reach the disk
        if writer.num_done == 0:
            state = initial_step(engine, writer, dev, state)
        assert state is not None  # built above, or rebuilt from the transcript's last leaf
        run.ready(state, writer.num_done)
        loss: float | None = None
        for step in range(writer.num_done, cfg.steps + 1):
            try:
                step_loss = run.step(engine, writer, state, step, dev)
            except NonFiniteError as exc:
                raise NonFiniteError(_non_finite_hint(str(exc), step)) from exc
            loss = step_loss if step_loss is not None else loss
            steps_run += 1
            if steps_run == 1:  # the optimizer's state exists now: a checkpoint has its full size
                check_reloads(encode_state(state), cfg)
                _warn_if_no_room(out, cfg, state, step)
            if observe is not None:
                observe(step, step_loss, state)
            if progress is not None:
                progress(step, cfg.steps)
        writer.finish()
    return _result(Transcript(out), profile, steps_run=steps_run, resumed_from=resumed_from, loss=loss)


def _train_by_schedule(
    engine: StepEngine, profile: str, out: Path, dev: Deviation, progress: ProgressFn | None
) -> TrainResult:
    """One process training an asynchronous task (``max_staleness`` > 0): the synchronous schedule,
    written with each update's entry in its chunk (:mod:`.scheduled`); a deviation may only poison
    batches here."""
    cfg = engine.cfg
    hooks = ("engine", "skip", "after_step", "tamper_log")
    if any(getattr(type(dev), h) is not getattr(Deviation, h) for h in hooks):
        raise ConfigError("an asynchronous task trains with a deviation that poisons batches only")
    poison = {s: b for s in range(1, cfg.steps + 1) if (b := dev.batch(s)) is not None}
    schedule = [ScheduleEntry.sync(u, cfg.accumulate) for u in range(1, cfg.steps + 1)]
    before = steps_on_disk(out) - 1 if (out / MANIFEST_NAME).exists() else -1  # a run that stopped
    t = write_scheduled(engine, profile, out, schedule, poison=poison, progress=progress)
    resumed = before if before >= 0 else None
    return _result(t, profile, steps_run=cfg.steps - max(before, 0), resumed_from=resumed, loss=None)


class StepProbe(NamedTuple):
    """What :func:`probe_steps` measured."""

    seconds: float  # wall seconds of a step, its state hashed (the second one where there are two)
    chunk_bytes: int  # the larger of the steps' encoded log chunks


def probe_steps(cfg: TaskConfig, profile: str) -> StepProbe:
    """The first two recorded steps of ``cfg`` on ``profile``, from the initial state: how long a
    step takes (the second: the first pays for what a process does once, imports and kernels
    loaded) and how large a chunk is. A trainer node weighs a task's commit window and the chunks it
    may have to post on-chain by them before it accepts (``game.protocol.terms``)."""
    engine = engine_for(cfg, profile)
    state = engine.init_state()
    seconds, size = 0.0, 0
    for step in range(1, min(cfg.steps, 2) + 1):
        start = time.perf_counter()
        result = engine.run_step(state, step, mode="record")
        seconds = time.perf_counter() - start
        assert result.log is not None
        size = max(size, len(result.log.encode(step, cfg.spec_hash())))
    return StepProbe(seconds, size)


def checkpoints_after(step: int, cfg: TaskConfig) -> int:
    """How many checkpoints a run keeps in steps ``step + 1 .. cfg.steps``."""
    k, last = cfg.checkpoint_interval, cfg.steps
    if step >= last:
        return 0
    return last // k - step // k + (1 if last % k else 0)


def _warn_if_no_room(out: Path, cfg: TaskConfig, state: TrainState, step: int) -> None:
    """Say at the start, not hours later, when the checkpoints still to come do not fit on the
    transcript's disk (the log comes on top). The run still goes on: a full disk stops it with
    every step so far kept, and it goes on from there when run again with room."""
    count, each = checkpoints_after(step, cfg), encoded_size(state)
    free = shutil.disk_usage(out).free
    if count * each > free:
        log.warning(
            "the %d checkpoints still to come need %s (%s each, one every %d steps) and %s has %s "
            "free: the run will stop when the disk is full, every step so far kept (free some space "
            "and run it again to go on; a new task may raise checkpoint_interval)",
            count,
            filesize.decimal(count * each),
            filesize.decimal(each),
            cfg.checkpoint_interval,
            out,
            filesize.decimal(free),
        )


def initial_step(
    engine: StepEngine,
    writer: TranscriptWriter,
    dev: Deviation | None = None,
    state: TrainState | None = None,
) -> TrainState:
    """Step 0 of :func:`train`: the fresh state (``state``, or built here), queued for the disk with its
    leaf and checkpoint."""
    dev = dev or _HONEST
    state = state if state is not None else engine.init_state()
    dev.after_step(0, state)  # a deviation may tamper with the initial state too
    queue_step(writer, 0, state, dev.tamper_log(0, new_step_log(engine.cfg.log_format, 0)))
    return state


def train_step(
    engine: StepEngine, writer: TranscriptWriter, state: TrainState, step: int, dev: Deviation | None = None
) -> float | None:
    """One step of :func:`train`: run it (or skip it) and queue it, with the state, for the disk.
    Returns the step's loss (None for a skipped step). ``vgame bench overhead`` times this."""
    dev = dev or _HONEST
    loss: float | None = None
    if dev.skip(step):
        step_log: ChunkLog = new_step_log(engine.cfg.log_format, step)
        state.step = step
    else:
        result = dev.engine(step, engine).run_step(
            state, step, mode="record", batch_override=dev.batch(step), hash_state=False
        )
        assert result.log is not None  # record mode always returns the step's log
        step_log, loss = result.log, result.loss
    dev.after_step(step, state)
    queue_step(writer, step, state, dev.tamper_log(step, step_log))
    return loss


def queue_step(writer: TranscriptWriter, step: int, state: TrainState, step_log: ChunkLog) -> None:
    """Queue a step with its state (``step_log`` its chunk): a state on a GPU is hashed there, and the writer's thread waits
    for the leaf (and copies the bytes back when a checkpoint is due) while the next step runs; a
    small CPU state's canonical bytes go to the writer's thread, which hashes them there (and writes
    them as the checkpoint when one is due); a large one is hashed here, piece by piece, or encoded
    whole when a checkpoint is due (the leaf is then the hash of those bytes: one pass over the
    state, not two)."""
    on_device = device_leaf(state)
    if on_device is not None:
        writer.append_pending(step, on_device, step_log)
        return
    buf = state_buffer(state)
    if buf is not None:
        writer.append_state(step, buf.data, step_log)
    elif writer.wants_checkpoint(step):
        ckpt = encode_streamed(state)
        writer.append_step(step, leaf_of(ckpt), step_log, ckpt)
    else:
        writer.append_step(step, hash_streamed(state), step_log, None)


def _result(
    t: Transcript, profile: str, *, steps_run: int, resumed_from: int | None, loss: float | None
) -> TrainResult:
    m = t.manifest
    assert m.state_root is not None and m.log_root is not None
    log_dir = t.directory / LOG_DIR_NAME
    log_bytes = sum(p.stat().st_size for p in log_dir.rglob("*") if p.is_file())
    return TrainResult(
        out_dir=t.directory,
        spec_hash=t.spec_hash,
        profile=profile,
        steps=m.steps,
        state_root=bytes.fromhex(m.state_root),
        log_root=bytes.fromhex(m.log_root),
        num_leaves=m.num_leaves,
        steps_run=steps_run,
        resumed_from=resumed_from,
        log_bytes=log_bytes,
        final_loss=loss,
    )


def _rebuild_state(out: Path, cfg: TaskConfig, engine: StepEngine, leaves: list[bytes]) -> TrainState:
    """State after the last complete step: the newest good checkpoint (else the initial state),
    then replay with own log, every leaf checked."""
    t = Transcript(out)
    last = len(leaves) - 1
    state = own_start(t, engine, last)()
    replay_forward(t, engine, state, state.step + 1, last)
    log.info("rebuilt state at step %d from step %d", last, state.step)
    return state


__all__ = [
    "Deviation",
    "ObserveFn",
    "ProgressFn",
    "StepProbe",
    "StepRunner",
    "TrainResult",
    "checkpoints_after",
    "initial_step",
    "probe_steps",
    "queue_step",
    "train",
    "train_step",
]
