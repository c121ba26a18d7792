"""The auditor's replay from the log chunks alone (what a trainer posted on-chain), against the
replay of the whole transcript: the same leaves for honest work, its own leaves past a deviation,
for a synchronous task and an asynchronous one (whose chunks carry the schedule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import ConfigError
from game.merkle import merkle_root
from game.strategies.trainers import Poison
from game.training.engine.audit import audit
from game.training.engine.chunkaudit import audit_chunks, states_after_chunks
from game.training.engine.schedaudit import rejected_schedule_leaf
from game.training.engine.scheduled import train_scheduled
from game.training.engine.train import train
from game.training.log.schedule import ScheduleError
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript
from tests.agents.conftest import PoisonBatch
from tests.training.schedules import repeating_schedule, simulated_schedule, write_unchecked


def _cfg() -> TaskConfig:
    return TaskConfig.for_preset(
        "mlp-digits", model={"hidden": 16}, batch_size=8, steps=6, checkpoint_interval=3
    )


def _chunks(t: Transcript) -> list[bytes]:
    return [t.chunk_bytes(s) for s in range(t.steps + 1)]


def test_honestWork_theChunksAlone_giveTheTrainersLeaves_onAnotherProfile(tmp_path: Path) -> None:
    cfg = _cfg()
    train(cfg, "cpu-1t", tmp_path / "t")
    t = Transcript(tmp_path / "t")
    root = merkle_root(t.leaves())
    result = audit_chunks(cfg, "splitk-16", _chunks(t), root)
    assert result.match and list(result.leaves) == t.leaves()
    assert result.rejected_log_steps == ()
    states = states_after_chunks(cfg, "splitk-16", _chunks(t), {0, 4})
    assert {s: leaf_of(d) for s, d in states.items()} == {0: t.leaf(0), 4: t.leaf(4)}


def test_aPoisonedStep_theChunksAlone_divergeFromIt_asTheWholeTranscriptsAuditDoes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _cfg()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=Poison(cfg, 3))
    t = Transcript(tmp_path / "t")
    root = merkle_root(t.leaves())
    with caplog.at_level("INFO", logger="game.training.engine.chunkaudit"):
        result = audit_chunks(cfg, "cpu-1t", _chunks(t), root)
    # every chunk past the divergence describes other values: one warning, not one a step
    assert len(result.rejected_log_steps) > 1
    said = [r.levelname for r in caplog.records if "is rejected" in r.getMessage()]
    assert said == ["WARNING"] + ["INFO"] * (len(result.rejected_log_steps) - 1)
    whole = audit(tmp_path / "t", "cpu-1t")
    assert not result.match and whole.first_divergent_step == 3
    assert list(result.leaves[:3]) == t.leaves()[:3] and result.leaves[3] != t.leaf(3)
    assert list(result.leaves[:4]) == list(whole.leaves[:4])  # the pinned step's post-state is the honest one


def test_aChunkCountNotTheTasks_isRefused() -> None:
    with pytest.raises(ConfigError, match="6 log chunks for a task of 6 steps"):
        audit_chunks(_cfg(), "cpu-1t", [b""] * 6, bytes(32))


def _async_cfg() -> TaskConfig:
    return TaskConfig.for_preset(
        "mlp-digits", model={"hidden": 16}, batch_size=8, steps=8, checkpoint_interval=4,
        accumulate=2, max_staleness=2,
    )  # fmt: skip


def test_anAsynchronousTask_honestWork_theChunksAlone_giveTheTrainersLeaves_andItsOlderStates(
    tmp_path: Path,
) -> None:
    """Every update computes on the states its chunk's entry names, kept until their last use:
    the chunks alone replay to the trainer's leaves on another profile, as the transcript does."""
    cfg = _async_cfg()
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=3)
    assert any(v < e.update - 1 for e in entries for v in e.versions)  # some update is stale
    train_scheduled(cfg, "cpu-1t", tmp_path / "t", entries)
    t = Transcript(tmp_path / "t")
    result = audit_chunks(cfg, "splitk-16", _chunks(t), merkle_root(t.leaves()))
    assert result.match and list(result.leaves) == t.leaves()
    assert result.rejected_log_steps == () and result.schedule_errors == ()
    states = states_after_chunks(cfg, "splitk-16", _chunks(t), {2, 5, 6})
    assert {s: leaf_of(d) for s, d in states.items()} == {s: t.leaf(s) for s in (2, 5, 6)}


def test_anAsynchronousTask_aPoisonedMicroBatch_theChunksAlone_divergeWhereTheTranscriptsAuditDoes(
    tmp_path: Path,
) -> None:
    cfg = _async_cfg()
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=3)
    poisoned = PoisonBatch(cfg, 4).batch(4)
    assert poisoned is not None
    train_scheduled(cfg, "cpu-1t", tmp_path / "t", entries, poison={4: poisoned})
    t = Transcript(tmp_path / "t")
    whole = audit(tmp_path / "t", "splitk-16")
    first = whole.first_divergent_step
    assert first is not None and first > 1
    result = audit_chunks(cfg, "splitk-16", _chunks(t), merkle_root(t.leaves()))
    assert not result.match
    assert list(result.leaves[: first + 1]) == list(whole.leaves[: first + 1])
    assert result.leaves[first] != t.leaf(first) and result.leaves[first - 1] == t.leaf(first - 1)


def test_anAsynchronousTask_aMicroBatchAppliedTwice_isFound_andNoStateFollowsIt(tmp_path: Path) -> None:
    """The chunks' schedule is held to the task's rules as the transcript's is: from the update
    that applies a micro-batch again, the leaves are the rejected-schedule mark."""
    cfg = _async_cfg()
    honest, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=3)
    entries, micro, _ = repeating_schedule(honest, 6)
    write_unchecked(cfg, "cpu-1t", tmp_path / "t", entries)
    t = Transcript(tmp_path / "t")
    result = audit_chunks(cfg, "cpu-1t", _chunks(t), merkle_root(t.leaves()))
    whole = audit(tmp_path / "t", "cpu-1t")
    assert not result.match and result.schedule_errors == whole.schedule_errors
    assert any(str(micro) in e for e in result.schedule_errors)
    assert list(result.leaves[:6]) == t.leaves()[:6]
    assert list(result.leaves[6:]) == [rejected_schedule_leaf(u) for u in range(6, cfg.steps + 1)]
    assert list(result.leaves) == list(whole.leaves)
    assert leaf_of(states_after_chunks(cfg, "cpu-1t", _chunks(t), {5})[5]) == t.leaf(5)
    with pytest.raises(ScheduleError, match="update 6"):
        states_after_chunks(cfg, "cpu-1t", _chunks(t), {6})
