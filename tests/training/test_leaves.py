"""Leaves hashed on a thread while the next step runs (game.training.state.leaves), and the auditor loop
that uses them: it learns of a divergence one step late, and must end exactly where an auditor that
hashes every state before the next step ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from game.errors import RoundingLogError
from game.strategies.trainers import Poison, SkipStep, SteeredLog, TamperedLog, WrongLR
from game.training.dispatch.profiles import get_profile
from game.training.engine.audit import audit
from game.training.engine.step import StepEngine
from game.training.engine.train import train
from game.training.state import canonical
from game.training.state.canonical import encode_state
from game.training.state.leaves import LeafHasher, state_hash
from game.training.state.tensors import TrainState, snapshot
from game.training.task.config import TaskConfig

STEPS = 6


def tiny(**kw: Any) -> TaskConfig:
    return TaskConfig.for_preset(
        "mlp-digits", steps=STEPS, batch_size=8, checkpoint_interval=4, model={"hidden": 16}, **kw
    )


def test_leaf_isTheStateHash_evenWhenTheStateChangesRightAfter() -> None:
    engine = StepEngine(tiny(), get_profile("cpu-1t"))
    state = engine.init_state()
    engine.run_step(state, 1, hash_state=False)
    expected, before = state_hash(state), encode_state(state)
    with LeafHasher() as hasher:
        pending = hasher.submit(state)
        engine.run_step(state, 2, hash_state=False)  # the bytes were taken: the next step may run
        assert pending.step == 1 and pending.leaf() == expected
        assert state_hash(state) != expected
        assert pending.keeps_bytes and pending.state_bytes() == before


def test_aStateTooLargeForOneBuffer_isHashedAtOnce_andKeepsNoBytes(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = StepEngine(tiny(), get_profile("cpu-1t"))
    state = engine.init_state()
    engine.run_step(state, 1, hash_state=False)
    expected = state_hash(state)
    monkeypatch.setattr(canonical, "_ONE_BUFFER_MAX", 16)
    with LeafHasher() as hasher:
        pending = hasher.submit(state)
    assert pending.ready and not pending.keeps_bytes and pending.leaf() == expected
    with pytest.raises(ValueError, match="piece by piece"):
        pending.state_bytes()


_RUNS = [(None, 0)] + [
    (d, s) for d in (Poison, SkipStep, WrongLR, TamperedLog, SteeredLog) for s in (1, 3, STEPS)
]


@pytest.mark.parametrize(("deviation", "step"), _RUNS)
def test_audit_hashingBesideTheNextStep_endsAsHashingBeforeIt(
    deviation: Any, step: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The auditor replays step s + 1 with the trainer's log before it knows step s diverged; it
    must then run s + 1 again without the log, from the state after s, and not blame the log for
    what s + 1 raised. A state too large for one buffer takes the old order (hash, then the next
    step): both must give the same leaves, corrections, rejected steps and first divergence."""
    cfg = tiny()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=deviation(cfg, step) if deviation else None)
    beside = audit(tmp_path / "t", "splitk-16")
    monkeypatch.setattr(canonical, "_ONE_BUFFER_MAX", 16)  # every state hashed at once, in order
    before = audit(tmp_path / "t", "splitk-16")
    assert beside.leaves == before.leaves and len(beside.leaves) == STEPS + 1
    assert beside.first_divergent_step == before.first_divergent_step
    if deviation in (None, Poison, SkipStep, WrongLR):  # these change the state itself
        assert beside.first_divergent_step == (step if deviation else None)
    assert beside.rejected_log_steps == before.rejected_log_steps
    assert beside.corrections == before.corrections
    assert beside.auditor_state_root == before.auditor_state_root


def test_audit_afterADivergence_runsTheNextStepWithoutTheLog(tmp_path: Path) -> None:
    """The leaves after a poisoned step are the auditor's own steps without the log, run from its
    own state: what it would have computed had it known at once."""
    cfg = tiny()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=Poison(cfg, 3))
    result = audit(tmp_path / "t", "cpu-2t")
    assert result.first_divergent_step == 3
    from game.training.transcript.reader import Transcript

    t = Transcript(tmp_path / "t")
    engine = StepEngine(cfg, get_profile("cpu-2t"))
    state = engine.init_state()
    leaves = [state_hash(state)]
    rejected = []
    for s in range(1, STEPS + 1):
        if s <= 3:  # the poisoned step's chunk may not fit the honest computation: then it runs without
            restore = snapshot(state)
            try:
                leaves.append(engine.run_step(state, s, mode="replay", log=t.read_log(s)).leaf)
            except RoundingLogError:
                restore()
                rejected.append(s)
                leaves.append(engine.run_step(state, s, mode="round").leaf)
        else:
            leaves.append(engine.run_step(state, s, mode="round").leaf)
    assert list(result.leaves) == leaves
    assert list(result.rejected_log_steps) == rejected
    assert result.leaves[:3] == tuple(t.leaves()[:3]) and result.leaves[3] != t.leaf(3)


class _HashedOnDevice:
    """Stands in for :class:`~game.training.state.device_leaf.DeviceLeaf`: takes the state's bytes when
    started (as the device does, in stream order before the next step) and counts what is asked."""

    started = 0

    def __init__(self, state: TrainState) -> None:
        type(self).started += 1
        self.data = encode_state(state)

    def leaf(self) -> bytes:
        from game.training.state.leafhash import leaf_of

        return leaf_of(self.data)

    def canonical_bytes(self) -> bytes:
        return self.data


@pytest.mark.parametrize("deviation", [None, Poison])
def test_statesHashedOnTheirDevice_giveTheSameTranscriptAndAudit(
    deviation: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where states are hashed on their device (a GPU), the trainer hands the writer the pending
    leaf, the auditor waits for it one step late and rebuilds from its bytes after a divergence:
    every leaf, root and verdict is what the host path gives."""
    cfg = tiny()
    dev = Poison(cfg, 3) if deviation else None
    host = train(cfg, "cpu-1t", tmp_path / "host", deviation=dev)
    host_audit = audit(tmp_path / "host", "cpu-2t")
    from game.training.engine import train as train_mod
    from game.training.state import leaves as leaves_mod

    monkeypatch.setattr(leaves_mod, "device_leaf", _HashedOnDevice)
    monkeypatch.setattr(train_mod, "device_leaf", _HashedOnDevice)
    _HashedOnDevice.started = 0
    on_device = train(cfg, "cpu-1t", tmp_path / "device", deviation=dev)
    assert _HashedOnDevice.started == STEPS + 1  # every leaf of the trainer came from the device
    assert (on_device.state_root, on_device.log_root) == (host.state_root, host.log_root)
    device_audit = audit(tmp_path / "device", "cpu-2t")
    assert device_audit.leaves == host_audit.leaves
    assert device_audit.first_divergent_step == host_audit.first_divergent_step == (3 if deviation else None)
    if deviation is None:  # and every leaf of the auditor
        assert _HashedOnDevice.started == 2 * (STEPS + 1)
