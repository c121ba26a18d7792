"""The evidence directory's task config: anyone may write into the directory, and loading a config
imports the module its ``task`` names, so a config left there is held to the task's spec hash with
the inputs it was recorded with before anything of it is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from game.errors import ConfigError
from game.evidencedir import config_path, read_task_config, write_task_config
from game.training.task.config import TaskConfig


def _cfg() -> TaskConfig:
    return TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, batch_size=8, steps=4)


def test_aConfigLeftByItsWriter_readsBack_heldToItsSpecHash(tmp_path: Path) -> None:
    cfg = _cfg()
    path = write_task_config(tmp_path, cfg, cfg.spec_hash())
    assert path == config_path(tmp_path, cfg.spec_hash())
    got = read_task_config(tmp_path, cfg.spec_hash())
    assert got is not None and got.to_dict() == cfg.to_dict() and got.spec_hash() == cfg.spec_hash()
    assert read_task_config(tmp_path, bytes(32)) is None  # nothing left under another task's hash


def test_aConfigOfAnotherTask_underThisTasksName_isRefused(tmp_path: Path) -> None:
    cfg, other = _cfg(), _cfg().replace(steps=5)
    write_task_config(tmp_path, other, other.spec_hash())
    config_path(tmp_path, other.spec_hash()).rename(config_path(tmp_path, cfg.spec_hash()))
    with pytest.raises(ConfigError, match="not the task's, so nothing of it is loaded"):
        read_task_config(tmp_path, cfg.spec_hash())


@pytest.mark.parametrize("kind", ["bare config", "with inputs, another hash"])
def test_aPlantedConfig_namingItsOwnModule_isRefused_beforeTheModuleIsImported(
    tmp_path: Path, planted: tuple[str, Path], kind: str
) -> None:
    task, mark = planted
    spec_hash = _cfg().spec_hash()
    config = {**_cfg().to_dict(), "task": task}
    doc = config if kind == "bare config" else {"config": config, "inputs": _cfg().inputs().to_dict()}
    config_path(tmp_path, spec_hash).write_text(json.dumps(doc))
    with pytest.raises(ConfigError):
        read_task_config(tmp_path, spec_hash)
    assert not mark.exists()  # its code never ran


@pytest.mark.parametrize("content", ["[" * 200_000 + "]" * 200_000, "{", '{"config": 1, "inputs": {}}', "[]"])
def test_aFileThatIsNoConfigRecord_isRefusedByName(tmp_path: Path, content: str) -> None:
    spec_hash = _cfg().spec_hash()
    config_path(tmp_path, spec_hash).write_text(content)
    with pytest.raises(ConfigError, match=config_path(tmp_path, spec_hash).name):
        read_task_config(tmp_path, spec_hash)
