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

Every op runs under the interceptor. A worker records its micro-batch under a rounding mode of its
own, whose op indices start at 0 (:func:`record_micro`); the server records the fold and the update
the same way (:func:`record_apply`) and joins the segments, each shifted by the logged tensors of
the segments before it (:func:`merge_segments`): the chunk one rounding mode would have recorded
over the same work in the same order (:func:`run_update`, which the auditor and the judge replay
under). Why the same bits: each op's inputs are the same tensors on the grid, whichever process
runs it, and the mode's only state across ops is the op index. A synchronous update on a model
without buffers runs exactly the ops of :meth:`~.step.StepEngine.run_step`, which sums the same
gradients into ``.grad`` with the same rounded adds: the same leaf and the same chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from game.errors import TrainingError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.modestate import Mode
from game.training.dispatch.stockops import StockOps
from game.training.engine.runtime import Batch
from game.training.engine.step import StepEngine
from game.training.log.formats import ChunkLog, new_step_log
from game.training.log.packed import StepLog
from game.training.log.schedule import Applied, MicroBatchId
from game.training.log.sparse import SparseStepLog
from game.training.state.checkpoint import parse_state
from game.training.state.tensors import TrainState, persistent_buffers

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
class MicroResult:
    """One micro-batch's work on one version."""

    applied: Applied
    grads: list[Tensor | None]  # per parameter, in ``model.parameters()`` order
    buffers: dict[str, Tensor]  # the persistent buffers after its forward, by name
    loss: Tensor  # its loss (read with :attr:`loss_value` once the rounding mode is left)

    @property
    def loss_value(self) -> float:
        return float(self.loss)


@dataclass(frozen=True)
class Segment:
    """A part of an update's log recorded under a rounding mode of its own: the log, and how many
    tensors it logged (the op indices the next segment is shifted by)."""

    log: ChunkLog
    ops: int


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

    def gradient_pass(self, applied: Applied, weights: Weights, micro: Batch) -> MicroResult:
        """One micro-batch's forward and backward on ``weights``."""
        cfg, model = self.cfg, self.scratch
        self.load(weights)
        model.zero_grad(set_to_none=True)
        with StockOps(cfg.seed, applied.micro.step, applied.micro.index, micro.example_ids, bits=cfg.bits):
            loss = self.engine.runtime.loss(model, micro)
        (loss if cfg.accumulate == 1 else loss * (1.0 / cfg.accumulate)).backward()
        grads = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        buffers = {n: b.clone() for n, b in persistent_buffers(model).items()}
        return MicroResult(applied, grads, buffers, loss.detach())

    def apply_pass(self, state: TrainState, results: Sequence[MicroResult]) -> None:
        """The fold of ``results``' gradients in their order, the last one's buffers, the update."""
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
        with torch.no_grad():
            for n, b in persistent_buffers(state.model).items():
                b.copy_(results[-1].buffers[n])
        if self.cfg.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_grad_norm, foreach=True)
        state.optimizer.step()

    # ---- under a rounding mode ------------------------------------------------------------------

    def rounding_mode(self, step: int, mode: Mode, log: ChunkLog | None) -> RoundingMode:
        engine = self.engine
        return engine.mode_class(
            bits=self.cfg.bits,
            tau=self.cfg.tau,
            mode=mode,
            profile=engine.profile,
            step=step,
            log=log,
            bands=self.cfg.band_table,
            log_format=self.cfg.log_format,
        )

    def record_micro(self, applied: Applied, weights: Weights) -> tuple[MicroResult, Segment]:
        """A worker's micro-batch: its gradients and its segment of the log."""
        micro = self.micro_batch(applied.micro)
        log = new_step_log(self.cfg.log_format, None)
        rm = self.rounding_mode(applied.micro.step, "record", log)
        with self.engine.profile.apply(), rm:
            result = self.gradient_pass(applied, weights, micro)
        rm.finish()
        return result, Segment(log, rm.op_index)

    def record_apply(self, state: TrainState, results: Sequence[MicroResult]) -> Segment:
        """The server's part of update ``state.step + 1``: the fold and the update, recorded."""
        step = state.step + 1
        log = new_step_log(self.cfg.log_format, None)
        rm = self.rounding_mode(step, "record", log)
        with self.engine.profile.apply(), rm:
            self.apply_pass(state, results)
        state.optimizer.zero_grad(set_to_none=True)
        rm.finish()
        self.finish_update(state, step)
        return Segment(log, rm.op_index)

    def run_update(
        self,
        state: TrainState,
        work: Sequence[tuple[Applied, Weights]],
        *,
        mode: Mode = "replay",
        log: ChunkLog | None = None,
    ) -> tuple[ChunkLog | None, list[MicroResult], int]:
        """Update ``state.step + 1`` in one process under one rounding mode: every micro-batch of
        ``work`` (in fold order, each on its version's weights), the fold and the update. Returns
        the log (recorded, or the one replayed), the micro-batches' results and the corrections."""
        step = state.step + 1
        if mode == "record" and log is None:
            log = new_step_log(self.cfg.log_format, step)
        micros = [self.micro_batch(a.micro) for a, _ in work]  # on the grid before the mode
        rm = self.rounding_mode(step, mode, log)
        with self.engine.profile.apply(), rm:
            results = [self.gradient_pass(a, w, m) for (a, w), m in zip(work, micros, strict=True)]
            self.apply_pass(state, results)
        state.optimizer.zero_grad(set_to_none=True)
        rm.finish()
        self.finish_update(state, step)
        return log, results, rm.corrections

    @staticmethod
    def finish_update(state: TrainState, step: int) -> None:
        """After the update, outside the rounding: the scheduler's next lr, the step number."""
        if state.scheduler is not None:
            state.scheduler.step()
        state.step = step


def merge_segments(log_format: str, step: int, segments: Sequence[Segment]) -> ChunkLog:
    """Step ``step``'s log from segments recorded apart, in order, each one's op indices shifted
    by the tensors the segments before it logged."""
    out = new_step_log(log_format, step)
    offset = 0
    for seg in segments:
        if isinstance(out, SparseStepLog):
            if not isinstance(seg.log, SparseStepLog):
                raise TrainingError(f"step {step}: a {seg.log.format} segment in a sparse log")
            for e in seg.log.entries():
                out.append(e.record.op_index + offset, e.record.op_name, e.record.count, e.positions)
        else:
            if not isinstance(seg.log, StepLog):
                raise TrainingError(f"step {step}: a {seg.log.format} segment in a packed log")
            for record, trits in seg.log.entries():
                out.append(record.op_index + offset, record.op_name, trits)
        offset += seg.ops
    return out


__all__ = [
    "MicroResult",
    "Segment",
    "UpdateEngine",
    "Weights",
    "merge_segments",
    "weights_from_bytes",
    "weights_of",
]
