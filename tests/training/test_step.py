"""The step engine: bit-exact replay across profiles with the log, divergence without it, and the rules
of a step (order, zero_grad, step numbers, checkpoint resume)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from game.errors import ConfigError, NonFiniteError, RoundingLogError, TrainingError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import Profile, get_profile
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine
from game.training.native import library
from game.training.numerics.bandcheck import LogTamperingError
from game.training.numerics.bandfile import Band, BandTable
from game.training.state.canonical import encode_state
from game.training.state.leaves import state_hash
from game.training.state.tensors import check_on_grid
from game.training.task.config import TaskConfig

SMALL = {
    "mlp-digits": {"model": {"hidden": 24}, "batch_size": 8},
    "cnn-digits": {"model": {"channels": 4, "hidden": 8}, "batch_size": 8},
    "gpt-shakespeare": {
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 8},
        "batch_size": 4,
    },
}


def small_cfg(name: str, **overrides: object) -> TaskConfig:
    return TaskConfig.for_preset(name, **{**SMALL[name], **overrides})


def profile(name: str) -> Profile:
    """The named profile. The default noise (2**-40) suffices: many results of inexact ops are exact
    float64 values sitting on a float32 rounding midpoint (short sums of grid values), and any noise
    sends those to either side, so each small step already needs dozens of corrections."""
    return get_profile(name)


PAIRS = [
    ("cpu-1t", "cpu-2t"),
    ("cpu-2t", "splitk-16"),
    ("splitk-16", "splitk-64"),
    ("splitk-64", "noisy"),
    ("noisy", "cpu-1t"),
]


@pytest.mark.parametrize(("trainer", "auditor"), PAIRS)
@pytest.mark.parametrize("preset", list(SMALL))
def test_replayWithLog_isBitExactAcrossProfiles(preset: str, trainer: str, auditor: str) -> None:
    cfg = small_cfg(preset)
    et = StepEngine(cfg, profile(trainer), check_grid=True)
    ea = StepEngine(cfg, profile(auditor), check_grid=True)
    st, sa = et.init_state(), ea.init_state()
    assert state_hash(st) == state_hash(sa)
    corrections = 0
    for step in range(1, 4):
        rt = et.run_step(st, step, mode="record")
        ra = ea.run_step(sa, step, mode="replay", log=rt.log)
        assert rt.state_hash is not None
        assert ra.state_hash == rt.state_hash, f"step {step}"
        assert ra.state_hash == state_hash(sa)
        corrections += ra.corrections
    if "noisy" in (trainer, auditor):
        assert corrections > 0  # the log did real work


def test_resnet50_recordThenReplay_sameStateHash() -> None:
    # The ResNet-50 layout (bottlenecks, projections, 53 BatchNorms, average pool) at a narrow width.
    cfg = TaskConfig.for_preset("cnn-digits", model={"arch": "resnet50", "channels": 8}, batch_size=4)
    et = StepEngine(cfg, profile("cpu-1t"), check_grid=True)
    ea = StepEngine(cfg, profile("noisy"), check_grid=True)
    st, sa = et.init_state(), ea.init_state()
    assert state_hash(st) == state_hash(sa)
    rt = et.run_step(st, 1, mode="record")
    ra = ea.run_step(sa, 1, mode="replay", log=rt.log)
    assert rt.state_hash is not None and ra.state_hash == rt.state_hash == state_hash(sa)
    assert ra.corrections > 0


@pytest.mark.parametrize("preset", list(SMALL))
def test_roundWithoutLog_noisyPairDiverges(preset: str) -> None:
    cfg = small_cfg(preset)
    et, ea = StepEngine(cfg, profile("cpu-1t")), StepEngine(cfg, profile("noisy"))
    st, sa = et.init_state(), ea.init_state()
    diverged = False
    for step in range(1, 4):
        rt = et.run_step(st, step, mode="round")
        ra = ea.run_step(sa, step, mode="round")
        diverged |= rt.state_hash != ra.state_hash
    assert diverged


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_largerNoise_insideTheBands_isStillCorrected(log_format: str) -> None:
    # 2**-30 relative noise, with bands calibrated for it (16x margin: 2**-26 relative); the packed
    # format's tau = 0.25 ulp (>= 2**-26 relative) covers it too.
    bands = BandTable(default=Band(-26, -40))
    cfg = small_cfg("mlp-digits").replace(log_format=log_format, bands=bands)
    et = StepEngine(cfg, replace(get_profile("noisy"), noise=2.0**-30))
    ea = StepEngine(cfg, replace(get_profile("noisy"), noise=2.0**-30))
    st, sa = et.init_state(), ea.init_state()
    for step in (1, 2):
        rt = et.run_step(st, step, mode="record")
        ra = ea.run_step(sa, step, mode="replay", log=rt.log)
        assert ra.state_hash == rt.state_hash and ra.corrections > 0


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_noiseBeyondTheCalibratedBands_isRefusedOrDiverges(log_format: str) -> None:
    # The shipped bands assume the noisy profile's 2**-40; 2**-24 is hardware the calibration never
    # saw. Replay must not silently succeed with a wrong state: it refuses the log (a direction
    # outside the band) or lands on another state.
    cfg = small_cfg("mlp-digits").replace(log_format=log_format)
    et = StepEngine(cfg, get_profile("cpu-1t"))
    ea = StepEngine(cfg, replace(get_profile("noisy"), noise=2.0**-24))
    st, sa = et.init_state(), ea.init_state()
    rt = et.run_step(st, 1, mode="record")
    try:
        ra = ea.run_step(sa, 1, mode="replay", log=rt.log)
    except LogTamperingError:
        return
    assert ra.state_hash != rt.state_hash


@pytest.mark.parametrize("other", ["splitk-16", "noisy"])
def test_plainFp32_diverges_acrossProfiles(other: str) -> None:
    cfg = small_cfg("mlp-digits")
    et, ea = StepEngine(cfg, get_profile("cpu-1t")), StepEngine(cfg, get_profile(other))
    st, sa = et.init_state(precision="fp32"), ea.init_state(precision="fp32")
    assert state_hash(st) == state_hash(sa)
    rt = et.run_step(st, 1, mode="plain", precision="fp32")
    ra = ea.run_step(sa, 1, mode="plain", precision="fp32")
    assert rt.state_hash is not None and ra.state_hash is not None
    assert rt.state_hash != ra.state_hash
    assert next(st.model.parameters()).dtype == torch.float32


def test_plainFp64_hasNoStateHash_andIsOffGrid() -> None:
    cfg = small_cfg("mlp-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    result = engine.run_step(state, 1, mode="plain")
    assert result.state_hash is None and result.log is None
    with pytest.raises(TrainingError, match="no state hash"):
        _ = result.leaf
    assert result.ops == frozenset()  # no interception at all: the honest baseline
    with pytest.raises(TrainingError):
        check_on_grid(state, cfg.bits)


def test_step_clearsGradients_advancesStep_reportsOps() -> None:
    cfg = small_cfg("cnn-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    result = engine.run_step(state, 1, mode="record")
    assert state.step == 1
    assert all(p.grad is None for p in state.model.parameters())
    assert {
        "aten.convolution.default",
        "aten.convolution_backward.default",
        "aten.native_batch_norm.default",
    } <= result.ops
    assert result.log is not None and result.corrections == 0
    assert result.leaf == result.state_hash == state_hash(state)
    assert result.loss > 0
    check_on_grid(state, cfg.bits)


def test_step_wrongNumber_orMissingLog_isRefused() -> None:
    cfg = small_cfg("mlp-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    with pytest.raises(TrainingError, match="step 2"):
        engine.run_step(state, 2, mode="record")
    with pytest.raises(ConfigError, match="replay"):
        engine.run_step(state, 1, mode="replay")
    with pytest.raises(ConfigError, match="fp32"):
        engine.run_step(state, 1, mode="record", precision="fp32")
    with pytest.raises(TrainingError, match="float64"):
        engine.run_step(state, 1, mode="plain", precision="fp32")


def test_replay_withAnotherStepsLog_isRoundingLogError() -> None:
    cfg = small_cfg("cnn-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    other = engine.run_step(engine.init_state(), 1, mode="record").log
    gpt = small_cfg("gpt-shakespeare")
    ge = StepEngine(gpt, get_profile("cpu-1t"))
    foreign = ge.run_step(ge.init_state(), 1, mode="record").log
    assert other is not None and foreign is not None
    engine.run_step(state, 1, mode="replay", log=other)  # its own log is fine
    with pytest.raises(RoundingLogError):
        engine.run_step(state, 2, mode="replay", log=foreign)


def test_resumeFromCheckpoint_reproducesLaterLeaves() -> None:
    cfg = small_cfg("gpt-shakespeare")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    logs, leaves, ckpt = {}, {}, b""
    for step in range(1, 4):
        r = engine.run_step(state, step, mode="record")
        logs[step], leaves[step] = r.log, r.state_hash
        if step == 1:
            ckpt = encode_state(state)
    auditor = StepEngine(cfg, profile("splitk-16"))
    resumed = decode_state(ckpt, cfg)
    for step in (2, 3):
        assert auditor.run_step(resumed, step, mode="replay", log=logs[step]).state_hash == leaves[step]


def test_batchOverride_changesTheLeaf() -> None:
    cfg = small_cfg("mlp-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    honest, poisoned = engine.init_state(), engine.init_state()
    batch = engine.batch(1)
    h1 = engine.run_step(honest, 1, mode="round").state_hash
    h2 = engine.run_step(poisoned, 1, mode="round", batch_override=engine.runtime.poison(batch, 1)).state_hash
    assert h1 != h2


def test_nonFiniteDuringStep_namesStepAndOp() -> None:
    cfg = small_cfg("mlp-digits")
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    engine.run_step(state, 1, mode="record")
    with torch.no_grad():
        state.model.fc1.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"step 2, op #\d+ aten\."):
        engine.run_step(state, 2, mode="record")


class _ThroughBanding(StepEngine):
    """An engine whose interceptor never takes the direct kernel path: every tensor goes through
    :mod:`~game.training.numerics.bandcheck`, the path the direct one must equal."""

    class mode_class(RoundingMode):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._direct = False


@pytest.mark.skipif(not library.available(), reason="no C compiler: there is no direct path")
@pytest.mark.parametrize("preset", list(SMALL))
def test_directKernelPath_equalsThePathThroughBanding(preset: str) -> None:
    """Same leaves, same chunk bytes and, replaying a noisy trainer's log, the same corrections."""
    cfg = small_cfg(preset)
    spec = cfg.spec_hash()
    direct, through = StepEngine(cfg, profile("cpu-1t")), _ThroughBanding(cfg, profile("cpu-1t"))
    noisy = StepEngine(cfg, profile("noisy"))
    sd, st, sn, sa, sb = (e.init_state() for e in (direct, through, noisy, direct, through))
    for step in range(1, 4):
        rd, rt = direct.run_step(sd, step), through.run_step(st, step)
        assert rd.log is not None and rt.log is not None
        assert rd.leaf == rt.leaf and rd.log.encode(step, spec) == rt.log.encode(step, spec)
        rn = noisy.run_step(sn, step)
        ra = direct.run_step(sa, step, mode="replay", log=rn.log)
        rb = through.run_step(sb, step, mode="replay", log=rn.log)
        assert ra.leaf == rb.leaf == rn.leaf
        assert ra.corrections == rb.corrections
    assert direct.last_mode is not None and direct.last_mode._direct
