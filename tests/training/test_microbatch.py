"""A step cut into micro-batches run apart (engine/microbatch.py): the one-process step's bits and
chunk bytes whatever the order the pieces ran in, through the C++ front and the Python mode; the
fold's order matters; the buffers' rule; segments cut back out of a chunk replay."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.engine import microbatch as mb
from game.training.engine.step import StepEngine
from game.training.log.formats import ChunkLog
from game.training.native import front
from game.training.numerics import rounding
from game.training.state.leaves import state_hash
from game.training.state.tensors import StepBuffers, TrainState, persistent_buffers
from game.training.task.config import TaskConfig
from tests.training.test_step import SMALL, small_cfg

M = 4


def _cfg(preset: str, **overrides: object) -> TaskConfig:
    return small_cfg(preset, accumulate=M, dropout=0.1, clip_grad_norm=0.5, **overrides)


def _pieces(
    engine: StepEngine, state: TrainState, step: int, order: Sequence[int]
) -> tuple[list[mb.MicroResult], mb.Segment, ChunkLog]:
    """Step ``step`` as W workers run it: every micro-batch from the step's state, computed in
    ``order`` (one worker's after another's), the buffers the last micro-batch left kept, the
    gradients folded and the segments merged in micro-batch order."""
    cfg = engine.cfg
    micro = engine.runtime.micro_batches(engine.prepare_batch(engine.batch(step)))
    start = StepBuffers(state.model)
    done: dict[int, mb.MicroResult] = {}
    for j in order:
        done[j] = mb.run_micro_batch(engine, state.model, step, j, micro[j], total=M, start=start)
        if j == M - 1:
            last = StepBuffers(state.model)  # what the worker of the last micro-batch hands on
    last.restore()
    results = [done[j] for j in range(M)]
    update = mb.apply_update(engine, state, mb.fold_grads([r.grads for r in results], cfg.bits), step)
    return results, update, mb.merge_logs(cfg.log_format, step, [r.segment for r in results] + [update])


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
@pytest.mark.parametrize("preset", list(SMALL))
def test_piecesInAnyOrder_giveTheOneProcessStep(preset: str, log_format: str) -> None:
    """Three steps: the micro-batches computed apart (in order, then as two workers and as four
    would, last first) give the one-process step's state hash and chunk bytes, through the C++ front
    and through the Python mode."""
    cfg = _cfg(preset, log_format=log_format)
    spec = cfg.spec_hash()
    for via_front in (True, False):
        with contextlib.nullcontext() if via_front else front.disabled():
            one, apart = StepEngine(cfg, get_profile("cpu-1t")), StepEngine(cfg, get_profile("cpu-1t"))
            s1, s2 = one.init_state(), apart.init_state()
            for step, order in zip((1, 2, 3), ([0, 1, 2, 3], [2, 3, 0, 1], [3, 2, 1, 0]), strict=True):
                r = one.run_step(s1, step)
                results, update, log = _pieces(apart, s2, step, order)
                assert r.log is not None and len(r.log) > 0
                assert state_hash(s2) == r.leaf, f"step {step}"
                assert log.encode(step, spec) == r.log.encode(step, spec), f"step {step}"
                assert one.last_mode is not None and update.logged > 0
                assert sum(x.segment.logged for x in results) + update.logged == one.last_mode.op_index
                assert r.loss == pytest.approx(sum(x.loss for x in results) / M, rel=1e-12)


@pytest.mark.parametrize("preset", list(SMALL))
def test_theFoldsOrder_changesTheBits(preset: str) -> None:
    """The gradients summed in reverse, or pairwise as a ring all-reduce of two workers sums them,
    give other bits than micro-batch order (which is what the one-process step's ``.grad`` holds)."""
    cfg = _cfg(preset)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    differs = {"reverse": False, "pairwise": False}
    for step in (1, 2, 3):
        micro = engine.runtime.micro_batches(engine.prepare_batch(engine.batch(step)))
        start = StepBuffers(state.model)
        grads = [
            mb.run_micro_batch(engine, state.model, step, j, micro[j], total=M, start=start).grads
            for j in range(M)
        ]
        ordered = mb.fold_grads(grads, cfg.bits)
        reverse = mb.fold_grads(grads[::-1], cfg.bits)
        pairs = mb.fold_grads(
            [mb.fold_grads(grads[:2], cfg.bits), mb.fold_grads(grads[2:], cfg.bits)], cfg.bits
        )
        for name, other in (("reverse", reverse), ("pairwise", pairs)):
            differs[name] |= any(
                not torch.equal(a, b)
                for a, b in zip(ordered, other, strict=True)
                if a is not None and b is not None
            )
        mb.apply_update(engine, state, ordered, step)
    assert differs == {"reverse": True, "pairwise": True}


def test_buffers_eachMicroBatchStartsFromTheStepsAndTheLastOnesAreKept() -> None:
    """cnn-digits (BatchNorm): after a step of four micro-batches the running statistics are those
    the last micro-batch's forward makes from the step's own, whatever the three before it saw."""
    cfg = _cfg("cnn-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state, probe = engine.init_state(), engine.init_state()
    before = {n: b.clone() for n, b in persistent_buffers(state.model).items()}
    engine.run_step(state, 1)
    micro = engine.runtime.micro_batches(engine.prepare_batch(engine.batch(1)))
    mb.run_micro_batch(engine, probe.model, 1, M - 1, micro[M - 1], total=M)
    after, alone = persistent_buffers(state.model), persistent_buffers(probe.model)
    running = [n for n in after if n.endswith("running_mean")]
    assert running
    for name in after:
        assert torch.equal(after[name], alone[name]), name
    assert all(not torch.equal(after[n], before[n]) for n in running)
    assert all(int(after[n]) == 1 for n in after if n.endswith("num_batches_tracked"))  # one a step


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_segmentsCutFromTheChunk_replayEachPieceOnAnotherProfile(log_format: str) -> None:
    """The trainer's merged chunk cut back into segments (by the counts) replays piece by piece on
    the noisy profile, with corrections, to the trainer's state; merged again it is the chunk."""
    cfg = _cfg("gpt-shakespeare", log_format=log_format)
    spec = cfg.spec_hash()
    trainer, auditor = StepEngine(cfg, get_profile("cpu-1t")), StepEngine(cfg, get_profile("noisy"))
    st, sa = trainer.init_state(), auditor.init_state()
    corrections = 0
    for step in (1, 2):
        results, _, chunk = _pieces(trainer, st, step, range(M))
        counts = [r.segment.logged for r in results]
        bounds = [sum(counts[:j]) for j in range(M + 1)]
        segments = [mb.slice_log(chunk, bounds[j], bounds[j + 1]) for j in range(M)]
        update_seg = mb.slice_log(chunk, bounds[M], 2**32)
        for j in range(M):
            assert segments[j].encode(step, spec) == mb.compact(results[j].segment.log).encode(step, spec)  # type: ignore[arg-type]
        micro = auditor.runtime.micro_batches(auditor.prepare_batch(auditor.batch(step)))
        start = StepBuffers(sa.model)
        replayed = [
            mb.run_micro_batch(
                auditor, sa.model, step, j, micro[j], total=M, mode="replay", log=segments[j], start=start
            )
            for j in range(M)
        ]
        corrections += sum(r.corrections for r in replayed)
        update = mb.apply_update(
            auditor,
            sa,
            mb.fold_grads([r.grads for r in replayed], cfg.bits),
            step,
            mode="replay",
            log=update_seg,
        )
        merged = mb.merge_logs(log_format, step, [r.segment for r in replayed] + [update])
        assert merged.encode(step, spec) == chunk.encode(step, spec)
        assert state_hash(sa) == state_hash(st)
    assert corrections > 0


def test_fold_skipsAParameterAMicroBatchNeverReached_asAutogradDoes() -> None:
    """A parameter that one micro-batch's backward does not reach keeps ``.grad`` as it was in one
    process; the fold skips that micro-batch for it (no add of zeros: -0.0 + 0.0 is 0.0)."""
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
    for p in (*a.parameters(), *b.parameters()):
        p.data = rounding.rnd(p.data, 32)
    xs = [rounding.rnd(torch.randn(4, 3, dtype=torch.float64), 32) for _ in range(3)]
    uses_b = [True, False, True]
    params = [*a.parameters(), *b.parameters()]

    def loss(j: int) -> torch.Tensor:
        out = a(xs[j]).sum() * 0.5
        return out + b(xs[j]).pow(2).sum() if uses_b[j] else out

    mode = RoundingMode(bits=32, tau=0.25, mode="round", profile=get_profile("cpu-1t"), step=1)
    with mode:
        for j in range(3):
            loss(j).backward()
    together = [p.grad for p in params]
    apart: list[list[torch.Tensor | None]] = []
    for j in range(3):
        for p in params:
            p.grad = None
        with RoundingMode(bits=32, tau=0.25, mode="round", profile=get_profile("cpu-1t"), step=1):
            loss(j).backward()
        apart.append([p.grad for p in params])
    assert apart[1][2] is None and apart[1][3] is None
    folded = mb.fold_grads(apart, 32)
    for t, f in zip(together, folded, strict=True):
        assert t is not None and f is not None and torch.equal(t, f)
    assert mb.fold_grads([[None], [None]], 32) == [None]


def test_mergeAndSlice_refuseWhatDoesNotFit() -> None:
    cfg = _cfg("mlp-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    micro = engine.runtime.micro_batches(engine.prepare_batch(engine.batch(1)))
    r = mb.run_micro_batch(engine, state.model, 1, 0, micro[0], total=M)
    with pytest.raises(Exception, match="cannot merge a sparse segment into a packed log"):
        mb.merge_logs("packed", 1, [r.segment])
    with pytest.raises(Exception, match="runs in record, replay, round, not 'plain'"):
        mb.run_micro_batch(engine, state.model, 1, 0, micro[0], total=M, mode="plain")
    with pytest.raises(Exception, match="cannot update to step 3"):
        mb.apply_update(engine, state, r.grads, 3)
