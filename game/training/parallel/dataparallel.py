"""Synchronous data parallel: W processes run each step's M micro-batches, rank 0 folds the
gradients in micro-batch order, updates, and writes the transcript; every rank ends the step with
rank 0's state. The roots and chunks are those of one process running the same task.

One step, on each rank ``r`` (micro-batches ``assignment(M, W)[r]``, a contiguous block)::

    batch = runtime.batch(step) -> prepared -> cut into M micro-batches      # every rank, the same
    for j in mine: run_micro_batch(...)   # g_j and its log segment, from the step's state and buffers
    gather_micro -> rank 0                # every g_j (float64 bits), segment and loss
    broadcast buffers from rank W-1       # those the last micro-batch left: the step's
    rank 0: fold_grads in micro-batch order, apply_update (clip, optimizer, scheduler), merge_logs,
            queue the step (chunk, leaf, checkpoint) for the transcript writer
    broadcast parameters from rank 0      # the next step starts from the same state everywhere

Only rank 0 rounds the update: the other ranks take its parameters, a copy, so ranks on other
hardware never round an update of their own. They hold no optimizer state (they never step one).

Rank 0 runs :func:`~game.training.engine.train.train` with a :class:`DataParallel` runner, so
opening, resuming (the state rebuilt from a checkpoint by replay in this one process, then
broadcast) and finishing a transcript are the one-process trainer's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from game.errors import ConfigError
from game.training.engine.microbatch import MicroResult, apply_update, fold_grads, merge_logs, run_micro_batch
from game.training.engine.runtime import runtime_for
from game.training.engine.step import StepEngine, engine_for
from game.training.engine.train import Deviation, StepRunner, TrainResult, queue_step, train
from game.training.parallel.group import WorkerGroup
from game.training.state.schedstate import step_loss
from game.training.state.tensors import StepBuffers, TrainState
from game.training.task.config import TaskConfig
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)


def check_workers(cfg: TaskConfig, workers: int) -> None:
    """Refuse a worker count that does not divide the task's micro-batches a step."""
    m = cfg.accumulate
    if workers < 1 or m % workers:
        valid = ", ".join(str(w) for w in range(1, m + 1) if m % w == 0)
        raise ConfigError(
            f"--workers {workers}: the task has accumulate = {m} micro-batches a step, which {workers} "
            f"workers cannot share evenly (valid: {valid}; raise accumulate for more)"
        )


def assignment(micro_batches: int, workers: int) -> list[range]:
    """Which micro-batches each rank runs: rank ``r`` the ``r``-th contiguous block of ``M / W``."""
    each = micro_batches // workers
    return [range(r * each, (r + 1) * each) for r in range(workers)]


@dataclass
class RankReport:
    """What rank 0 hands back besides the transcript."""

    result: TrainResult
    evals: list[dict[str, float]] = field(default_factory=list)
    #: wall time (``time.perf_counter``) at which each step run here was queued, in order
    step_ends: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result.to_dict(), "evals": self.evals, "step_ends": self.step_ends}


class DataParallel(StepRunner):
    """One rank's part of each step; rank 0's as :func:`train`'s runner (:meth:`ready`,
    :meth:`step`), the others' in :meth:`follow`."""

    def __init__(self, engine: StepEngine, group: WorkerGroup) -> None:
        check_workers(engine.cfg, group.size)
        self.engine = engine
        self.group = group
        self.mine = assignment(engine.cfg.accumulate, group.size)[group.rank]
        self.step_ends: list[float] = []

    # ---- every rank ---------------------------------------------------------------------------

    def _micro_batches(self, state: TrainState, step: int) -> list[MicroResult] | None:
        """This rank's micro-batches from the state before ``step``, then the exchange: every
        rank's results on rank 0 (None elsewhere), and every rank's buffers the last
        micro-batch's."""
        engine, model = self.engine, state.model
        total = engine.cfg.accumulate
        micro = engine.runtime.micro_batches(engine.prepare_batch(engine.batch(step)))
        start = StepBuffers(model) if total > 1 else None
        mine = [
            run_micro_batch(engine, model, step, j, micro[j], total=total, start=start) for j in self.mine
        ]
        gathered = self.group.gather_micro(mine, list(model.parameters()))
        self.group.broadcast_tensors(list(model.buffers()), src=self.group.size - 1)
        return gathered

    def _share_state(self, state: TrainState) -> None:
        """Rank 0's parameters and buffers on every rank (where a run starts)."""
        model = state.model
        self.group.broadcast_tensors([*model.parameters(), *model.buffers()], src=0)

    def _share_update(self, state: TrainState) -> None:
        """Rank 0's parameters after its update on every rank (the buffers are everyone's already)."""
        self.group.broadcast_tensors(list(state.model.parameters()), src=0)

    # ---- rank 0 -------------------------------------------------------------------------------

    def ready(self, state: TrainState | None, first: int) -> None:
        self.group.broadcast_object(first)
        if state is not None:
            self.engine.place(state)
            self._share_state(state)

    def step(
        self, engine: StepEngine, writer: TranscriptWriter, state: TrainState, step: int, dev: Deviation
    ) -> float | None:
        if type(dev) is not Deviation:
            raise ConfigError("a deviation (a dishonest trainer) runs in one process, not on many workers")
        judged = engine.carried_before(state, step)  # rank 0's model stands for every rank's
        gathered = self._micro_batches(state, step)
        assert gathered is not None  # rank 0
        cfg = engine.cfg
        loss = step_loss([r.loss for r in gathered])  # in micro-batch order, as one process adds them
        update = apply_update(
            engine, state, fold_grads([r.grads for r in gathered], cfg.bits), step, loss=loss
        )
        self._share_update(state)  # the others start the next step while this one is written
        chunk = merge_logs(cfg.log_format, step, [r.segment for r in gathered] + [update])
        if judged is not None:
            engine.carried_judge(state, step, judged, chunk)
        queue_step(writer, step, state, chunk)
        self.step_ends.append(time.perf_counter())
        return loss

    # ---- the other ranks ----------------------------------------------------------------------

    def follow(self) -> None:
        """A rank other than 0: wait for where rank 0 starts, take its state, and run this rank's
        micro-batches of every step up to the last."""
        first = int(self.group.broadcast_object(None))
        last = self.engine.cfg.steps
        if first > last:
            return
        state = self.engine.init_state()  # the model's tensors to receive rank 0's into
        self._share_state(state)
        for step in range(first, last + 1):
            self._micro_batches(state, step)
            self._share_update(state)


def run_rank(cfg: TaskConfig, profile: str, out: Path, *, eval_every: int = 0) -> RankReport | None:
    """This process's part of a data-parallel run of ``cfg`` on ``profile`` into ``out`` (under
    torchrun: its environment says the rank). Rank 0 returns its report; the others None."""
    engine = engine_for(cfg, profile)
    group = WorkerGroup(torch.device(engine.profile.device))
    try:
        runner = DataParallel(engine, group)
        if group.rank != 0:
            runner.follow()
            return None
        evals: list[dict[str, float]] = []
        observe = _evaluator(cfg, eval_every, evals) if eval_every else None
        result = train(cfg, profile, out, observe=observe, runner=runner)
        return RankReport(result, evals, runner.step_ends)
    finally:
        group.close()


def _evaluator(cfg: TaskConfig, every: int, evals: list[dict[str, float]]) -> Any:
    """Rank 0's held-out metrics every ``every`` steps (as `vgame train --eval-every`)."""
    runtime = runtime_for(cfg)
    if not runtime.has_eval:
        return None

    def observe(step: int, loss: float | None, state: TrainState) -> None:
        if step % every == 0 or step == cfg.steps:
            evals.append({"step": step, **runtime.evaluate(state.model)})

    return observe


__all__ = ["DataParallel", "RankReport", "assignment", "check_workers", "run_rank"]
