"""A recorded config's task code is held to the recorded code digest before its module is imported.

Why: a transcript's manifest, or a config someone left in the evidence directory, is held to the
task's spec hash before it is loaded, but loading imported whatever package of the task's name the
search path found first. Another package of that name (planted in the working directory, an older
version installed) ran its code on the auditor's or the judge's machine, and only the spec hash
computed after the import refused it. Now the files the import would run are hashed first
(``plugins.check_recorded_code``) and a package that is not the recorded code is never imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from game.errors import ConfigError, TranscriptError
from game.evidencedir import read_task_config, write_task_config
from game.training.engine.train import train
from game.training.task import config as config_mod
from game.training.task import plugins
from game.training.task.config import TaskConfig, load_config, load_recorded
from game.training.task.plugins import PluginError
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.reader import Transcript
from tests.training.test_task_api import make_plugin


def _forget(monkeypatch: pytest.MonkeyPatch, package: str, task: str) -> None:
    """As a fresh process of another party: nothing of the task's package loaded yet."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(plugins._loaded, task, raising=False)
    monkeypatch.delitem(config_mod._factories, task, raising=False)


def _plant(root: Path, package: str) -> Path:
    """A package of the task's name under ``root`` whose import leaves a mark; returns the mark."""
    mark = root / "imported"
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (root / package / "tasks.py").write_text("def build(cfg):\n    raise RuntimeError('never')\n")
    return mark


@pytest.fixture
def trained(tmp_path: Path) -> tuple[TaskConfig, Path, str]:
    """A user's task trained two steps: its config, its transcript, its package's name."""
    package = make_plugin(tmp_path / "honest")
    cfg = load_config(tmp_path / "honest" / "task.toml").replace(steps=2)
    train(cfg, "cpu-1t", tmp_path / "t")
    return cfg, tmp_path / "t", package


def test_anotherPackageOfTheTasksName_isRefused_beforeItIsImported_fromATranscript(
    tmp_path: Path, trained: tuple[TaskConfig, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, out, package = trained
    _forget(monkeypatch, package, cfg.task)
    mark = _plant(tmp_path / "planted", package)
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))  # found before the honest package

    with pytest.raises(PluginError, match="not the code its spec was recorded with") as info:
        Transcript(out, spec_hash=cfg.spec_hash())
    assert not mark.exists()  # its code never ran
    assert package not in sys.modules
    assert f"package {package}" in str(info.value)  # names what was found

    # The honest package found again: the transcript loads and hashes to the task.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path / "planted")])
    _forget(monkeypatch, package, cfg.task)
    t = Transcript(out, spec_hash=cfg.spec_hash())
    assert t.config.spec_hash() == cfg.spec_hash()
    assert not mark.exists()


def test_anotherPackageOfTheTasksName_isRefused_beforeItIsImported_fromTheEvidenceDirectory(
    tmp_path: Path, trained: tuple[TaskConfig, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, _, package = trained
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    write_task_config(evidence, cfg, cfg.spec_hash())
    _forget(monkeypatch, package, cfg.task)
    mark = _plant(tmp_path / "planted", package)
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))

    with pytest.raises(ConfigError, match="not the code its spec was recorded with"):
        read_task_config(evidence, cfg.spec_hash())
    assert not mark.exists()


def test_aRecordWithNoTaskCode_namingAModule_isRefused_beforeItIsImported(
    tmp_path: Path, planted: tuple[str, Path]
) -> None:
    """A preset's record carries no code digest: a module named in its place is not imported."""
    task, mark = planted
    preset = TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, batch_size=8, steps=2)
    with pytest.raises(PluginError, match="recorded with no task code"):
        load_recorded({**preset.to_dict(), "task": task}, preset.inputs().to_dict())
    assert not mark.exists()


def test_theRecordedCode_isLoaded_andAPresetPassesUnchecked(trained: tuple[TaskConfig, Path, str]) -> None:
    cfg, out, _ = trained
    doc = json.loads((out / MANIFEST_NAME).read_bytes())
    assert load_recorded(doc["config"], doc["inputs"]).spec_hash() == cfg.spec_hash()
    preset = TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, batch_size=8, steps=2)
    assert load_recorded(preset.to_dict(), preset.inputs().to_dict()).spec_hash() == preset.spec_hash()


def test_aTampered_recordedCodeDigest_isRefusedByTheSpecHash_notByTheCodeCheck(
    trained: tuple[TaskConfig, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code check guards the import only: a record whose digest was edited to match other code
    still fails the spec hash the caller holds it to first."""
    cfg, out, package = trained
    manifest = out / MANIFEST_NAME
    doc = json.loads(manifest.read_bytes())
    doc["inputs"]["code"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(doc))
    _forget(monkeypatch, package, cfg.task)
    with pytest.raises(TranscriptError, match="not the task's, so nothing of it is loaded"):
        Transcript(out, spec_hash=cfg.spec_hash())
    assert package not in sys.modules
