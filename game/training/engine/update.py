"""One update from micro-batch gradients, each computed on a state of its own: what a parameter
server applies, what its workers compute, and the one-process run of both that audits them.

An update ``u`` (step ``u``, leaf ``u``) applies ``accumulate`` micro-batches, each with the state
(*version*) its gradients were computed on (:class:`~game.training.log.schedule.Applied`); a
synchronous update computes every one on state ``u - 1``. Its work, in this order, whoever does it::

    for each applied micro-batch, in fold order:       # a worker's, or the one process's
        the version's parameters and buffers loaded into a scratch model
        forward (StockOps keyed by the micro-batch's step, index and example ids) and backward,
        the loss times 1/accumulate (as one process's step)
        -> its gradients, and its buffers after the forward (BatchNorm's running statistics)
    the gradients summed in fold order, each sum rounded (an exact add: no log)   # the server's
    the target's buffers <- the last micro-batch's; clip_grad_norm_; optimizer.step()

The pieces are those of :mod:`.microbatch` (a step cut at its seams, for the data-parallel
trainer): a worker records its micro-batch under an interceptor of its own, op indices from 0
(:meth:`UpdateEngine.record_micro`, :func:`~.microbatch.run_micro_batch` on the version loaded into
a scratch model); the server folds the gradients in order (:func:`~.microbatch.fold_grads`),
records the update (:func:`~.microbatch.apply_update`) and joins the segments, each shifted by the
logged tensors of those before it (:func:`~.microbatch.merge_logs`): the chunk one interceptor
records over the same work in the same order (:meth:`UpdateEngine.run_update`, which the auditor
and the judge replay under, with one cursor over the chunk: where one micro-batch's records end
is known only once it has run). Why the same bits: each op's inputs are the same tensors on the
grid, whichever process runs it, the interceptor's only state across ops is the op index, and the
fold's adds are exact ops, rounded without a log, inside the interceptor or outside it. A
synchronous update runs the ops of :meth:`~.step.StepEngine.run_step`: the same leaf and chunk.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from game.errors import TrainingError
from game.training.dispatch.modestate import Mode
from game.training.engine import carried
from game.training.engine.microbatch import Segment, apply_update, fold_grads, run_micro_batch
from game.training.engine.runtime import Batch
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine
from game.training.log.formats import ChunkLog, decode_chunk, new_step_log
from game.training.log.schedule import Applied, MicroBatchId
from game.training.state.canonical import encode_state
from game.training.state.checkpoint import parse_state
from game.training.state.leaves import state_hash
from game.training.state.schedstate import step_loss
from game.training.state.tensors import TrainState, persistent_buffers, step_scheduler

#: A version's model: ``param/<name>`` and ``buffer/<name>`` tensors (float64, on the grid).
Weights = dict[str, Tensor]


def weights_of(state: TrainState) -> Weights:
    """A copy of a state's parameters and persistent buffers (what a worker computes on)."""
    out = {f"param/{n}": p.detach().clone() for n, p in state.model.named_parameters()}
    out.update({f"buffer/{n}": b.detach().clone() for n, b in persistent_buffers(state.model).items()})
    return out


def weights_from_bytes(data: bytes) -> Weights:
    """A version's model from its canonical state bytes (the optimizer's state left out)."""
    _, tensors = parse_state(data)
    return {
        n: (t.to(torch.float64) if t.is_floating_point() else t)
        for n, t in tensors.items()
        if n.startswith(("param/", "buffer/"))
    }


@dataclass
class MicroWork:
    """One micro-batch's work on one version."""

    applied: Applied
    grads: list[Tensor | None]  # per parameter, in ``model.parameters()`` order
    buffers: dict[str, Tensor]  # the persistent buffers after its forward, by name
    loss: Tensor  # its loss (read with :attr:`loss_value` once the rounding mode is left)

    @property
    def loss_value(self) -> float:
        return float(self.loss)


class UpdateEngine:
    """Runs micro-batches and updates of one task on one hardware profile (a
    :class:`~.step.StepEngine`'s task, profile and interceptor), with a scratch model to compute
    gradients on any version."""

    def __init__(self, engine: StepEngine, poison: dict[int, Batch] | None = None) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.poison = poison or {}  # data step -> the batch a dishonest trainer uses instead
        self._scratch: nn.Module | None = None
        self._batches: dict[int, list[Batch]] = {}
        self._watch = carried.Watch(engine.runtime)  # what the scratch model carries (a worker's)
        #: what an update's optimizer carries, with the model that runs its micro-batches (the
        #: scratch model in one process, the server's own where it only applies): a watch apart,
        #: since a watch follows one model
        self._update_watch = carried.Watch(engine.runtime)

    # ---- inputs ----------------------------------------------------------------------------------

    def micro_batch(self, micro: MicroBatchId) -> Batch:
        """Micro-batch ``micro`` on the profile's device, on the grid (a few steps' batches kept)."""
        parts = self._batches.get(micro.step)
        if parts is None:
            engine = self.engine
            batch = self.poison.get(micro.step)
            batch = engine.batch(micro.step) if batch is None else batch
            parts = engine.runtime.micro_batches(engine.prepare_batch(batch))
            if len(self._batches) >= 8:
                self._batches.pop(next(iter(self._batches)))
            self._batches[micro.step] = parts
        if not 0 <= micro.index < len(parts):
            raise TrainingError(f"micro-batch {micro}: step {micro.step} has {len(parts)} micro-batches")
        return parts[micro.index]

    @property
    def scratch(self) -> nn.Module:
        """The model gradients are computed in (built once, float64, on the profile's device)."""
        if self._scratch is None:
            model = self.engine.runtime.build_model().to(torch.float64)
            self._scratch = model.to(self.engine.profile.device).train()
        return self._scratch

    def load(self, weights: Weights) -> None:
        """Put a version's parameters and buffers into the scratch model."""
        model = self.scratch
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(weights[f"param/{n}"])
            for n, b in persistent_buffers(model).items():
                b.copy_(weights[f"buffer/{n}"])

    # ---- the passes (run under whichever rounding mode the caller entered) -----------------------

    def gradient_pass(self, applied: Applied, weights: Weights, micro: Batch) -> MicroWork:
        """One micro-batch's forward and backward on ``weights``."""
        model = self.scratch
        self.load(weights)
        model.zero_grad(set_to_none=True)
        m = applied.micro
        loss = self.engine.micro_batch(model, micro, m.step, m.index, self.cfg.accumulate)
        grads = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        buffers = {n: b.clone() for n, b in persistent_buffers(model).items()}
        return MicroWork(applied, grads, buffers, loss)

    def apply_pass(self, state: TrainState, results: Sequence[MicroWork]) -> None:
        """The fold of ``results``' gradients in their order, the last one's buffers, the update,
        inside the caller's interceptor: the fold's adds are exact ops, which it rounds without a
        log, the sums :func:`~.microbatch.fold_grads` makes outside one."""
        if not results:
            raise TrainingError(f"update {state.step + 1}: no gradients to apply")
        params = list(state.model.parameters())
        total: list[Tensor | None] = [None if g is None else g.clone() for g in results[0].grads]
        for r in results[1:]:
            for i, g in enumerate(r.grads):
                if g is None:
                    continue
                current = total[i]
                if current is None:
                    total[i] = g.clone()
                else:
                    current.add_(g)
        for p, g in zip(params, total, strict=True):
            p.grad = g
        self.take_buffers(state, results[-1])
        self.engine.update(state, state.step + 1)

    @staticmethod
    def take_buffers(state: TrainState, last: MicroWork) -> None:
        """The update's buffers: those the last micro-batch (in fold order) left (data movement)."""
        with torch.no_grad():
            for n, b in persistent_buffers(state.model).items():
                b.copy_(last.buffers[n])

    # ---- under a rounding mode ------------------------------------------------------------------

    def record_micro(self, applied: Applied, weights: Weights) -> tuple[MicroWork, Segment]:
        """A worker's micro-batch: its gradients and its segment of the log. Its scratch model
        lives on from one micro-batch to the next, where the one-process audit's and the judge's
        do not: what it carries in between is watched as a step engine watches its model
        (:class:`~.carried.Watch`), the micro-batch run again on a scratch model built afresh
        where it changed."""
        judged = self._watch.look(self.scratch, applied.micro.step)
        work, segment = self._record_micro(applied, weights)
        if judged:
            fresh = UpdateEngine(self.engine.judge_engine(), self.poison)  # a scratch model of its own
            self._watch.judge(
                applied.micro.step,
                self._digest(work, segment),
                lambda: self._digest(*fresh._record_micro(applied, weights)),
            )
        return work, segment

    def _record_micro(self, applied: Applied, weights: Weights) -> tuple[MicroWork, Segment]:
        m = applied.micro
        micro = self.micro_batch(m)
        self.load(weights)
        done = run_micro_batch(self.engine, self.scratch, m.step, m.index, micro, total=self.cfg.accumulate)
        buffers = {n: b.clone() for n, b in persistent_buffers(self.scratch).items()}
        return MicroWork(
            applied, done.grads, buffers, torch.tensor(done.loss, dtype=torch.float64)
        ), done.segment

    def _digest(self, work: MicroWork, segment: Segment) -> bytes:
        """A micro-batch's results as bytes to compare: its gradients, buffers and log segment."""
        h = hashlib.sha256()
        for t in [*work.grads, *work.buffers.values()]:
            h.update(
                b"-"
                if t is None
                else t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
            )
        if segment.log is not None:
            h.update(segment.log.encode(0, self.cfg.spec_hash()))
        return h.digest()

    def record_apply(self, state: TrainState, results: Sequence[MicroWork]) -> Segment:
        """The server's part of update ``state.step + 1``: the fold and the update, recorded. The
        server's optimizer lives on from one update to the next, where a judge's is built afresh
        from the committed state: what it carries is watched as a step engine watches its
        (:class:`~.carried.Watch`), the update applied again to a state decoded from its bytes
        where it changed."""
        step = state.step + 1
        watch = self._update_watch
        watch.check_rates(state, step)
        before = (
            encode_state(state)
            if watch.look(state.model, step, state.optimizer, state.scheduled, state.scheduler)
            else None
        )
        if before is None:
            return self._apply(self.engine, state, results)
        # one micro-batch's gradients are folded as they are, and clipping scales them in place:
        # the update applied afresh takes them as they came
        copies = [
            dataclasses.replace(r, grads=[None if g is None else g.clone() for g in r.grads]) for r in results
        ]
        segment = self._apply(self.engine, state, copies)
        watch.judge(step, state_hash(state), lambda: self._apply_afresh(before, results, segment))
        return segment

    def _apply(
        self, engine: StepEngine, state: TrainState, results: Sequence[MicroWork], log: ChunkLog | None = None
    ) -> Segment:
        """The fold of ``results``' gradients and the update on ``state``: recorded, or replayed
        from ``log``."""
        if not results:
            raise TrainingError(f"update {state.step + 1}: no gradients to apply")
        grads = fold_grads([r.grads for r in results], self.cfg.bits)
        self.take_buffers(state, results[-1])
        loss = step_loss([r.loss_value for r in results])
        if log is None:
            return apply_update(engine, state, grads, state.step + 1, loss=loss)
        return apply_update(engine, state, grads, state.step + 1, mode="replay", log=log, loss=loss)

    def _apply_afresh(self, before: bytes, results: Sequence[MicroWork], segment: Segment) -> bytes:
        """The leaf of :meth:`record_apply`'s update as a judge computes it: on the state decoded
        from ``before`` (an optimizer built afresh), replaying the update's segment."""
        judge = self.engine.judge_engine()
        state = decode_state(before, self.cfg, device=judge.profile.device)
        assert segment.log is not None
        self._apply(judge, state, results, self._fresh_log(segment.log, state.step + 1))
        return state_hash(state)

    def _fresh_log(self, log: ChunkLog, step: int) -> ChunkLog:
        """``log`` through its bytes: a chunk to replay from its start, as a judge reads it."""
        spec = self.cfg.spec_hash()
        return decode_chunk(log.encode(step, spec), spec, step)

    def run_update(
        self,
        state: TrainState,
        work: Sequence[tuple[Applied, Weights]],
        *,
        mode: Mode = "replay",
        log: ChunkLog | None = None,
    ) -> tuple[ChunkLog | None, list[MicroWork], int]:
        """Update ``state.step + 1`` in one process under one rounding mode: every micro-batch of
        ``work`` (in fold order, each on its version's weights), the fold and the update. Returns
        the log (recorded, or the one replayed), the micro-batches' results and the corrections."""
        step = state.step + 1
        before: bytes | None = None
        if mode == "record":
            log = new_step_log(self.cfg.log_format, step) if log is None else log
            self._update_watch.check_rates(state, step)
            if self._update_watch.look(self.scratch, step, state.optimizer, state.scheduled, state.scheduler):
                before = encode_state(state)
        result = self._run_update(state, work, mode, log)
        if before is not None:
            assert log is not None
            recorded = log
            self._update_watch.judge(
                step, state_hash(state), lambda: self._update_afresh(before, work, recorded, step)
            )
        return result

    def _update_afresh(
        self, before: bytes, work: Sequence[tuple[Applied, Weights]], log: ChunkLog, step: int
    ) -> bytes:
        """The leaf of a recorded :meth:`run_update` as a judge computes it: a scratch model and a
        state (an optimizer) built afresh, from ``before``, replaying the update's chunk."""
        judge = UpdateEngine(self.engine.judge_engine(), self.poison)
        state = decode_state(before, self.cfg, device=judge.engine.profile.device)
        judge._run_update(state, work, "replay", self._fresh_log(log, step))
        return state_hash(state)

    def _run_update(
        self, state: TrainState, work: Sequence[tuple[Applied, Weights]], mode: Mode, log: ChunkLog | None
    ) -> tuple[ChunkLog | None, list[MicroWork], int]:
        """:meth:`run_update`'s work, unwatched."""
        step = state.step + 1
        micros = [self.micro_batch(a.micro) for a, _ in work]  # on the grid before the mode
        _ = self.scratch  # built before the mode: a construction's ops (a parametrization's) are no update's
        rm = self.engine.interceptor(step, mode, log)
        with self.engine.profile.apply(), rm:
            results = [self.gradient_pass(a, w, m) for (a, w), m in zip(work, micros, strict=True)]
            self.apply_pass(state, results)
        state.optimizer.zero_grad(set_to_none=True)
        rm.finish()
        self.finish_update(state, step, step_loss([r.loss_value for r in results]))
        return log, results, rm.corrections

    @staticmethod
    def finish_update(state: TrainState, step: int, loss: float) -> None:
        """After the update, outside the rounding: the scheduler's next lr (given ``loss``, the
        mean of the applied micro-batches' losses, where it takes one), the step number."""
        step_scheduler(state, loss)
        state.step = step


__all__ = ["MicroWork", "UpdateEngine", "Weights", "weights_from_bytes", "weights_of"]
