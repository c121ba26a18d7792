"""The auditor's replay from the log chunks alone (what a trainer posted on-chain), against the
replay of the whole transcript: the same leaves for honest work, its own leaves past a deviation."""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import ConfigError
from game.merkle import merkle_root
from game.strategies.trainers import Poison
from game.training.engine.audit import audit
from game.training.engine.chunkaudit import audit_chunks, state_after_chunks
from game.training.engine.train import train
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript


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
    assert leaf_of(state_after_chunks(cfg, "splitk-16", _chunks(t), 4)) == t.leaf(4)


def test_aPoisonedStep_theChunksAlone_divergeFromIt_asTheWholeTranscriptsAuditDoes(tmp_path: Path) -> None:
    cfg = _cfg()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=Poison(cfg, 3))
    t = Transcript(tmp_path / "t")
    root = merkle_root(t.leaves())
    result = audit_chunks(cfg, "cpu-1t", _chunks(t), root)
    whole = audit(tmp_path / "t", "cpu-1t")
    assert not result.match and whole.first_divergent_step == 3
    assert list(result.leaves[:3]) == t.leaves()[:3] and result.leaves[3] != t.leaf(3)
    assert list(result.leaves[:4]) == list(whole.leaves[:4])  # the pinned step's post-state is the honest one


def test_refusesAnAsynchronousTask_andAChunkCountNotTheTasks() -> None:
    cfg = _cfg()
    with pytest.raises(ConfigError, match="6 log chunks for a task of 6 steps"):
        audit_chunks(cfg, "cpu-1t", [b""] * 6, bytes(32))
    stale = TaskConfig.from_dict({**cfg.to_dict(), "max_staleness": 1})
    with pytest.raises(ConfigError, match="asynchronous"):
        state_after_chunks(stale, "cpu-1t", [b""] * 7, 1)
