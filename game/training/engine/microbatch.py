"""A step cut at its seams: each micro-batch's gradients and log segment apart, their fold in
micro-batch order, the update, and the segments merged into the step's chunk.

Why: a task fixes ``M = cfg.accumulate`` micro-batches a step. :class:`~.step.StepEngine` runs
them one after another under one interceptor (the auditor, the judge, a one-process trainer);
W workers run them at once (``game.training.parallel``, issue 45; the parameter-server modes
reuse this module, so its API stays put). Both must give the same state bits and the same chunk
bytes. What one process does, and what the pieces here do instead:

* **Gradients.** Autograd leaves micro-batch ``j``'s own gradient ``g_j`` (every value rounded,
  and logged where an inexact op made it) and then adds it into ``.grad``: an exact add, rounded
  without a log (``optable``'s EXACT class). :func:`run_micro_batch` computes ``g_j`` from the
  step's state with ``.grad`` empty; :func:`fold_grads` adds them in micro-batch order,
  ``rnd(...rnd(rnd(g_0 + g_1) + g_2)...)``, the same float64 adds, each rounded: the bits of
  ``.grad``. A parameter a micro-batch does not reach has no ``g_j``, and ``.grad`` is left as it
  was: the fold skips it. Tied weights are one parameter, whose contributions autograd sums inside
  the micro-batch's own backward, the same in both. The ``loss * (1/M)`` scaling is the
  micro-batch's (``total``), clipping comes after the fold (:func:`apply_update`). Another order
  of the adds (a ring all-reduce's, pairwise) gives other bits: not used.
* **The log.** ``RoundingMode.op_index`` counts a step's logged tensors; one process logs
  micro-batch 0's, then 1's, ..., then the update's. Each piece here has an interceptor of its own
  (op indices from 0), and returns its records and how many it logged as a :class:`Segment`;
  :func:`merge_logs` shifts each segment by the counts before it. A sparse chunk lists its op
  names in order of first use and codes op indices as gaps, so the merged log encodes to the
  one-process chunk's bytes; the C++ front and the Python mode record the same records either way
  (``tests/training/test_microbatch.py``). :func:`slice_log` cuts a segment back out of a chunk.
* **Buffers.** Every micro-batch's forward starts from the step's buffers
  (:class:`~game.training.state.tensors.StepBuffers`), and the step ends with those the last
  micro-batch left, in one process as on W workers: a worker that runs the last micro-batch hands
  its buffers on.
* **The update.** :func:`apply_update` puts a folded gradient into ``.grad``, clips, steps the
  optimizer and the scheduler under an interceptor of its own: one process rounds it, and the
  others take its result (never an update rounded on each worker's own hardware).

Deferred CUDA checks are not used here (each piece reads its kernels' checks back at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from game.errors import ConfigError, RoundingLogError
from game.training.dispatch.modestate import Mode
from game.training.engine.runtime import Batch
from game.training.engine.step import StepEngine
from game.training.log.formats import ChunkLog, new_step_log
from game.training.log.packed import StepLog
from game.training.log.sparse import SparseStepLog
from game.training.numerics import rounding
from game.training.state.tensors import StepBuffers, TrainState, step_scheduler

#: The modes a piece of a step runs in (a plain baseline has no log to split).
PIECE_MODES = ("record", "replay", "round")


class Segment(NamedTuple):
    """A piece's part of the step's log: its records, op indices from 0 (None in mode ``round``),
    and how many op indices it took (logged tensors): what the next segment is shifted by."""

    log: ChunkLog | None
    logged: int


@dataclass
class MicroResult:
    """What micro-batch ``index`` of a step produced from the step's state."""

    index: int
    #: its gradient ``g_j``, one entry per ``model.parameters()`` (None: the parameter got none)
    grads: list[Tensor | None]
    segment: Segment
    loss: float
    corrections: int = 0  # rev moves applied (replay)


def run_micro_batch(
    engine: StepEngine,
    model: nn.Module,
    step: int,
    index: int,
    micro: Batch,
    *,
    total: int,
    mode: Mode = "record",
    log: ChunkLog | None = None,
    start: StepBuffers | None = None,
) -> MicroResult:
    """Micro-batch ``index`` of ``total`` in step ``step``: forward and backward on ``model`` as the
    step engine runs them, under an interceptor of its own, with ``.grad`` empty before and after.

    ``micro``: the micro-batch, prepared (``engine.prepare_batch``) and cut
    (``engine.runtime.micro_batches``). ``log``: the segment to replay (``replay``), or an empty log
    to record into (``record``; a fresh one when None). ``start``: the step's buffers, put back
    before the forward (None: the model's buffers are the step's already)."""
    if mode not in PIECE_MODES:
        raise ConfigError(f"mode: a micro-batch runs in {', '.join(PIECE_MODES)}, not {mode!r}")
    if mode == "replay" and log is None:
        raise ConfigError("mode 'replay' needs the micro-batch's log segment")
    if mode == "record" and log is None:
        log = new_step_log(engine.cfg.log_format, step)
    params = list(model.parameters())
    for p in params:
        p.grad = None
    if start is not None:
        start.restore()
    model.train()
    rm = engine.interceptor(step, mode, log)
    with engine.profile.apply(), rm:
        loss = engine.micro_batch(model, micro, step, index, total)
    rm.finish()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return MicroResult(
        index, grads, Segment(log if mode != "round" else None, rm.op_index), float(loss), rm.corrections
    )


def fold_grads(per_micro: Sequence[Sequence[Tensor | None]], bits: int) -> list[Tensor | None]:
    """The micro-batches' gradients summed in the order given (micro-batch order), each float64 sum
    rounded to the ``bits`` grid: what autograd leaves in ``.grad`` after the last backward of one
    process. A parameter with no gradient in a micro-batch skips it; with none in any, None."""
    if not per_micro:
        return []
    n = len(per_micro[0])
    if any(len(grads) != n for grads in per_micro):
        raise ConfigError("fold_grads: the micro-batches have gradients for different parameter lists")
    out: list[Tensor | None] = []
    for k in range(n):
        acc: Tensor | None = None
        for grads in per_micro:
            g = grads[k]
            if g is None:
                continue
            if g.layout is not torch.strided:
                raise ConfigError(
                    f"parameter {k} has a {g.layout} gradient: only dense gradients are folded (sparse=False)"
                )
            if acc is None:
                acc = g
                continue
            acc = torch.add(acc, g)
            rounding.round_(acc, bits)
        out.append(acc)
    return out


def apply_update(
    engine: StepEngine,
    state: TrainState,
    grads: Sequence[Tensor | None],
    step: int,
    *,
    mode: Mode = "record",
    log: ChunkLog | None = None,
    loss: float | None = None,
) -> Segment:
    """The end of step ``step`` on ``state``: ``grads`` (folded, one per ``model.parameters()``)
    into ``.grad``, clipping and the optimizer's step under an interceptor of its own, ``.grad``
    emptied, the scheduler stepped (given ``loss``, the step's, where it takes one), ``state.step``
    set. ``log`` as :func:`run_micro_batch`'s. Returns the update's segment."""
    if mode not in PIECE_MODES:
        raise ConfigError(f"mode: an update runs in {', '.join(PIECE_MODES)}, not {mode!r}")
    if mode == "replay" and log is None:
        raise ConfigError("mode 'replay' needs the update's log segment")
    if mode == "record" and log is None:
        log = new_step_log(engine.cfg.log_format, step)
    if step != state.step + 1:
        raise RoundingLogError(f"cannot update to step {step} the state after step {state.step}")
    params = list(state.model.parameters())
    if len(grads) != len(params):
        raise ConfigError(f"apply_update: {len(grads)} gradients for {len(params)} parameters")
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    rm = engine.interceptor(step, mode, log)
    with engine.profile.apply(), rm:
        engine.update(state, step)
    state.optimizer.zero_grad(set_to_none=True)
    rm.finish()
    step_scheduler(state, loss)  # as StepEngine.run_step: Python floats only
    state.step = step
    return Segment(log if mode != "round" else None, rm.op_index)


# ---- the log ---------------------------------------------------------------------------------


def merge_logs(log_format: str, step: int, segments: Sequence[Segment]) -> ChunkLog:
    """The step's log from its pieces' segments in op order (micro-batch 0, 1, ..., the update):
    each segment's op indices shifted by the counts of the segments before it."""
    out = new_step_log(log_format, step)
    offset = 0
    for seg in segments:
        if seg.log is not None:
            _append_shifted(out, seg.log, offset)
        offset += seg.logged
    return out


def slice_log(log: ChunkLog, start: int, stop: int) -> ChunkLog:
    """The records of ``log`` with op indices in ``[start, stop)``, shifted down by ``start``: a
    piece's segment cut out of a step's chunk (the inverse of :func:`merge_logs`)."""
    if isinstance(log, SparseStepLog):
        table, names, positions = log.columns()
        keep = (table[:, 0] >= start) & (table[:, 0] < stop)
        ends = np.cumsum(table[:, 3])
        starts = ends - table[:, 3]
        picked = [positions[a:b] for a, b in zip(starts[keep].tolist(), ends[keep].tolist(), strict=True)]
        part = table[keep].copy()
        part[:, 0] -= start
        sparse = SparseStepLog(log.step)
        flat = np.concatenate(picked) if picked else np.zeros(0, np.int64)
        sparse.add_rows(part, flat, names)
        return sparse
    packed = StepLog(log.step)
    for record, trits in log.entries():
        if start <= record.op_index < stop:
            packed.append(record.op_index - start, record.op_name, trits)
    return packed


def compact(log: ChunkLog) -> ChunkLog:
    """The same records in a form that pickles small (to send a segment to another process): a
    sparse log as one block of columns, a packed log's trits as tensors of their own."""
    if isinstance(log, SparseStepLog):
        table, names, positions = log.columns()
        out = SparseStepLog(log.step)
        out.add_rows(table, positions, names)
        return out
    packed = StepLog(log.step)
    for record, trits in log.entries():
        packed.append(record.op_index, record.op_name, trits.to("cpu").clone())
    return packed


def _append_shifted(out: ChunkLog, log: ChunkLog, offset: int) -> None:
    if log.format != out.format:
        raise RoundingLogError(f"cannot merge a {log.format} segment into a {out.format} log")
    if isinstance(log, SparseStepLog):
        assert isinstance(out, SparseStepLog)
        table, names, positions = log.columns()
        table[:, 0] += offset
        out.add_rows(table, positions, names)
        return
    assert isinstance(out, StepLog)
    for record, trits in log.entries():
        out.append(record.op_index + offset, record.op_name, trits)


__all__ = [
    "PIECE_MODES",
    "MicroResult",
    "Segment",
    "apply_update",
    "compact",
    "fold_grads",
    "merge_logs",
    "run_micro_batch",
    "slice_log",
]
