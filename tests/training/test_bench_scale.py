"""`vgame bench scale`: every worker count's steps a second, measured side by side, and the roots
every run committed (the same, or exit code 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from game.bench.scale import default_workers, measure_scale
from game.errors import ConfigError
from game.training.task.config import TaskConfig
from tests.training.test_cli_training import vgame


def test_defaultWorkers_areThoseThatDivideTheMicroBatches_andEightWithEightCores() -> None:
    assert default_workers(4, cpus=2) == [1, 2, 4]
    assert default_workers(8, cpus=8) == [1, 2, 4, 8]
    assert default_workers(8, cpus=4) == [1, 2, 4]
    assert default_workers(6, cpus=16) == [1, 2]


def test_measureScale_refusesWhatItCannotCompare(tmp_path: Path) -> None:
    cfg = TaskConfig.for_preset("mlp-digits", accumulate=4, steps=3)
    with pytest.raises(ConfigError, match="must hold 1"):
        measure_scale(cfg, [2, 4], tmp_path)
    with pytest.raises(ConfigError, match="--workers 3"):
        measure_scale(cfg, [1, 3], tmp_path)
    with pytest.raises(ConfigError, match="at least 2"):
        measure_scale(cfg.replace(steps=1), [1, 2], tmp_path)


def test_cli_benchScale_json_oneProcessAndTwoWorkers_sameRoots(tmp_path: Path) -> None:
    r = vgame(
        "bench", "scale", "--preset", "mlp-digits", "--model", "hidden=24", "--batch-size", "8",
        "--accumulate", "2", "--steps", "4", "--workers", "1,2", "--workdir", str(tmp_path), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["same_roots"] is True and len(doc["state_root"]) == 64
    assert (doc["accumulate"], doc["steps"], doc["cpus"] >= 1) == (2, 4, True)
    rows = doc["rows"]
    assert [(row["mode"], row["workers"]) for row in rows] == [("one process", 1), ("sync data parallel", 2)]
    assert rows[0]["speedup"] == 1.0
    for row in rows:
        assert row["steps_per_second"] > 0 and row["launch_seconds"] > 0 and len(row["repeats"]) == 1
        assert row["speedup"] == pytest.approx(row["steps_per_second"] / rows[0]["steps_per_second"])
    assert not any(tmp_path.iterdir())  # each run's transcript removed after it
