"""The trainer (Algorithm 2) and auditor (Algorithm 3) loops, replay of one step, and divergence.

Everything here is a loop around :meth:`StepEngine.run_step`, the unit of the whole system:

* :func:`train` records every step's rounding log and state hash into a transcript, and resumes a
  run that was killed: the steps after the last checkpoint are replayed from the trainer's own log
  chunks, which reproduces the lost state bit for bit, so a resumed transcript equals an
  uninterrupted one byte for byte.
* :func:`audit` re-trains on another profile, applying the trainer's logged directions (``rev``),
  and compares state roots.
* :func:`replay_step` re-runs one step from the state before it (the judge's primitive);
  :func:`run_step_from_bytes` is the same with nothing verified, for the judge.
* :func:`divergence` measures how far two profiles drift apart with and without the log
  (the paper's Figure 5).
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich import filesize

from game.errors import NonFiniteError, RoundingLogError, TranscriptError
from game.fsio import exclusive_directory
from game.merkle import merkle_root
from game.training.auditprogress import DEFAULT_EVERY_S, AuditProgress, ProgressSaver
from game.training.config import TaskConfig
from game.training.heap import trimmed
from game.training.leafhash import leaf_of
from game.training.leaves import LeafHasher, PendingLeaf, device_leaf
from game.training.log.formats import ChunkLog, decode_chunk, new_step_log
from game.training.profiles import get_profile
from game.training.state import (
    TrainState,
    decode_state,
    encode_streamed,
    encoded_size,
    hash_streamed,
    state_buffer,
    state_hash,
)
from game.training.step import StepEngine, StepResult
from game.training.transcript.layout import CHECKPOINT_DIR_NAME, LOG_DIR_NAME, MANIFEST_NAME
from game.training.transcript.manifest import make_transcript_dir, read_manifest
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)

#: ``progress(done, total)`` is called after every step (for progress bars).
ProgressFn = Callable[[int, int], None]


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


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit`: ``leaves`` are the auditor's own (for a challenge)."""

    match: bool
    trainer_state_root: bytes
    auditor_state_root: bytes
    first_divergent_step: int | None
    steps: int
    corrections: int
    profile: str
    leaves: tuple[bytes, ...] = field(repr=False, default=())
    rejected_log_steps: tuple[int, ...] = ()  # steps whose chunk did not fit the auditor's ops
    log_errors: tuple[str, ...] = ()  # why, one message per rejected step (tampering names step, op, value)
    resumed_from: int | None = None  # the step saved progress let it go on from, None for a whole replay

    def to_dict(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "resumed_from": self.resumed_from,
            "rejected_log_steps": list(self.rejected_log_steps),
            "log_errors": list(self.log_errors),
            "trainer_state_root": self.trainer_state_root.hex(),
            "auditor_state_root": self.auditor_state_root.hex(),
            "first_divergent_step": self.first_divergent_step,
            "steps": self.steps,
            "corrections": self.corrections,
            "profile": self.profile,
        }


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of :func:`replay_step`."""

    step: int
    state_hash: bytes
    matches_transcript: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "state_hash": self.state_hash.hex(),
            "matches_transcript": self.matches_transcript,
        }


#: Names of the three series of :func:`divergence`, in plot order.
SERIES_FP32 = "fp32"
SERIES_ROUND = "fp64+rounding, no log"
SERIES_LOG = "fp64+rounding, with log"


@dataclass(frozen=True)
class DivergenceResult:
    """Per-step L2 distance between the two parties' weights; index i is after step i (0 = init)."""

    preset: str
    steps: int
    trainer_profile: str
    auditor_profile: str
    series: dict[str, list[float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "steps": self.steps,
            "trainer_profile": self.trainer_profile,
            "auditor_profile": self.auditor_profile,
            "series": {name: list(values) for name, values in self.series.items()},
        }


# ----------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------


def _engine(cfg: TaskConfig, profile: str) -> StepEngine:
    return StepEngine(cfg, get_profile(profile))


@trimmed()  # a node idles on after: give the step's memory back
def train(
    cfg: TaskConfig,
    profile: str,
    out_dir: Path | str,
    *,
    progress: ProgressFn | None = None,
    deviation: Deviation | None = None,
) -> TrainResult:
    """Algorithm 2: train ``cfg`` on ``profile`` and write (or finish) the transcript in ``out_dir``.

    The directory is this process's alone while it runs: a second `vgame train` (or trainer node)
    on it stops at once with :class:`~game.errors.DirectoryInUse` instead of cutting and appending steps under
    the first one's feet."""
    out = Path(out_dir)
    engine = _engine(cfg, profile)  # an unknown or absent profile is refused before a file is made
    make_transcript_dir(out)
    busy = (
        f"{out} is being written by another process (a `vgame train` or a trainer node); "
        "let it finish, or stop it and run this again to go on from its last step"
    )
    with exclusive_directory(out, busy):
        return _train_alone(engine, profile, out, progress=progress, deviation=deviation)


def _train_alone(
    engine: StepEngine, profile: str, out: Path, *, progress: ProgressFn | None, deviation: Deviation | None
) -> TrainResult:
    """:func:`train` once the directory is held."""
    cfg = engine.cfg
    dev = deviation or Deviation()
    resumed_from: int | None = None
    state: TrainState | None = None
    if (out / MANIFEST_NAME).exists():
        existing = read_manifest(out)
        if existing.spec_hash != cfg.spec_hash().hex():
            raise TranscriptError(
                f"{out} holds a transcript of another task (spec {existing.spec_hash[:16]}...); "
                "choose another --out or delete it"
            )
        if existing.complete:
            log.info("transcript at %s is already complete; nothing to do", out)
            return _result(Transcript(out), existing.profile, steps_run=0, resumed_from=cfg.steps, loss=None)
        if existing.profile != profile:  # its manifest names one profile, and says what ran the steps
            raise TranscriptError(
                f"{out} was started on profile {existing.profile!r}, not {profile!r}: go on with "
                f"--profile {existing.profile}, or train afresh in another --out"
            )
        writer = TranscriptWriter.resume(out, cfg)
        if writer.num_done > 0:
            resumed_from = writer.num_done - 1
            state = _rebuild_state(out, cfg, engine, writer.leaves)
    else:
        writer = TranscriptWriter.create(out, cfg, profile)

    steps_run = 0
    with writer:  # on any error, the steps already computed still reach the disk
        if state is None:
            state = initial_step(engine, writer, dev)
        loss: float | None = None
        for step in range(writer.num_done, cfg.steps + 1):
            try:
                step_loss = train_step(engine, writer, state, step, dev)
            except NonFiniteError as exc:
                raise NonFiniteError(
                    f"{exc}: the training diverged, and a transcript cannot commit NaN or inf; going on "
                    f"from step {step - 1} would only diverge again: change the task (a smaller lr first)"
                ) from exc
            loss = step_loss if step_loss is not None else loss
            steps_run += 1
            if steps_run == 1:  # the optimizer's state exists now: a checkpoint has its full size
                _warn_if_no_room(out, cfg, state, step)
            if progress is not None:
                progress(step, cfg.steps)
        writer.finish()
    return _result(Transcript(out), profile, steps_run=steps_run, resumed_from=resumed_from, loss=loss)


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


def initial_step(engine: StepEngine, writer: TranscriptWriter, dev: Deviation | None = None) -> TrainState:
    """Step 0 of :func:`train`: the fresh state, queued for the disk with its leaf and checkpoint."""
    dev = dev or _HONEST
    state = engine.init_state()
    dev.after_step(0, state)  # a deviation may tamper with the initial state too
    _append(writer, 0, state, dev.tamper_log(0, new_step_log(engine.cfg.log_format, 0)))
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
    _append(writer, step, state, dev.tamper_log(step, step_log))
    return loss


def _append(writer: TranscriptWriter, step: int, state: TrainState, step_log: ChunkLog) -> None:
    """Queue a step with its state: a state on a GPU is hashed there, and the writer's thread waits
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
    """State after the last complete step: the newest good checkpoint, then replay with own log."""
    t = Transcript(out)
    last = len(leaves) - 1
    for ckpt in reversed([s for s in t.checkpoint_steps() if s <= last]):
        try:
            data = t.load_checkpoint(ckpt)
        except TranscriptError as exc:
            log.warning("skipping checkpoint %d: %s", ckpt, exc)
            continue
        state = decode_state(data, cfg)
        _replay_forward(t, engine, state, ckpt + 1, last)
        log.info("rebuilt state at step %d from checkpoint %d", last, ckpt)
        return state
    raise TranscriptError(f"{out / CHECKPOINT_DIR_NAME} holds no usable checkpoint; delete {out} and retrain")


def _replay_forward(t: Transcript, engine: StepEngine, state: TrainState, first: int, last: int) -> None:
    """Run steps ``first..last`` with the transcript's log chunks, checking every leaf on the way."""
    for step in range(first, last + 1):
        result = engine.run_step(state, step, mode="replay", log=t.read_log(step))
        if result.state_hash != t.leaf(step):
            raise TranscriptError(
                f"replaying step {step} with its own log chunk does not reproduce leaf {step}: "
                "the transcript and its checkpoints disagree"
            )


# ----------------------------------------------------------------------------------------------
# Auditor
# ----------------------------------------------------------------------------------------------


@trimmed()  # a node idles on after: give the replay's memory back
def audit(
    transcript_dir: Path | str,
    profile: str,
    *,
    use_log: bool = True,
    progress: ProgressFn | None = None,
    keep_progress: Path | str | None = None,
    save_every_s: float = DEFAULT_EVERY_S,
) -> AuditResult:
    """Algorithm 3: re-train on ``profile`` (with the trainer's log unless ``use_log`` is False).

    The log is applied up to the first divergent step. A chunk that does not fit the computation
    there is the trainer's fault (``rejected_log_steps``); after that step the auditor's states are
    its own, the trainer's log describes other values, and the later steps run without it (a
    chunk rejected there would only repeat the divergence, not point at the log).

    With ``keep_progress`` (a directory this process holds alone), the audit saves its progress
    there every ``save_every_s`` seconds and, run again after a crash, goes on from the last save
    (:mod:`game.training.auditprogress`); the saved progress is removed once the audit ends."""
    t = Transcript(transcript_dir)
    t.verify()
    assert t.manifest.state_root is not None
    trainer_root = bytes.fromhex(t.manifest.state_root)
    engine = _engine(t.config, profile)
    saver = None if keep_progress is None else ProgressSaver(Path(keep_progress), save_every_s)
    saved = None if saver is None else saver.load(trainer_root, profile, use_log)
    if saved is None:
        state = engine.init_state()
        leaves = [state_hash(state)]
        first_div = None if leaves[0] == t.leaf(0) else 0
        corrections = 0
        rejected: list[int] = []
        log_errors: list[str] = []
        resumed_from = None
    else:
        done, state_bytes = saved
        state = decode_state(state_bytes, t.config)
        leaves = list(done.leaves)
        first_div = done.first_divergent_step
        corrections = done.corrections
        rejected = list(done.rejected_log_steps)
        log_errors = list(done.log_errors)
        resumed_from = done.step
        log.info("audit: going on from step %d, saved in %s", done.step, keep_progress)
    pending: PendingLeaf | None = None  # the last step's leaf, hashed while this step runs

    def settle(p: PendingLeaf) -> bool:
        """Take the leaf of step ``p.step``; True when that step is the first divergent one."""
        nonlocal first_div
        leaves.append(p.leaf())
        if first_div is not None or leaves[-1] == t.leaf(p.step):
            return False
        first_div = p.step
        log.info(
            "audit: first divergent step %d%s",
            p.step,
            "; the later steps run without the trainer's log" if use_log and p.step < t.steps else "",
        )
        return True

    with LeafHasher() as hasher:
        for step in range(len(leaves), t.steps + 1):
            if pending is not None and pending.ready:  # hashed at once: no state kept to go back to
                settle(pending)
                pending = None
            with_log = use_log and first_div is None
            result: StepResult | None = None
            failed: Exception | None = None  # raised by a step run with the log, not yet judged
            try:
                result = engine.run_step(
                    state,
                    step,
                    mode="replay" if with_log else "round",
                    log=t.read_log(step) if with_log else None,
                    hash_state=False,
                )
            except Exception as exc:
                if not with_log:
                    raise
                failed = exc
            if pending is not None and settle(pending) and with_log:
                # The step before this one diverged, so this one must run without the trainer's
                # log (it describes other values), whatever it raised: again, from its pre-state.
                state = pending.rebuild(t.config)
                result = engine.run_step(state, step, mode="round", hash_state=False)
                failed = None
            pending = None
            if failed is not None:
                if not isinstance(failed, RoundingLogError):
                    raise failed
                # The chunk does not fit the computation (a tampered log): that step is the
                # trainer's fault; run it without the log so the auditor still has its leaves.
                log.warning("step %d: the trainer's log chunk is rejected: %s", step, failed)
                rejected.append(step)
                log_errors.append(str(failed))
                state = _load_state_at(t, engine, step - 1)  # the trainer's state up to here
                result = engine.run_step(state, step, mode="round", hash_state=False)
            assert result is not None
            corrections += result.corrections
            pending = hasher.submit(state)
            if saver is not None and saver.due() and step < t.steps:
                settle(pending)  # the leaf now, not a step late: the saved state is one already judged
                kept = pending.buffer.data if pending.buffer is not None else encode_streamed(state)
                pending = None
                done_so_far = AuditProgress(
                    trainer_root, profile, use_log, tuple(leaves), corrections, first_div,
                    tuple(rejected), tuple(log_errors),
                )  # fmt: skip
                saver.save(done_so_far, kept)
            if progress is not None:
                progress(step, t.steps)
        if pending is not None:
            settle(pending)
    if saver is not None:
        saver.clear()
    root = merkle_root(leaves)
    return AuditResult(
        match=root == trainer_root,
        trainer_state_root=trainer_root,
        auditor_state_root=root,
        first_divergent_step=first_div,
        steps=t.steps,
        corrections=corrections,
        profile=profile,
        leaves=tuple(leaves),
        rejected_log_steps=tuple(rejected),
        log_errors=tuple(log_errors),
        resumed_from=resumed_from,
    )


# ----------------------------------------------------------------------------------------------
# One step (the judge's primitive)
# ----------------------------------------------------------------------------------------------


def _load_state_at(t: Transcript, engine: StepEngine, step: int) -> TrainState:
    """State after ``step``: nearest checkpoint (verified against its leaf), replayed forward."""
    ckpt = t.nearest_checkpoint(step)
    state = decode_state(t.load_checkpoint(ckpt), t.config)
    _replay_forward(t, engine, state, ckpt + 1, step)
    return state


@trimmed()
def replay_step(transcript_dir: Path | str, step: int, profile: str) -> ReplayResult:
    """Re-run ``step`` from the state at ``step - 1`` with chunk ``step``; compare with leaf ``step``."""
    t = Transcript(transcript_dir)
    available = len(t.leaves()) - 1
    if not 1 <= step <= min(t.steps, available):
        raise TranscriptError(
            f"step {step} is out of range: replay-step takes a step in 1..{min(t.steps, available)}"
        )
    engine = _engine(t.config, profile)
    state = _load_state_at(t, engine, step - 1)
    result = engine.run_step(state, step, mode="replay", log=t.read_log(step))
    return ReplayResult(step=step, state_hash=result.leaf, matches_transcript=result.leaf == t.leaf(step))


def run_step_from_bytes(cfg: TaskConfig, pre_state: bytes, chunk: bytes, step: int, profile: str) -> bytes:
    """State hash after running ``step`` from canonical ``pre_state`` bytes with log ``chunk`` bytes.

    Verifies nothing about where the inputs came from (the judge checks them against the
    committed roots first); a chunk that does not decode or fit raises RoundingLogError.
    """
    engine = _engine(cfg, profile)
    state = decode_state(pre_state, cfg)
    step_log = decode_chunk(chunk, cfg.spec_hash(), step)
    return engine.run_step(state, step, mode="replay", log=step_log).leaf


# ----------------------------------------------------------------------------------------------
# Divergence (paper Figure 5)
# ----------------------------------------------------------------------------------------------


def _weights_distance(a: TrainState, b: TrainState) -> float:
    """L2 distance over all parameters (float64 accumulation of float64 differences); the two states
    may live on different devices (a CPU trainer, a CUDA auditor)."""
    total = 0.0
    pa, pb = a.parameters(), b.parameters()
    for name, ta in pa.items():
        tb = pb[name].detach().to(device=ta.device, dtype=torch.float64)
        d = (ta.detach().double() - tb).reshape(-1)
        total += float((d * d).sum())
    return math.sqrt(total)


def divergence(
    cfg: TaskConfig,
    steps: int,
    trainer_profile: str,
    auditor_profile: str,
    *,
    progress: ProgressFn | None = None,
) -> DivergenceResult:
    """Train the same task on two profiles three ways and record the weight distance every step."""
    cfg = cfg.replace(steps=steps)
    trainer, auditor = _engine(cfg, trainer_profile), _engine(cfg, auditor_profile)
    series: dict[str, list[float]] = {}
    plans: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (SERIES_FP32, {"mode": "plain", "precision": "fp32"}, {"mode": "plain", "precision": "fp32"}),
        (SERIES_ROUND, {"mode": "round"}, {"mode": "round"}),
        (SERIES_LOG, {"mode": "record"}, {"mode": "replay"}),
    ]
    total = 3 * steps
    done = 0
    for name, t_kw, a_kw in plans:
        precision = t_kw.get("precision", "fp64")
        st, sa = trainer.init_state(precision=precision), auditor.init_state(precision=precision)
        values = [_weights_distance(st, sa)]
        for step in range(1, steps + 1):
            rt = trainer.run_step(st, step, **t_kw)
            if a_kw["mode"] == "replay":
                auditor.run_step(sa, step, mode="replay", log=rt.log)
            else:
                auditor.run_step(sa, step, **a_kw)
            values.append(_weights_distance(st, sa))
            done += 1
            if progress is not None:
                progress(done, total)
        series[name] = values
    return DivergenceResult(
        preset=cfg.preset,
        steps=steps,
        trainer_profile=trainer_profile,
        auditor_profile=auditor_profile,
        series=series,
    )
