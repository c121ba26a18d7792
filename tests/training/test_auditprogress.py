"""An audit killed part-way and run again goes on from its last save, to the result of a whole run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from game.training.engine.audit import AuditResult, audit
from game.training.engine.auditprogress import RECORD_NAME, AuditProgress, ProgressSaver
from game.training.engine.train import Deviation, train
from game.training.state.leafhash import leaf_of
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig

STEPS = 7


TAMPERED_AT = 3


class TamperedWeights(Deviation):
    """A trainer that moves one weight after step 3: the auditor diverges there and runs alone."""

    def after_step(self, step: int, state: TrainState) -> None:
        if step == TAMPERED_AT:
            with torch.no_grad():
                next(state.model.parameters()).view(-1)[0] *= 2  # exact: still on the float32 grid


def _train(out: Path, deviation: Deviation | None = None) -> Path:
    cfg = TaskConfig.for_preset(
        "gpt-shakespeare", steps=STEPS, batch_size=4, checkpoint_interval=3, dropout=0.1,
        model={"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
    )  # fmt: skip
    train(cfg, "cpu-1t", out, deviation=deviation)
    return out


@pytest.fixture(scope="module")
def transcript(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("audit") / "t")


@pytest.fixture(scope="module")
def tampered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("audit") / "t", TamperedWeights())


class Stop(Exception):
    pass


def _stop_after(step: int):  # type: ignore[no-untyped-def]
    def progress(done: int, total: int) -> None:
        if done == step:
            raise Stop(done)

    return progress


def _same(a: AuditResult, b: AuditResult) -> None:
    assert a.leaves == b.leaves and a.auditor_state_root == b.auditor_state_root
    assert (a.match, a.first_divergent_step, a.corrections) == (
        b.match,
        b.first_divergent_step,
        b.corrections,
    )
    assert (a.rejected_log_steps, a.log_errors) == (b.rejected_log_steps, b.log_errors)


@pytest.mark.parametrize("honest", [True, False])  # a tampered one diverges: the steps after run alone
@pytest.mark.parametrize("killed_at", [1, TAMPERED_AT, STEPS - 1])
def test_audit_killedAndRunAgain_goesOnFromItsLastSave(
    transcript: Path, tampered: Path, tmp_path: Path, honest: bool, killed_at: int
) -> None:
    trained = transcript if honest else tampered
    whole = audit(trained, "splitk-16")
    assert whole.resumed_from is None
    assert whole.first_divergent_step == (None if honest else TAMPERED_AT)
    keep = tmp_path / "progress"
    with pytest.raises(Stop):
        audit(trained, "splitk-16", keep_progress=keep, save_every_s=0.0, progress=_stop_after(killed_at))
    assert (keep / RECORD_NAME).is_file()
    again = audit(trained, "splitk-16", keep_progress=keep, save_every_s=0.0)
    assert again.resumed_from == killed_at
    _same(again, whole)
    assert list(keep.iterdir()) == []  # finished: nothing saved is left behind


def test_progressOfAnotherAudit_orDamaged_isSetAside(
    transcript: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    whole = audit(transcript, "splitk-16")
    keep = tmp_path / "progress"
    with pytest.raises(Stop):
        audit(transcript, "noisy", keep_progress=keep, save_every_s=0.0, progress=_stop_after(3))
    with caplog.at_level(logging.WARNING):
        other = audit(transcript, "splitk-16", keep_progress=keep, save_every_s=0.0)
    assert other.resumed_from is None and "of another audit" in caplog.text
    _same(other, whole)

    with pytest.raises(Stop):
        audit(transcript, "splitk-16", keep_progress=keep, save_every_s=0.0, progress=_stop_after(3))
    (state,) = [p for p in keep.iterdir() if p.name != RECORD_NAME]
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1
    state.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        damaged = audit(transcript, "splitk-16", keep_progress=keep, save_every_s=0.0)
    assert damaged.resumed_from is None and "does not hash to its leaf" in caplog.text
    _same(damaged, whole)


def test_saver_savesOnlyWhenItsIntervalHasPassed_andKeepsOneState(tmp_path: Path) -> None:
    saver = ProgressSaver(tmp_path, every_s=3600.0)
    assert not saver.due()  # a short audit never saves
    state = b"state bytes"
    progress = AuditProgress(b"\x01" * 32, "noisy", True, (b"\x00" * 32, leaf_of(state)),
                             5, 1, (1,), ("log tampering at step 1",))  # fmt: skip
    saver.save(progress, state)
    saver.save(progress, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "audit-state-000000001.bin"]
    assert saver.load(b"\x01" * 32, "noisy", True) == (progress, state, {})
    assert saver.load(b"\x01" * 32, "noisy", False) is None  # the same transcript without the log
    saver.clear()
    assert list(tmp_path.iterdir()) == []


def test_audit_ofAStateTooLargeForOneBuffer_savesAndGoesOnAlike(
    tampered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from game.training.state import canonical

    whole = audit(tampered, "splitk-16")
    monkeypatch.setattr(canonical, "_ONE_BUFFER_MAX", 0)  # hashed piece by piece: no bytes kept
    keep = tmp_path / "progress"
    with pytest.raises(Stop):
        audit(tampered, "splitk-16", keep_progress=keep, save_every_s=0.0, progress=_stop_after(4))
    again = audit(tampered, "splitk-16", keep_progress=keep, save_every_s=0.0)
    assert again.resumed_from == 4
    _same(again, whole)


@pytest.mark.parametrize("poisoned", [False, True])  # a poisoned update diverges: the later run alone
def test_asyncAudit_killedAndRunAgain_goesOnFromItsLastSave_withTheVersionsItNeeds(
    tmp_path: Path, poisoned: bool
) -> None:
    """An asynchronous task's replay keeps older states' weights for its later updates: a save
    keeps them too (the auditor's own, past a divergence), and the audit run again from it ends
    as a whole run does."""
    from game.training.engine.runtime import Batch
    from game.training.engine.scheduled import train_scheduled
    from game.training.engine.step import engine_for
    from tests.training.schedules import simulated_schedule

    cfg = TaskConfig.for_preset(
        "mlp-digits", model={"hidden": 16}, batch_size=8, steps=10, accumulate=2, max_staleness=2,
        checkpoint_interval=4,
    )  # fmt: skip
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=7)
    assert any(v < e.update - 1 for e in entries for v in e.versions)  # stale versions are kept
    poison: dict[int, Batch] = {}
    if poisoned:
        engine = engine_for(cfg, "cpu-1t")
        poison = {3: engine.runtime.poison(engine.batch(3), 3)}
    out = tmp_path / "t"
    train_scheduled(cfg, "cpu-1t", out, entries, poison=poison)
    whole = audit(out, "splitk-16")
    assert whole.match != poisoned
    keep = tmp_path / "progress"
    for killed_at in (2, 6, 9):
        with pytest.raises(Stop):
            audit(out, "splitk-16", keep_progress=keep, save_every_s=0.0, progress=_stop_after(killed_at))
        assert any(p.suffix == ".versions" for p in keep.iterdir())
        again = audit(out, "splitk-16", keep_progress=keep, save_every_s=3600.0)
        assert again.resumed_from == killed_at
        _same(again, whole)
        assert again.schedule_errors == whole.schedule_errors
        assert not (keep / RECORD_NAME).exists()  # an audit that ended leaves no progress behind
