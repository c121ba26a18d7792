"""The auditor's replay from the log chunks alone: no transcript, so none of the trainer's leaves.

Why: a trainer may withhold its transcript and answer availability demands; the log it posts
on-chain piece by piece (:mod:`game.onchainlog`) is then all an auditor has. The config and the log
are enough: the states follow by replay. Without the trainer's leaves the auditor cannot see where
it first diverges, so it applies the log at every step; a chunk that does not fit the computation
(the trainer's log describes other values: a tampered log, or states the trainer reached some
other way) is rejected and its step runs without the log, as :func:`~.audit.audit` runs such a
step. The leaves are the auditor's own either way, and the bisection finds the first step where
they and the trainer's part. A synchronous task only: an asynchronous one's chunks name the states
each update computes on, which this replay does not keep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from game.errors import ConfigError, RoundingLogError
from game.training.engine.auditresult import AuditResult
from game.training.engine.memory import trimmed
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine, engine_for
from game.training.engine.train import ProgressFn
from game.training.log.formats import decode_chunk
from game.training.state.canonical import encode_state
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)


def _check(cfg: TaskConfig, chunks: Sequence[bytes]) -> None:
    if cfg.scheduled:
        raise ConfigError("an asynchronous task cannot be replayed from its log chunks alone")
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
        self.encoded = encode_state(
            self.state
        )  # the state's bytes: its leaf, and where a rejected step restarts
        self.corrections = 0
        self.rejected: list[int] = []
        self.errors: list[str] = []

    def step(self, step: int, chunk: bytes) -> None:
        try:
            result = self.engine.run_step(
                self.state, step, mode="replay", log=decode_chunk(chunk, self.spec, step), hash_state=False
            )
        except RoundingLogError as exc:
            log.warning("step %d: the trainer's log chunk is rejected: %s", step, exc)
            self.rejected.append(step)
            self.errors.append(str(exc))
            self.state = decode_state(self.encoded, self.cfg)
            result = self.engine.run_step(self.state, step, mode="round", hash_state=False)
        self.corrections += result.corrections
        self.encoded = encode_state(self.state)


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
    _check(cfg, chunks)
    run = _Replay(cfg, profile)
    leaves = [leaf_of(run.encoded)]
    for step in range(1, cfg.steps + 1):
        run.step(step, chunks[step])
        leaves.append(leaf_of(run.encoded))
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
    )


def state_after_chunks(cfg: TaskConfig, profile: str, chunks: Sequence[bytes], step: int) -> bytes:
    """The canonical state after ``step``, replayed as :func:`audit_chunks` replays it."""
    _check(cfg, chunks)
    run = _Replay(cfg, profile)
    for s in range(1, step + 1):
        run.step(s, chunks[s])
    return run.encoded


__all__ = ["audit_chunks", "state_after_chunks"]
