"""The step engine: one training step, the unit of training, auditing and judging.

Order of work in a step (the same for every party, every mode)::

    batch = runtime.batch(step)             # CPU, counter-based; or batch_override (a deviation)
    batch -> grid (fp64) -> profile device
    with profile.apply(), RoundingMode(...):
        for j, micro in enumerate(runtime.micro_batches(batch)):   # cfg.accumulate of them
            buffers <- the step's (j > 0)                          # a copy: BatchNorm's statistics
            with StockOps(seed, step, j, micro.example_ids):       # dropout, SDPA, torch.rand*
                loss = runtime.loss(model, micro)                  # forward + loss
            (loss * (1 / accumulate)).backward()                   # gradients summed in order
        clip_grad_norm_(params, cfg.clip_grad_norm)  # when set
        optimizer.step()                            # update: params and optimizer state
    optimizer.zero_grad(set_to_none=True)           # gradients are not state: none survive a step
    scheduler.step()                                # the task's, if any: the next step's lr
    state.step = step

Modes: ``record`` (trainer: round and log), ``replay`` (auditor: round with the trainer's log),
``round`` (round without log: shows divergence), ``plain`` (no rounding; with ``precision="fp32"``
the model is float32: the baselines). The state hash is computed in every mode whose state has
canonical bytes (fp64 rounding modes and fp32), ``None`` for plain fp64.

The micro-batches depend on the step's state alone (each starts from the step's buffers), so W
workers may run them at once and give this step's bits and chunk: :mod:`.microbatch`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from game.errors import ConfigError, TrainingError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.modestate import MODES, DeferredChecksFailed, Mode
from game.training.dispatch.profiles import Profile, get_profile
from game.training.dispatch.stockops import StockOps, globals_held, updating
from game.training.engine import carried
from game.training.engine.runtime import Batch, runtime_for
from game.training.engine.states import decode_state, fresh_state
from game.training.log.formats import ChunkLog, decode_chunk, new_step_log
from game.training.log.sparse import SparseStepLog
from game.training.numerics import rounding
from game.training.numerics.reach import CHECKS, Checks
from game.training.state.leaves import state_hash
from game.training.state.schedstate import step_loss
from game.training.state.tensors import (
    Precision,
    StateCopies,
    StepBuffers,
    TrainState,
    check_on_grid,
    move_state,
    snapshot,
    step_scheduler,
)
from game.training.task import datasets
from game.training.task.config import TaskConfig
from game.training.task.optimizers import needs_closure

logger = logging.getLogger(__name__)


#: Set to ``0`` to read the CUDA kernels' checks back at every tensor instead of once a step.
DEFER_SWITCH = "VGAME_DEFER"
#: A step engine that had to run this many steps twice (deferred checks failed) stops deferring.
MAX_DEFER_FAILURES = 3


@dataclass(frozen=True)
class StepResult:
    """What one step produced besides the (mutated) state."""

    state_hash: bytes | None  # leaf after the step; None for plain fp64 (off-grid state) or hash_state False
    log: ChunkLog | None  # the recorded (record) or replayed (replay) chunk
    corrections: int  # rev moves applied (replay), else 0
    loss: float  # the step's loss before the update
    #: the step's interceptor: :attr:`ops` reads it only when asked (its tallies cost a step otherwise)
    mode: RoundingMode | None = field(default=None, repr=False, compare=False)

    @property
    def ops(self) -> frozenset[str]:
        """``str(func)`` of every ATen op that ran (empty for unintercepted plain runs)."""
        return self.mode.ops if self.mode is not None else frozenset()

    @property
    def leaf(self) -> bytes:
        """The state hash, for callers that only run hashing modes (raises for plain fp64)."""
        if self.state_hash is None:
            raise TrainingError("a plain float64 step has no state hash (its state is off the grid)")
        return self.state_hash


class StepEngine:
    """Runs steps of one task on one hardware profile."""

    #: The interceptor class (a deviation that steers its rounding substitutes its own).
    mode_class: type[RoundingMode] = RoundingMode
    #: Defer on any device the Triton kernels run on, not only CUDA: for tests, on CPU tensors in
    #: Triton's interpreter.
    defer_anywhere: bool = False

    def __init__(
        self, cfg: TaskConfig, profile: Profile, *, check_grid: bool = False, checks: Checks = "judge"
    ) -> None:
        if checks not in CHECKS:
            raise ConfigError(f"checks: {checks!r} is not one of {', '.join(CHECKS)}")
        profile.require()  # before a caller writes anything (a transcript directory)
        self.cfg = cfg
        self.profile = profile
        self.runtime = runtime_for(cfg)
        self.check_grid = check_grid  # assert every float of the state is on the grid after each step
        self.last_mode: RoundingMode | None = None  # the interceptor of the latest step (coverage tests)
        self.count_free = False  # replay: count the values a trainer could have rounded either way
        #: replay: who checks the log's entries, and so how far from a midpoint one is accepted
        #: (:mod:`~game.training.numerics.reach`); a rebuild also lets the leaves say where a step's
        #: agreed state was computed without its log (:func:`~.replay.replay_forward`)
        self.checks: Checks = checks
        # CUDA: the kernels' checks are read back at the end of a step (False, or VGAME_DEFER=0: at
        # every tensor, as on CPU)
        self.defer = os.environ.get(DEFER_SWITCH, "1") != "0"
        self._immediate_calls: set[int] = set()  # deferred calls that failed: checked at once since
        self._defer_failures = 0  # steps run twice; after MAX_DEFER_FAILURES deferral stops
        self._watch = carried.Watch(self.runtime)  # what the model carries from step to step
        self._judge: StepEngine | None = None  # the engine a step is run afresh on (its task loaded once)
        self._state_copies = StateCopies()  # a deferred step's copy of its state, kept for the next

    @contextmanager
    def checking(self, checks: Checks) -> Iterator[None]:
        """Steps run inside check the log's entries as ``checks`` (the judge's ruling on the one step
        it re-runs, with an engine that rebuilt the states before it)."""
        before, self.checks = self.checks, checks
        try:
            yield
        finally:
            self.checks = before

    def init_state(self, *, precision: Precision = "fp64") -> TrainState:
        """Step 0: the model built deterministically on CPU, on the grid, moved to the profile's device."""
        return fresh_state(self.cfg, device=self.profile.device, precision=precision)

    def batch(self, step: int) -> Batch:
        """The honest batch of ``step`` (CPU)."""
        return self.runtime.batch(step)

    def run_step(
        self,
        state: TrainState,
        step: int,
        *,
        mode: Mode = "record",
        log: ChunkLog | None = None,
        batch_override: Batch | None = None,
        precision: Precision = "fp64",
        hash_state: bool = True,
    ) -> StepResult:
        """Run training step ``step`` (== state.step + 1) on ``state`` in place.

        ``log``: the trainer's chunk to replay (``replay``), or an empty one to record into
        (``record``; a fresh one when None). ``hash_state`` False: no state hash in the result (the
        caller takes the state's bytes itself). If the step raises, ``state`` is half-updated:
        rebuild it. Python's and numpy's global generators are as they were after it (seeded for
        its collate, micro-batches and update, saved and put back once: :func:`globals_held`).
        """
        with globals_held():
            return self._run_step(state, step, mode, log, batch_override, precision, hash_state)

    def _run_step(
        self,
        state: TrainState,
        step: int,
        mode: Mode,
        log: ChunkLog | None,
        batch_override: Batch | None,
        precision: Precision,
        hash_state: bool,
    ) -> StepResult:
        """:meth:`run_step`'s work."""
        if mode not in MODES:
            raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        if precision not in ("fp64", "fp32"):
            raise ConfigError(f"precision: {precision!r} is not fp64 or fp32")
        if precision == "fp32" and mode != "plain":
            raise ConfigError("precision fp32 is a plain baseline: use mode 'plain'")
        if step != state.step + 1:
            raise TrainingError(f"cannot run step {step} on the state after step {state.step}")
        if mode == "replay" and log is None:
            raise ConfigError("mode 'replay' needs the trainer's StepLog")
        if mode == "record" and log is None:
            log = new_step_log(self.cfg.log_format, step)
        dtype = torch.float64 if precision == "fp64" else torch.float32
        self.place(state, dtype)

        batch = batch_override if batch_override is not None else self.batch(step)
        batch = self.prepare_batch(batch, dtype, rnd=mode != "plain")
        judged = self._watch.before(state, step) if mode == "record" else None

        if self._defers(mode, log):
            restore = snapshot(state, self._state_copies)
            try:
                rm, loss = self._attempt(state, step, mode, log, batch, defer=True)
            except DeferredChecksFailed as failed:
                self._defer_failures += 1
                self._immediate_calls |= failed.calls
                logger.info(
                    "step %d: %d deferred kernel call(s) needed the torch path; the step runs again "
                    "without deferral, and later steps do not defer those calls",
                    step,
                    len(failed.calls),
                )
                restore()
                rm, loss = self._attempt(state, step, mode, log, batch, defer=False)
        else:
            rm, loss = self._attempt(state, step, mode, log, batch, defer=False)
        mean_loss = step_loss(loss)
        step_scheduler(state, mean_loss)  # after the update, outside the rounding: Python floats only
        state.step = step
        self.last_mode = rm
        if logger.isEnabledFor(logging.DEBUG):  # counting the op kinds adds up the front's tallies
            logger.debug(
                "step %d (%s, %s, %s): %d logged tensors, %d corrections, %d op kinds",
                step,
                mode,
                precision,
                self.profile.name,
                rm.op_index,
                rm.corrections,
                len(rm.classes),
            )

        if self.check_grid and precision == "fp64" and mode != "plain":
            check_on_grid(state, self.cfg.bits)
        has_bytes = hash_state and (precision == "fp32" or mode != "plain")
        leaf = state_hash(state) if has_bytes or judged is not None else None
        if judged is not None and log is not None and leaf is not None:
            chunk = log
            self._watch.judge(step, leaf, lambda: self._rerun_afresh(judged, step, chunk, batch_override))
        return StepResult(
            state_hash=leaf if has_bytes else None,
            log=log if mode in ("record", "replay") else None,
            corrections=rm.corrections,
            loss=mean_loss,
            mode=rm,
        )

    # ---- helpers ------------------------------------------------------------------------------

    @property
    def pins_logs(self) -> bool:
        """Whether the chunks this engine replays are best read into page-locked memory
        (:meth:`SparseStepLog.pin`): its replay defers on a CUDA device, where a step's entries go
        to the GPU in one copy (``ReadAhead(..., pin=engine.pins_logs)``)."""
        return self.profile.device.startswith("cuda") and self._deferring("replay")

    def _defers(self, mode: Mode, log: ChunkLog | None) -> bool:
        """Whether this step's CUDA kernels leave their checks to its end (sparse record and replay
        with the Triton kernels): one synchronisation a step instead of one a tensor."""
        return isinstance(log, SparseStepLog) and self._deferring(mode)

    def _deferring(self, mode: Mode) -> bool:
        """:meth:`_defers`, for a sparse log."""
        if not (self.defer and mode in ("record", "replay")):
            return False
        if self._defer_failures >= MAX_DEFER_FAILURES:  # the failures move around: not worth it
            return False
        if self.profile.emulates or not (self.mode_class.defer_checks and self.mode_class.round_in_place):
            return False
        if not (self.profile.device.startswith("cuda") or self.defer_anywhere):
            return False  # a CPU run: no Triton import
        from game.training.numerics import cuda_kernels

        return cuda_kernels.runs_on(torch.device(self.profile.device))

    def carried_before(self, state: TrainState, step: int) -> bytes | None:
        """For a runner that records a step of its own (the data-parallel rank 0): what the model
        carries at ``step``'s start, as :meth:`run_step` looks (:meth:`.carried.Watch.before`); the bytes to hand :meth:`carried_judge` once the step has run, or None."""
        return self._watch.before(state, step)

    def carried_judge(self, state: TrainState, step: int, before: bytes, chunk: ChunkLog) -> None:
        """The step such a runner recorded (``chunk``; ``state`` after it) against the same step
        run afresh from ``before``, as :meth:`run_step` judges a changed attribute."""
        leaf = state_hash(state)
        self._watch.judge(step, leaf, lambda: self._rerun_afresh(before, step, chunk, None))

    def judge_engine(self) -> StepEngine:
        """An engine of this one's task and profile to run a step afresh on, as a judge's (made
        once: each run builds its model anew from the state it is given, so nothing carries)."""
        if self._judge is None:
            self._judge = StepEngine(self.cfg, self.profile, checks=self.checks)
        return self._judge

    def _rerun_afresh(self, before: bytes, step: int, log: ChunkLog, batch: Batch | None) -> bytes:
        """Step ``step``'s leaf as a judge computes it: on an engine and a model of its own, built
        afresh from the state before it (``before``), with the step's log chunk as committed (and
        its ``batch_override``): :class:`~.carried.Watch`'s test of a changed attribute."""
        judge = self.judge_engine()
        spec = self.cfg.spec_hash()
        chunk = decode_chunk(log.encode(step, spec), spec, step)
        state = decode_state(before, self.cfg, device=self.profile.device)
        return judge.run_step(state, step, mode="replay", log=chunk, batch_override=batch).leaf

    def _attempt(
        self,
        state: TrainState,
        step: int,
        mode: Mode,
        log: ChunkLog | None,
        batch: Batch,
        *,
        defer: bool,
    ) -> tuple[RoundingMode, list[Tensor]]:
        """Forward, backward and update under the interceptor (when one is needed). With ``defer``,
        :class:`DeferredChecksFailed` when a check failed, also when the step raised something else
        after it: that error may come from the values the failed call left unrounded."""
        model, optimizer = state.model, state.optimizer
        model.train()
        optimizer.zero_grad(set_to_none=True)
        rm = self.interceptor(step, mode, log, defer=defer)
        try:
            with self.profile.apply():
                if mode != "plain" or self.profile.emulates:
                    with rm:
                        loss = self._forward_backward_update(state, batch, step, serve=mode != "plain")
                else:  # the plain baseline: stock torch, its own dropout and attention kernels
                    loss = self._forward_backward_update(state, batch, step, serve=False)
            optimizer.zero_grad(set_to_none=True)
            rm.finish()
        except DeferredChecksFailed:
            raise
        except Exception as exc:
            if defer and rm.deferred_failed():
                raise DeferredChecksFailed(f"step {step}: {exc}", rm.failed_calls) from exc
            raise
        return rm, loss

    def interceptor(
        self, step: int, mode: Mode, log: ChunkLog | None, *, defer: bool = False
    ) -> RoundingMode:
        """A fresh interceptor for (part of) step ``step``: its op index starts at 0. A step run
        here has one; :mod:`.microbatch` gives each micro-batch and the update one of their own."""
        return self.mode_class(
            bits=self.cfg.bits,
            tau=self.cfg.tau,
            mode=mode,
            profile=self.profile,
            step=step,
            log=log,
            bands=self.cfg.band_table,
            log_format=self.cfg.log_format,
            count_free=self.count_free,
            checks=self.checks,
            defer=defer,
            immediate=frozenset(self._immediate_calls),
        )

    def _forward_backward_update(
        self, state: TrainState, batch: Batch, step: int, *, serve: bool = True
    ) -> list[Tensor]:
        """The step's work under the interceptor: each micro-batch's forward (torch's random ops and
        attention served by :class:`StockOps`) and backward, gradients summed in micro-batch order,
        then clipping and the update. Every micro-batch's forward starts from the step's buffers
        (BatchNorm's running statistics), which are put back before each (a copy: data movement),
        and the step ends with those the last micro-batch left: so the micro-batches depend on
        the step's state alone, and W workers can run them at once (:mod:`.microbatch`). Returns
        the micro-batches' losses (read once the step is over: no op outside the step's own runs
        under the interceptor). ``serve`` False runs the model's random ops and attention as stock
        torch does (the plain baselines)."""
        micro = self.runtime.micro_batches(batch)
        if needs_closure(state.optimizer):
            return self._closure_update(state, micro, step, serve=serve)
        losses: list[Tensor] = []
        start = StepBuffers(state.model) if len(micro) > 1 else None
        for j, mb in enumerate(micro):
            if start is not None and j:
                start.restore()
            losses.append(self.micro_batch(state.model, mb, step, j, len(micro), serve=serve))
        self.update(state, step, serve=serve)
        return losses

    def _closure_update(
        self, state: TrainState, micro: list[Batch], step: int, *, serve: bool
    ) -> list[Tensor]:
        """The step of an optimizer that evaluates the loss again inside its step (L-BFGS): its
        closure runs the step's micro-batches as :meth:`_forward_backward_update` does (from the
        step's buffers, their draws the same each time: the same function), clips, and returns the
        mean loss; the step's losses are its first evaluation's, at the step's parameters."""
        start, first, calls = StepBuffers(state.model), list[Tensor](), [0]

        def closure() -> float:
            state.optimizer.zero_grad(set_to_none=True)
            losses = []
            for j, mb in enumerate(micro):
                if calls[0] or j:
                    start.restore()
                losses.append(self.micro_batch(state.model, mb, step, j, len(micro), serve=serve))
            if self.cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(
                    state.model.parameters(), self.cfg.clip_grad_norm, foreach=True
                )
            if not calls[0]:
                first.extend(losses)
            calls[0] += 1
            return step_loss(losses)

        state.optimizer.step(closure)
        return first

    def micro_batch(
        self, model: nn.Module, mb: Batch, step: int, index: int, total: int, *, serve: bool = True
    ) -> Tensor:
        """Micro-batch ``index`` of ``total``: its forward (stock torch's random ops and attention
        served by :class:`StockOps` unless ``serve`` is False) and its backward, which adds its
        gradients into ``.grad``. Returns its loss, detached."""
        cfg = self.cfg
        if serve:
            with StockOps(cfg.seed, step, index, mb.example_ids, bits=cfg.bits):
                loss = self.runtime.loss(model, mb)
        else:
            loss = self.runtime.loss(model, mb)
        # An exact multiply (1/M on the grid once): the micro-batches' mean gradient, summed by
        # autograd into .grad in micro-batch order, rounded after every sum.
        (loss if total == 1 else loss * (1.0 / total)).backward()
        return loss.detach()

    def update(self, state: TrainState, step: int, *, serve: bool = True) -> None:
        """Step ``step``'s update on the gradients in ``.grad``: ``clip_grad_norm_`` (foreach) when
        the task clips, then the optimizer's step, what they draw served (:func:`updating`) unless
        ``serve`` is False (the plain baselines: stock torch)."""
        if needs_closure(state.optimizer):  # the data-parallel and the asynchronous updates
            raise ConfigError(
                f"Task.optimizer: {type(state.optimizer).__name__} evaluates the loss again inside its step, "
                "which only a step run in one process can give it: train it without --workers or a "
                "parameter server"
            )
        with (
            updating(self.cfg.seed, step, bits=self.cfg.bits, optimizer=state.optimizer)
            if serve
            else contextlib.nullcontext()
        ):
            if self.cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(
                    state.model.parameters(), self.cfg.clip_grad_norm, foreach=True
                )
            state.optimizer.step()

    def prepare_batch(self, batch: Batch, dtype: torch.dtype = torch.float64, *, rnd: bool = True) -> Batch:
        """Float tensors of the batch in the state's dtype (on the grid when rounding), on the
        profile's device."""

        def conv(t: Tensor) -> Tensor:
            if not t.is_floating_point():
                return t
            t = t.to(dtype)
            if rnd and dtype == torch.float64:
                t = rounding.rnd(t, self.cfg.bits)
            return t

        return Batch(datasets.map_tensors(batch.data, conv), batch.example_ids).to(self.profile.device)

    def place(self, state: TrainState, dtype: torch.dtype = torch.float64) -> None:
        """A decoded state lives on CPU: move it to the profile's device; refuse a dtype mismatch."""
        p = next(state.model.parameters())
        if p.dtype != dtype:
            raise TrainingError(
                f"state is {p.dtype} but the step runs in {dtype}: build it with init_state(precision=...)"
            )
        if p.device != torch.device(self.profile.device) and not (
            self.profile.device == "cuda" and p.device.type == "cuda"
        ):
            move_state(state, self.profile.device)


def engine_for(cfg: TaskConfig, profile: str, *, checks: Checks = "judge") -> StepEngine:
    """A step engine for ``cfg`` on the profile named ``profile`` (ConfigError for an unknown one),
    checking a log's entries as ``checks`` does (:mod:`~game.training.numerics.reach`)."""
    return StepEngine(cfg, get_profile(profile), checks=checks)


__all__ = ["StepEngine", "StepResult", "engine_for"]
