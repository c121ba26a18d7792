"""Issue #2's acceptance matrix: every preset, every ordered pair of distinct profiles, 50 steps.

The trainer records on profile A; the auditor replays on profile B with the trainer's log and must
reproduce every leaf bit for bit. CI runs it at CI size (tiny models); docs/benchmarks.md gives
longer runs at default size.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from game.training.dispatch.profiles import available_profiles
from game.training.engine.audit import audit
from game.training.engine.train import train
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript

STEPS = 50
PROFILES = [p.name for p in available_profiles()]  # cpu-1t, cpu-2t, splitk-16, splitk-64, noisy (+ cuda)
SIZES: dict[str, dict[str, int]] = {
    "mlp-digits": {"hidden": 16},
    "cnn-digits": {"channels": 4, "hidden": 16},
    "gpt-shakespeare": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
}


@pytest.mark.parametrize("preset", sorted(SIZES))
def test_every_pair_of_profiles_replays_bit_exactly_for_50_steps(preset: str, tmp_path: Path) -> None:
    cfg = TaskConfig.for_preset(
        preset, steps=STEPS, batch_size=4, checkpoint_interval=25, model=SIZES[preset]
    )
    transcripts = {}
    for a in PROFILES:
        transcripts[a] = tmp_path / a
        train(cfg, a, transcripts[a])
    assert len(transcripts) >= 5  # two real CPU profiles, two emulated tile orders, noisy (+ cuda)
    noisy_corrections = 0
    for a, b in itertools.permutations(PROFILES, 2):
        result = audit(transcripts[a], b)
        assert result.match, (
            f"{preset}: trainer {a}, auditor {b}: diverged at step {result.first_divergent_step}"
        )
        assert list(result.leaves) == Transcript(transcripts[a]).leaves()
        if b == "noisy":
            noisy_corrections += result.corrections
    assert noisy_corrections > 0
