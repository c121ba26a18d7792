"""The auditor's replay from the log chunks alone: no transcript, so none of the trainer's leaves.

Why: a trainer may withhold its transcript and answer availability demands; the log it posts
on-chain piece by piece (:mod:`game.onchainlog`) is then all an auditor has. The config and the log
are enough: the states follow by replay. Without the trainer's leaves the auditor cannot see where
it first diverges, so it applies the log at every step; a chunk that does not fit the computation
(the trainer's log describes other values: a tampered log, or states the trainer reached some
other way) is rejected and its step runs without the log, as :func:`~.audit.audit` runs such a
step. The leaves are the auditor's own either way, and the bisection finds the first step where
they and the trainer's part.

An asynchronous task's chunks carry each update's schedule entry too. The entries are held to the
task's rules as a replay of the transcript holds them (:func:`~.schedaudit.checked_entries`), each
state an update computes on is kept until its last use, and from the first entry that breaks the
rules on, the leaves are the rejected-schedule mark (:func:`~.schedaudit.rejected_schedule_leaf`).
A judge, which has no transcript either and so no leaves to prove the older states by, replays
them itself with :func:`states_after_chunks` (:mod:`game.chainevidence`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from game.errors import ConfigError, RoundingLogError
from game.training.engine.auditresult import AuditResult
from game.training.engine.memory import trimmed
from game.training.engine.schedaudit import checked_entries, rejected_schedule_leaf
from game.training.engine.scheduled import run_entry
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine, engine_for
from game.training.engine.train import ProgressFn
from game.training.engine.update import UpdateEngine, Weights, weights_of
from game.training.log.formats import decode_chunk, decode_scheduled, schedule_entry
from game.training.log.schedule import ScheduleError, last_uses
from game.training.state.canonical import encode_state
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)


def _check(cfg: TaskConfig, chunks: Sequence[bytes]) -> None:
    if len(chunks) != cfg.steps + 1:
        raise ConfigError(
            f"{len(chunks)} log chunks for a task of {cfg.steps} steps (one a step, and step 0's)"
        )


class _Replay:
    """Steps from the initial state, each with its chunk, or without where the chunk is rejected."""

    def __init__(self, cfg: TaskConfig, profile: str) -> None:
        self.cfg = cfg
        self.engine: StepEngine = engine_for(cfg, profile, checks="audit")  # as an audit runs
        self.spec = cfg.spec_hash()
        self.state = self.engine.init_state()
        self.encoded = encode_state(self.state)  # the state's bytes: its leaf, where a rejected step restarts
        self.corrections = 0
        self.rejected: list[int] = []
        self.errors: list[str] = []
        self.schedule_errors: list[str] = []
        self.broken: int | None = None  # the first update whose schedule entry breaks the rules

    def step(self, step: int, chunk: bytes) -> None:
        try:
            result = self.engine.run_step(
                self.state, step, mode="replay", log=decode_chunk(chunk, self.spec, step), hash_state=False
            )
        except RoundingLogError as exc:
            self._reject(step, exc)
            result = self.engine.run_step(self.state, step, mode="round", hash_state=False)
        self.corrections += result.corrections
        self.encoded = encode_state(self.state)

    def _reject(self, step: int, exc: RoundingLogError) -> None:
        """The chunk of ``step`` is the trainer's fault: the step runs again without it, from the
        state before it. Warned the first time only: past a state the trainer did not reach as the
        auditor does, every later chunk describes other values and is rejected too."""
        level = logging.INFO if self.rejected else logging.WARNING
        log.log(level, "step %d: the trainer's log chunk is rejected: %s", step, exc)
        self.rejected.append(step)
        self.errors.append(str(exc))
        self.state = decode_state(self.encoded, self.cfg)

    def leaf(self, step: int) -> bytes:
        """The auditor's own leaf after ``step``."""
        if self.broken is not None and step >= self.broken:
            return rejected_schedule_leaf(step)
        return leaf_of(self.encoded)


class _ScheduledReplay(_Replay):
    """An asynchronous task's updates, each by its chunk's schedule entry, on the states it names."""

    def __init__(self, cfg: TaskConfig, profile: str, chunks: Sequence[bytes]) -> None:
        super().__init__(cfg, profile)
        self.ue = UpdateEngine(self.engine)
        self.entries, self.schedule_errors = checked_entries(
            cfg, lambda u: schedule_entry(chunks[u], self.spec, u)
        )
        self.uses = last_uses([e for e in self.entries if e is not None])
        self.kept: dict[int, Weights] = {0: weights_of(self.state)}

    def step(self, step: int, chunk: bytes) -> None:
        entry = self.entries[step - 1]
        if self.broken is not None or entry is None:  # nothing after it can be computed
            if self.broken is None:
                log.warning("update %d: its schedule entry breaks the task's rules; the replay stops", step)
                self.broken = step
            return
        try:
            self.corrections += run_entry(
                self.ue, self.state, entry, decode_scheduled(chunk, self.spec, step)[1], self.kept
            )
        except RoundingLogError as exc:
            self._reject(step, exc)
            run_entry(self.ue, self.state, entry, None, self.kept)
        self.encoded = encode_state(self.state)
        if self.uses.get(step, 0) > step:
            self.kept[step] = weights_of(self.state)
        for v in [v for v in self.kept if self.uses.get(v, 0) <= step]:
            del self.kept[v]


def _replay(cfg: TaskConfig, profile: str, chunks: Sequence[bytes]) -> _Replay:
    _check(cfg, chunks)
    return _ScheduledReplay(cfg, profile, chunks) if cfg.scheduled else _Replay(cfg, profile)


@trimmed()
def audit_chunks(
    cfg: TaskConfig,
    profile: str,
    chunks: Sequence[bytes],
    trainer_root: bytes,
    *,
    progress: ProgressFn | None = None,
) -> AuditResult:
    """Replay ``cfg`` on ``profile`` with ``chunks`` (step 0's first) and hold the leaves' root to
    ``trainer_root``. ``first_divergent_step`` is None: without the trainer's leaves it is not known."""
    run = _replay(cfg, profile, chunks)
    leaves = [run.leaf(0)]
    for step in range(1, cfg.steps + 1):
        run.step(step, chunks[step])
        leaves.append(run.leaf(step))
        if progress is not None:
            progress(step, cfg.steps)
    return AuditResult.of_leaves(
        trainer_root,
        leaves,
        first_divergent_step=None,
        steps=cfg.steps,
        corrections=run.corrections,
        profile=profile,
        rejected_log_steps=run.rejected,
        log_errors=run.errors,
        resumed_from=None,
        schedule_errors=tuple(run.schedule_errors),
    )


@trimmed()
def states_after_chunks(
    cfg: TaskConfig, profile: str, chunks: Sequence[bytes], wanted: Iterable[int]
) -> dict[int, bytes]:
    """The canonical states after each step in ``wanted``, replayed as :func:`audit_chunks` replays
    them; :class:`ScheduleError` for one at or after an update whose entry breaks the task's rules
    (no state follows it)."""
    wanted = set(wanted)
    run = _replay(cfg, profile, chunks)
    found = {0: run.encoded} if 0 in wanted else {}
    for step in range(1, max(wanted, default=0) + 1):
        run.step(step, chunks[step])
        if run.broken is not None:
            raise ScheduleError(
                f"update {run.broken}: its schedule entry breaks the task's rules, so no state follows it"
            )
        if step in wanted:
            found[step] = run.encoded
    return found


__all__ = ["audit_chunks", "states_after_chunks"]
