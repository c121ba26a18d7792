"""The Triton kernels against the torch ones: the same bits, the same counts, nothing written on refusal.

Without a GPU they run on CPU tensors in Triton's interpreter (set here before the module is first
imported); with one, on the GPU. Either way the reference is the torch path with the C kernels off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.dispatch.profiles import get_profile
from game.training.engine import step as step_mod
from game.training.engine.step import StepEngine
from game.training.log.sparse import SparseStepLog
from game.training.native import bindings, front, library
from game.training.numerics import bandcheck, rounding
from game.training.numerics.bandfile import Band
from game.training.task.config import TaskConfig, load_config

from .test_bandcheck import _mixed_values, _perturb
from .test_native import AUDITOR_CASES, TAILS, TRAINER_CASES, _values, block_edge_case
from .test_rng import SeenOps
from .test_step import small_cfg
from .test_task_api import CTC_PY, TASK_PY, make_plugin
from .test_unusual_results import FORWARDS

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from game.training.numerics import cuda_deferred, cuda_kernels  # noqa: E402  (Triton reads TRITON_INTERPRET at import)

DEV = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.skipif(not cuda_kernels.available(), reason="Triton is not installed")
BAND = Band(-35, -46)


#: The two ways a tensor is done: one program for it all (small tensors), or a program per block.
LAYOUTS = ["one program", "a program per block"]


@contextlib.contextmanager
def _layout(layout: str) -> Iterator[None]:
    """Run the kernels the given way, whatever the tensor's size."""
    saved = cuda_kernels.ONE_PROGRAM_MAX
    cuda_kernels.ONE_PROGRAM_MAX = 1 << 62 if layout == "one program" else 0
    try:
        yield
    finally:
        cuda_kernels.ONE_PROGRAM_MAX = saved


def _params(bits: int, band: Band) -> bindings.BandParams:
    g = rounding._grid(bits)
    return bindings.BandParams(g.k0, g.max_finite, band.rel, band.abs)


def _copy(x: torch.Tensor) -> torch.Tensor:
    """A copy on the kernels' device (on CPU, ``to`` alone would hand back ``x`` itself)."""
    return x.to(DEV, copy=True)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().cpu().view(torch.int64)


@settings(max_examples=40, deadline=None)
@given(**TRAINER_CASES, layout=st.sampled_from(LAYOUTS))
def test_trainerKernel_equalsTorch(
    seed: int, bits: int, rel: int, gap: int, tail: str, scale: float, layout: str
) -> None:
    band = Band(rel, max(rel - gap, -60))
    x = _values(seed, bits, tail, scale)
    with library.disabled():
        want_r, want_p = bandcheck.round_and_band(x, bits, band)
    buf = _copy(x)
    with _layout(layout):
        got = cuda_kernels.round_and_band(buf, _params(bits, band))
    if tail == "subnormal":  # a rare lane: refused, nothing written
        assert got is None and torch.equal(_bits(buf), _bits(x))
        return
    assert got is not None
    assert torch.equal(_bits(buf), _bits(want_r)) and torch.equal(got.cpu(), want_p)


@settings(max_examples=40, deadline=None)
@given(**AUDITOR_CASES, layout=st.sampled_from(LAYOUTS))
def test_auditorKernel_equalsTorch(
    seed: int, bits: int, tail: str, extra: int, count_free: bool, layout: str
) -> None:
    x_t = _values(seed, bits, tail, 1.0)
    x_a = _perturb(x_t, 2.0**-40, seed + 1)
    with library.disabled():
        _, honest = bandcheck.round_and_band(x_t, bits, BAND)
        free, _ = bandcheck.within(
            x_a.view(torch.int64), bits, BAND, 4, bandcheck.top_binade(x_a.view(torch.int64))
        )
        g = torch.Generator().manual_seed(seed)
        positions = torch.cat([honest, free[torch.randperm(free.numel(), generator=g)[:extra]]]).unique()
        want = bandcheck.round_with_entries(x_a, bits, BAND, positions, count_free=count_free)
    buf = _copy(x_a)
    with _layout(layout):
        got = cuda_kernels.round_with_entries(buf, _params(bits, BAND), positions, count_free)
    if tail == "subnormal":
        assert got is None and torch.equal(_bits(buf), _bits(x_a))
        return
    assert got is not None
    assert torch.equal(_bits(buf), _bits(want.rounded))
    assert (got.corrections, got.free) == (want.corrections, want.free)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [1023, 1024, 1025, 4096 + 3])
def test_kernels_acrossBlockEdges_equalTorch(size: int, layout: str) -> None:
    """Programs take 1024 lanes each: entries on both sides of every edge and a last partial block."""
    band, x, positions = block_edge_case(size)
    with library.disabled():
        want_r, want_p = bandcheck.round_and_band(x, 32, band)
        want = bandcheck.round_with_entries(x, 32, band, positions, count_free=True)
    t, a = _copy(x), _copy(x)
    with _layout(layout):
        listed = cuda_kernels.round_and_band(t, _params(32, band))
        got = cuda_kernels.round_with_entries(a, _params(32, band), positions, True)
    assert listed is not None and torch.equal(listed.cpu(), want_p)
    assert torch.equal(_bits(t), _bits(want_r))
    assert got is not None and (got.corrections, got.free) == (want.corrections, want.free)
    assert torch.equal(_bits(a), _bits(want.rounded)) and got.corrections > 0


def _far_lane(x: torch.Tensor) -> int:
    geo = bandcheck.geometry(x.view(torch.int64), 32, BAND)
    return int((geo.off & (geo.distance > (geo.band << 5))).nonzero()[0, 0])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["descending", "repeated", "negative", "past-end", "outside", "zero"])
def test_auditorKernel_refusesBadEntries_writingNothing(case: str, layout: str) -> None:
    """Order, range, band and a listed zero: refused before anything is written; torch words it."""
    x = _mixed_values(1500, 5, 32)
    x[7] = 0.0
    positions = {
        "descending": [5, 3],
        "repeated": [4, 4],
        "negative": [-1, 2],
        "past-end": [2, 2000],
        "outside": [1, _far_lane(x)],
        "zero": [3, 7],
    }[case]
    buf = _copy(x)
    with _layout(layout):
        got = cuda_kernels.round_with_entries(buf, _params(32, BAND), torch.tensor(positions), False)
    assert got is None
    assert torch.equal(_bits(buf), _bits(x))
    if case != "zero":  # a listed zero is refused by the kernels only (the torch path takes it)
        with pytest.raises(bandcheck.BandViolation):
            bandcheck.round_with_entries(x, 32, BAND, torch.tensor(positions))


@pytest.mark.parametrize("bits", [32, 27, 16])
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_inPlaceRounding_equalsTorch(bits: int, tail: str) -> None:
    x = _values(7, bits, tail, -5.0)
    want = rounding.rnd(x, bits, top=float("inf"))
    buf = _copy(x)
    done = cuda_kernels.round_inplace(buf, *_params(bits, BAND)[:2])
    assert done == (tail != "subnormal")
    if not done:  # the normal lanes may be rounded already; the torch path finishes the job
        rounding.round_(buf, bits)
    assert torch.equal(_bits(buf), _bits(want))


def test_notTheirs_isLeftToTorch() -> None:
    """float32, empty and non-contiguous tensors are the torch kernels' (or, on CPU, the C ones')."""
    assert not cuda_kernels.usable(torch.zeros(4, dtype=torch.float32, device=DEV))
    assert not cuda_kernels.usable(torch.zeros(0, dtype=torch.float64, device=DEV))
    assert not cuda_kernels.usable(torch.zeros(4, 4, dtype=torch.float64, device=DEV).t())
    assert cuda_kernels.round_and_band(torch.zeros(4, 4, dtype=torch.float64).t(), _params(32, BAND)) is None


# ---- deferred checks: one read-back a step ------------------------------------------------------


def _auditor_case(seed: int, tail: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """An auditor's values (the trainer's, perturbed) and the trainer's honest positions."""
    x_t = _values(seed, 32, tail, 1.0)
    with library.disabled():
        _, honest = bandcheck.round_and_band(x_t, 32, BAND)
    return _perturb(x_t, 2.0**-40, seed + 1), honest


@pytest.mark.parametrize("layout", LAYOUTS)
def test_deferred_equalsTheImmediateKernels(layout: str) -> None:
    """Many calls, one settle: the same bits, positions and counts as one call at a time."""
    with _layout(layout):
        _deferred_equalsTheImmediateKernels()


def _deferred_equalsTheImmediateKernels() -> None:
    deferred = cuda_deferred.Deferred(torch.device(DEV))
    trainer = [_values(s, 32, tail, 1.0) for s, tail in ((1, "none"), (2, "zero"), (3, "none"))]
    bufs = [_copy(x) for x in trainer]
    tickets = [deferred.round_and_band(b, _params(32, BAND)) for b in bufs]
    exact = _copy(_values(4, 32, "zero", -5.0))
    assert deferred.round_inplace(exact, *_params(32, BAND)[:2])
    auditor = [_auditor_case(s) for s in (5, 6)]
    abufs = [_copy(x) for x, _ in auditor]
    for b, (_, pos) in zip(abufs, auditor, strict=True):
        assert deferred.round_with_entries(b, _params(32, BAND), pos, pos.to(DEV))
    settled = deferred.settle()
    assert settled is not None
    with library.disabled():
        for x, b, t in zip(trainer, bufs, tickets, strict=True):
            want_r, want_p = bandcheck.round_and_band(x, 32, BAND)
            assert t is not None and torch.equal(settled.positions(t), want_p)
            assert torch.equal(_bits(b), _bits(want_r))
        assert torch.equal(_bits(exact), _bits(rounding.rnd(_values(4, 32, "zero", -5.0), 32)))
        wants = [bandcheck.round_with_entries(x, 32, BAND, p, count_free=True) for x, p in auditor]
    for b, want in zip(abufs, wants, strict=True):
        assert torch.equal(_bits(b), _bits(want.rounded))
    assert settled.corrections == sum(w.corrections for w in wants) > 0
    assert settled.free == sum(w.free for w in wants)
    # the split across tickets was exercised: listed lanes in more than one ticket
    assert sum(settled.size(t) > 0 for t in range(len(tickets))) > 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("failing", ["rare trainer lane", "rare exact lane", "entry outside", "listed zero"])
def test_deferred_oneFailedCheck_settlesToNone(failing: str, layout: str) -> None:
    """A call that needs the torch path is only known at the end: settle says the step must rerun."""
    with _layout(layout):
        _deferred_oneFailedCheck_settlesToNone(failing)


def _deferred_oneFailedCheck_settlesToNone(failing: str) -> None:
    deferred = cuda_deferred.Deferred(torch.device(DEV))
    assert deferred.round_and_band(_copy(_values(1, 32, "none", 1.0)), _params(32, BAND)) is not None
    x = _mixed_values(1500, 5, 32)
    x[7] = 0.0
    if failing == "rare trainer lane":
        assert deferred.round_and_band(_copy(_values(2, 32, "subnormal", 1.0)), _params(32, BAND)) is not None
    elif failing == "rare exact lane":
        assert deferred.round_inplace(_copy(_values(2, 32, "subnormal", 1.0)), *_params(32, BAND)[:2])
    else:
        pos = torch.tensor([1, _far_lane(x)] if failing == "entry outside" else [3, 7])
        assert deferred.round_with_entries(_copy(x), _params(32, BAND), pos, pos.to(DEV))
    assert deferred.round_and_band(_copy(_values(3, 32, "none", 1.0)), _params(32, BAND)) is not None
    assert deferred.settle().failed == (1,)  # the second call; the others passed


def _dense_entries(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values a hair from their float32 grid's midpoints, each nearer its odd neighbour where its
    lane is to be listed: every other lane, but all of the second block (1,024 entries in one
    program's lanes), none of the third, and both lanes of every block edge; and the trainer's
    entries for them, more than a program samples at once (so its search for a block's first entry
    narrows in rounds)."""
    k = torch.arange(size, dtype=torch.float64)
    listed = k % 2 == 0
    listed[1024:2048], listed[2048:3072] = True, False
    for edge in range(3072, size, 1024):
        listed[edge - 1 : edge + 1] = True
    up_is_odd = k % 2 == 0  # grid point k of [1, 2) is odd where k is
    x = 1.0 + k * 2.0**-23 + 2.0**-24 + torch.where(listed == up_is_odd, 2.0**-45, -(2.0**-45))
    with library.disabled():
        _, honest = bandcheck.round_and_band(x, 32, BAND)
    assert torch.equal(honest, listed.nonzero().squeeze(1)) and honest.numel() > cuda_kernels.BLOCK
    return x, honest


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("grouped", [False, True])
def test_deferredAuditor_denseEntriesAcrossBlocks_equalsTorch(grouped: bool, layout: str) -> None:
    """A deferred auditor's one pass after the scan (check, round, write the listed lanes) against the
    torch path: a block listed whole, a block with none, entries on both sides of every edge, a last
    partial block; as one call, and in a group (chunks of two blocks) beside a tensor with none; in
    one program, and a program a block (a chunk)."""
    x_t, honest = _dense_entries(5 * 1024 + 37)
    x_a = _perturb(x_t, 2.0**-40, 3)  # across some midpoints: the entries correct them
    other = _values(8, 32, "none", 2.0)
    with library.disabled():
        want = bandcheck.round_with_entries(x_a, 32, BAND, honest, count_free=True)
        want_other = bandcheck.round_with_entries(other, 32, BAND, honest[:0], count_free=True)
    bufs = [_copy(x_a), _copy(other)]
    deferred = cuda_deferred.Deferred(torch.device(DEV))
    saved = cuda_kernels.ONE_PROGRAM_MAX
    cuda_kernels.ONE_PROGRAM_MAX = 1 << 62 if layout == "one program" else 0
    try:
        if grouped:
            from game.training.numerics import cuda_groups

            chunk, cuda_groups.CHUNK = cuda_groups.CHUNK, 2 * cuda_kernels.BLOCK
            try:
                assert deferred.takes_group(bufs, [True, True])
                deferred.round_with_entries_group(
                    bufs, _params(32, BAND), [honest.numel(), 0], honest.to(DEV), [0, honest.numel()]
                )
            finally:
                cuda_groups.CHUNK = chunk
        else:
            assert deferred.round_with_entries(bufs[0], _params(32, BAND), honest, honest.to(DEV), True)
            assert deferred.round_with_entries(
                bufs[1], _params(32, BAND), honest[:0], honest[:0].to(DEV), True
            )
    finally:
        cuda_kernels.ONE_PROGRAM_MAX = saved
    settled = deferred.settle()
    assert settled.failed == ()
    assert torch.equal(_bits(bufs[0]), _bits(want.rounded)) and torch.equal(
        _bits(bufs[1]), _bits(want_other.rounded)
    )
    assert settled.corrections == want.corrections + want_other.corrections > 0
    assert settled.free == want.free + want_other.free


def test_deferred_entriesOutOfOrder_launchNothing() -> None:
    """Order and range are checked on the host copy at once: nothing launched, the caller goes on
    with the immediate path (which words the error)."""
    deferred = cuda_deferred.Deferred(torch.device(DEV))
    x = _mixed_values(1500, 5, 32)
    buf = _copy(x)
    for bad in ([5, 3], [-1, 2], [2, 2000]):
        pos = torch.tensor(bad)
        assert not deferred.round_with_entries(buf, _params(32, BAND), pos, pos.to(DEV))
    assert torch.equal(_bits(buf), _bits(x))
    settled = deferred.settle()
    assert settled.listed.size == 0 and settled.bounds == [0] and settled[2:] == (0, 0, ())


# ---- deferred checks in whole steps -------------------------------------------------------------

#: Where the step tests run: the GPU, else this CPU through Triton's interpreter (any profile device
#: is the kernels' then).
STEP_PROFILE = "cuda" if ON_GPU else "cpu-1t"


def _engines(preset: str | TaskConfig, profile: str = STEP_PROFILE) -> tuple[StepEngine, StepEngine]:
    """A deferring engine and an immediate one (the C kernels on CPU) of one small task."""
    cfg = small_cfg(preset) if isinstance(preset, str) else preset
    deferring, immediate = StepEngine(cfg, get_profile(profile)), StepEngine(cfg, get_profile(profile))
    deferring.defer_anywhere = True  # without a GPU: CPU tensors in Triton's interpreter
    immediate.defer = False
    return deferring, immediate


@pytest.fixture
def settles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The calls each Deferred.settle read back (so a test sees the deferred path ran, and took
    tensors rather than leaving them all to the immediate one)."""
    calls: list[int] = []
    real = cuda_deferred.Deferred.settle

    def counted(self: cuda_deferred.Deferred) -> cuda_deferred.Settled | None:
        calls.append(self._rows)
        return real(self)

    monkeypatch.setattr(cuda_deferred.Deferred, "settle", counted)
    return calls


LLAMA_PY = """
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from game.api import Task, TokenWindows, task
from game.training.task import data as packaged


def lm_loss(model, batch):
    inputs, targets = batch
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@task(model={}, optimizer="adamw", lr=1e-3, batch_size=2, steps=2)
def build(cfg):
    config = LlamaConfig(vocab_size=len(packaged.vocab()), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=8, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return Task(model=lambda: LlamaForCausalLM(config),
                dataset=TokenWindows(packaged.shakespeare_tokens("train"), 8), loss=lm_loss,
                libraries=("transformers",))
"""


@pytest.mark.parametrize("task", ["mlp-digits", "llama", "fft"])
def test_deferredSteps_equalImmediateOnes(settles: list[int], task: str, tmp_path: Path) -> None:
    """Trainer and auditor with deferred checks: the same leaves, log bytes and corrections. Llama's
    rotary table and RMSNorm compute in float32: their float64 twins (dispatch/widen.py) go through
    the deferred kernels, and are written back into the float32 results before the step reads them.
    An FFT's complex results go through them as their float64 lanes."""
    if task == "llama":
        pytest.importorskip("transformers")
        make_plugin(tmp_path, LLAMA_PY)
    if task == "fft":
        make_plugin(
            tmp_path, TASK_PY.replace("        return self.b(torch.tanh(self.a(x)))", FORWARDS["float64"])
        )
    deferring, immediate = _engines(task if task == "mlp-digits" else load_config(tmp_path / "task.toml"))
    noisy = StepEngine(deferring.cfg, get_profile("noisy"))  # a trainer whose log needs corrections
    spec = deferring.cfg.spec_hash()
    s_rec, s_imm, s_noisy, s_aud, s_built, s_aud_imm = (
        e.init_state() for e in (deferring, immediate, noisy, deferring, deferring, immediate)
    )
    corrections = 0
    for step in (1, 2):
        rec = deferring.run_step(s_rec, step, mode="record")
        imm = immediate.run_step(s_imm, step, mode="record")
        assert rec.leaf == imm.leaf
        assert rec.log is not None and imm.log is not None
        assert rec.log.encode(step, spec) == imm.log.encode(step, spec)
        chunk = noisy.run_step(s_noisy, step, mode="record").log
        assert chunk is not None and isinstance(rec.log, SparseStepLog)
        assert rec.log.decoded_rows() is None  # a record step's log is built, not read
        # as read from a transcript (its entries taken as decoded), and as built by a trainer
        read = SparseStepLog.decode(chunk.encode(step, spec), step=step, spec_hash=spec)
        assert read.decoded_rows() is not None
        aud = deferring.run_step(s_aud, step, mode="replay", log=read)
        built = deferring.run_step(s_built, step, mode="replay", log=chunk)
        aud_imm = immediate.run_step(s_aud_imm, step, mode="replay", log=chunk)
        assert aud.leaf == built.leaf == aud_imm.leaf
        assert aud.corrections == built.corrections == aud_imm.corrections
        corrections += aud.corrections
    assert corrections > 0 and len(settles) == 6 and min(settles) > 0


def test_deferredStep_whoseCheckFailed_runsAgainFromTheSameState(
    settles: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed read-back (here forced at step 2, for the first call, after the whole step ran on the
    deferred path) reruns the step without deferral from a copy of the state: the result and the log
    are those of an immediate step, nothing doubled. Later steps check that call at once."""
    deferring, immediate = _engines("mlp-digits")
    real = cuda_deferred.Deferred.settle

    def failing_at_step_2(self: cuda_deferred.Deferred) -> cuda_deferred.Settled:
        got = real(self)
        return cuda_deferred.Settled(got.listed[:0], [0], 0, 0, (0,)) if step == 2 else got

    monkeypatch.setattr(cuda_deferred.Deferred, "settle", failing_at_step_2)
    spec = deferring.cfg.spec_hash()
    s_d, s_i = deferring.init_state(), immediate.init_state()
    for step in (1, 2, 3):
        got, want = deferring.run_step(s_d, step, mode="record"), immediate.run_step(s_i, step, mode="record")
        assert got.leaf == want.leaf and s_d.step == step
        assert got.log is not None and want.log is not None
        assert got.log.encode(step, spec) == want.log.encode(step, spec)
    assert settles[2] == settles[1] - 1 > 0  # step 3 deferred every call but the one that failed


def test_deferredSteps_afterRepeatedFailures_stopDeferring(
    settles: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    deferring, _ = _engines("mlp-digits")
    real = cuda_deferred.Deferred.settle

    def failing(self: cuda_deferred.Deferred) -> cuda_deferred.Settled:
        got = real(self)
        return got._replace(listed=got.listed[:0], bounds=[0], failed=(len(settles),))

    monkeypatch.setattr(cuda_deferred.Deferred, "settle", failing)
    state = deferring.init_state()
    for step in range(1, step_mod.MAX_DEFER_FAILURES + 3):
        deferring.run_step(state, step, mode="record")
    assert len(settles) == step_mod.MAX_DEFER_FAILURES  # then the steps ran without deferral


def test_deferredStep_meetingARareLane_runsAgain_andEqualsTheImmediateOne(settles: list[int]) -> None:
    """A real failure: a weight in float32's subnormal range (on the grid) puts rare lanes into the
    step's products, which the Triton kernels leave to the torch path."""
    deferring, immediate = _engines("mlp-digits")
    states = deferring.init_state(), immediate.init_state()
    for state in states:
        with torch.no_grad():
            state.model.fc1.weight.view(-1)[:5] = rounding.rnd(torch.tensor(3e-39, dtype=torch.float64), 32)
    for step in (1, 2):
        got = deferring.run_step(states[0], step, mode="record")
        want = immediate.run_step(states[1], step, mode="record")
        assert got.leaf == want.leaf
    assert deferring._defer_failures >= 1 and deferring._immediate_calls


def test_deferredStep_meetingAnInf_runsAgain_andEqualsTheImmediateOne(
    settles: list[int], tmp_path: Path
) -> None:
    """CTC's log-space alphas hold -inf, which the Triton kernels leave to the torch path (it passes
    there, as its own rounding): the deferred step runs again, and trainer and auditor give the
    immediate steps' leaves and log bytes."""
    make_plugin(tmp_path, CTC_PY)
    deferring, immediate = _engines(load_config(tmp_path / "task.toml"))
    spec = deferring.cfg.spec_hash()
    s_rec, s_imm, s_aud = deferring.init_state(), immediate.init_state(), deferring.init_state()
    for step in (1, 2):
        rec = deferring.run_step(s_rec, step, mode="record")
        imm = immediate.run_step(s_imm, step, mode="record")
        assert rec.leaf == imm.leaf and rec.log is not None and imm.log is not None
        assert rec.log.encode(step, spec) == imm.log.encode(step, spec)
        aud = deferring.run_step(s_aud, step, mode="replay", log=imm.log)
        assert aud.leaf == imm.leaf
    assert deferring._defer_failures >= 1 and deferring._immediate_calls and settles


def test_cpuEngine_neverDefers_evenUnderTheInterpreter() -> None:
    """Only CUDA steps defer: Triton's interpreter switch (set by this module for every later test of
    the process) must not send CPU runs through the Triton kernels."""
    engine = StepEngine(small_cfg("mlp-digits"), get_profile("cpu-1t"))
    assert not engine._defers("record", SparseStepLog(1))
    engine.defer_anywhere = True  # the tests' switch; a CPU device still needs the interpreter
    assert engine._defers("record", SparseStepLog(1)) == (not ON_GPU)


def test_onlyACudaEngineThatDefers_pinsTheChunksItReplays() -> None:
    assert not StepEngine(small_cfg("mlp-digits"), get_profile("cpu-1t")).pins_logs
    if ON_GPU:
        engine = StepEngine(small_cfg("mlp-digits"), get_profile("cuda"))
        assert engine.pins_logs
        engine.defer = False  # checked at every tensor: no one copy of the chunk's entries
        assert not engine.pins_logs


def _noisy_chunks(cfg: TaskConfig, steps: int) -> Iterator[tuple[int, bytes]]:
    """Steps ``1 .. steps`` of a trainer whose log needs corrections (the noisy profile), each with
    its chunk's bytes, as an auditor reads them."""
    noisy = StepEngine(cfg, get_profile("noisy"))
    state = noisy.init_state()
    for step in range(1, steps + 1):
        chunk = noisy.run_step(state, step, mode="record").log
        assert chunk is not None
        yield step, chunk.encode(step, cfg.spec_hash())


def test_deferredReplay_ofADecodedChunk_buildsNoRecord_andEqualsTheImmediateReplay(
    settles: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deferring auditor checks each record of a chunk against its op from the chunk's columns
    and sends the entries to the device from the one array it decoded into: no record object is
    built (some thousand a GPT-2-shape step, a millisecond or more of the step's thread). The
    leaves and corrections are the immediate replay's."""
    deferring, immediate = _engines("cnn-digits")
    spec = deferring.cfg.spec_hash()
    s_deferred, s_immediate = deferring.init_state(), immediate.init_state()
    built: list[int] = []
    real = SparseStepLog._records

    def records(self: SparseStepLog) -> object:
        built.append(id(self))
        return real(self)

    corrections = 0
    for step, data in _noisy_chunks(deferring.cfg, 2):  # a trainer whose log needs corrections
        decoded = SparseStepLog.decode(data, step=step, spec_hash=spec)
        with monkeypatch.context() as m:
            m.setattr(SparseStepLog, "_records", records)
            a = deferring.run_step(s_deferred, step, mode="replay", log=decoded)
        assert id(decoded) not in built
        b = immediate.run_step(
            s_immediate, step, mode="replay", log=SparseStepLog.decode(data, step=step, spec_hash=spec)
        )
        assert (a.leaf, a.corrections) == (b.leaf, b.corrections)
        corrections += a.corrections
    assert corrections > 0 and len(settles) == 2


def test_deferredReplay_ofAPinnedChunk_copiesItsEntriesFromThePinnedCopy_withoutWaiting(
    settles: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the read-ahead hands a GPU auditor (:meth:`SparseStepLog.pin`): the same leaves and
    corrections as the chunk unpinned, its entries copied to the device from the page-locked array
    without blocking. Without a GPU a copy stands in for page-locked memory."""
    if not ON_GPU:
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone())
    deferring, _ = _engines("mlp-digits")
    spec = deferring.cfg.spec_hash()
    s_plain, s_pinned = deferring.init_state(), deferring.init_state()
    copies: list[tuple[int, bool]] = []  # (address, non_blocking) of each int64 tensor sent with .to
    real_to = torch.Tensor.to

    def to(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        if self.dtype == torch.int64 and self.dim() == 1:
            copies.append((self.data_ptr(), bool(k.get("non_blocking", False))))
        return real_to(self, *a, **k)  # type: ignore[arg-type]

    corrections = 0
    for step, data in _noisy_chunks(deferring.cfg, 2):  # a trainer whose log needs corrections
        plain = SparseStepLog.decode(data, step=step, spec_hash=spec)
        pinned = SparseStepLog.decode(data, step=step, spec_hash=spec)
        pinned.pin()
        page_locked = pinned.pinned_positions()
        assert page_locked is not None
        a = deferring.run_step(s_plain, step, mode="replay", log=plain)
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "to", to)
            b = deferring.run_step(s_pinned, step, mode="replay", log=pinned)
        assert (a.leaf, a.corrections) == (b.leaf, b.corrections)
        assert (page_locked.data_ptr(), True) in copies
        corrections += b.corrections
    assert corrections > 0 and len(settles) == 4


@pytest.mark.skipif(not ON_GPU, reason="page-locked memory needs a GPU")
def test_hostArray_ofAGpuTensor_isPageLocked_withItsValues() -> None:
    t = torch.arange(1000, dtype=torch.int64, device="cuda") * 7
    host = cuda_deferred.host_array(t)
    assert host.tolist() == t.cpu().tolist()
    assert torch.from_numpy(host).is_pinned()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 300), st.floats(0.0, 1.0), st.integers(0, 2**16)), min_size=1, max_size=8
    )
)
def test_listedLanes_areEachFlagsOwnNonzero_andTheirCounts(shapes: list[tuple[int, float, int]]) -> None:
    """The read-back's device work: every call's listed lanes relative to its own flags, one call
    after another, and each call's count, as ``nonzero`` of each call's flags gives them (a call
    counted as listing lanes whose flags hold none included), under torch's deterministic mode."""
    flags = []
    for n, share, seed in shapes:
        g = torch.Generator().manual_seed(seed)
        flags.append((torch.rand(n, generator=g) < share).to(torch.int8).to(DEV))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # a user's training may ask for it: no op here is refused
    try:
        lanes, sizes = cuda_deferred.listed_lanes(flags)
    finally:
        torch.use_deterministic_algorithms(was)
    want = [f.nonzero().squeeze(1).cpu() for f in flags]
    assert sizes.cpu().tolist() == [w.numel() for w in want]
    assert lanes.cpu().tolist() == torch.cat(want).tolist()
    # a group's calls share one piece of flags: cut in twos, the same lanes and counts
    pieces = [torch.cat(flags[i : i + 2]) for i in range(0, len(flags), 2)]
    joined, counts = cuda_deferred.listed_lanes(pieces, [f.numel() for f in flags])
    assert torch.equal(joined.cpu(), lanes.cpu()) and torch.equal(counts.cpu(), sizes.cpu())
    host = cuda_deferred.host_array(lanes)
    assert host.tolist() == lanes.cpu().tolist()


#: ATen ops after which a GPU's host waits for its device when their input lives there: a value
#: read back (``item``, ``bool``, ``int``), or an output whose size the data decides.
SYNCING_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "is_nonzero",
        "equal",
        "allclose",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "_assert_async",
    }
)


class _SyncingOps(SeenOps):
    """:class:`SeenOps`, and apart the ops of :data:`SYNCING_OPS` that run before the step's
    read-back (``settled``, set by the patched ``Deferred.settle``) with their tensors' shapes and
    dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.settled = False
        self.syncing: list[tuple[str, list[tuple[tuple[int, ...], torch.dtype]]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNCING_OPS and not self.settled:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.syncing.append((name, [(tuple(t.shape), t.dtype) for t in tensors]))
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("preset", ["gpt-shakespeare", "cnn-digits"])
def test_deferredStep_makesNoHostSynchronisation_beforeItsReadBack(
    preset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46: a CUDA step keeps its checks on the device until it ends. No op of a deferring
    step, trainer or auditor, may make the host wait for the device before the one read-back
    (``Deferred.settle``), or the host cannot run ahead of the device. The one exception is the
    optimizer's step counter, a 0-dim float32 tensor torch's Adam keeps on the host (its
    ``item()`` waits for nothing). Run down the CUDA path on CPU tensors, through the Python
    dispatch mode: the recorder sits under it, so it sees the ops the rounding code issues itself
    (the C++ front calls the same code, but from below any Python mode). A draw's own ops are out
    of sight here (the draws suspend the modes); its ids' range check, once a step, is held by
    ``test_cuda_rng.py``."""
    deferring, immediate = _engines(preset)
    recorder = _SyncingOps()
    real = cuda_deferred.Deferred.settle

    def settle(self: cuda_deferred.Deferred) -> cuda_deferred.Settled:
        recorder.settled = True
        return real(self)

    monkeypatch.setattr(cuda_deferred.Deferred, "settle", settle)
    s_rec, s_imm, s_aud = deferring.init_state(), immediate.init_state(), deferring.init_state()
    for step in (1, 2):  # step 1 makes the optimizer's state; step 2 is a step like any later
        log = immediate.run_step(s_imm, step, mode="record").log
        for mode, state in (("record", s_rec), ("replay", s_aud)):
            recorder.settled, recorder.ops, recorder.syncing = False, [], []
            with front.disabled(), recorder:
                deferring.run_step(state, step, mode=mode, log=log if mode == "replay" else None)
            assert recorder.settled and len(recorder.ops) > 100, (mode, step)
            host_counters = ("_local_scalar_dense", [((), torch.float32)])
            assert [s for s in recorder.syncing if s != host_counters] == [], (mode, step)
