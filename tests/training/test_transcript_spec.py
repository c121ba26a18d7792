"""A transcript someone else wrote is held to its task's spec hash before its config is loaded.

Why: loading a config imports the module its ``task`` names. A trainer that sealed another config
into its transcript (naming any module installed on the auditor's or the judge's machine) had that
module imported by them before anything compared the config with the task's on-chain spec hash. Now
the recorded config and inputs are hashed as recorded first (``recorded_spec_hash``), and a
transcript of another config is refused with nothing of it loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from game.errors import TranscriptError, VGameError
from game.training.engine.train import train
from game.training.task.config import TaskConfig
from game.training.task.spec import recorded_spec_hash
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.reader import Transcript

PROBE = "vgame_probe_task_module"


def _trained(tmp_path: Path) -> tuple[TaskConfig, Path]:
    cfg = TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, batch_size=8, steps=2)
    train(cfg, "cpu-1t", tmp_path / "t")
    return cfg, tmp_path / "t"


def test_anHonestTranscript_itsRecordedConfig_hashesToTheSpecHash_beforeAndAfterLoading(
    tmp_path: Path,
) -> None:
    cfg, out = _trained(tmp_path)
    t = Transcript(out, spec_hash=cfg.spec_hash())
    assert recorded_spec_hash(t.manifest.config, t.manifest.inputs) == cfg.spec_hash() == t.spec_hash


def test_aRecordedConfigOfAnotherTask_isRefused_withoutImportingTheModuleItNames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, out = _trained(tmp_path)
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{PROBE}.py").write_text("IMPORTED = True\n\ndef build(cfg):\n    raise RuntimeError('never')\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delitem(sys.modules, PROBE, raising=False)
    manifest = out / MANIFEST_NAME
    doc = json.loads(manifest.read_bytes())
    doc["config"]["task"] = f"{PROBE}:build"
    manifest.write_text(json.dumps(doc))

    with pytest.raises(TranscriptError, match="not the task's, so nothing of it is loaded"):
        Transcript(out, spec_hash=cfg.spec_hash())
    assert PROBE not in sys.modules

    # Held to nothing (one's own transcript), the module is still not imported: the record carries
    # no code digest (a preset's), and a module named in its place is not the recorded code.
    with pytest.raises(VGameError, match="recorded with no task code"):
        Transcript(out)
    assert PROBE not in sys.modules


def test_aRecordedConfigThatIsNotJson_isRefusedAsDamaged(tmp_path: Path) -> None:
    cfg, out = _trained(tmp_path)
    manifest = out / MANIFEST_NAME
    doc = json.loads(manifest.read_bytes())
    doc["config"]["lr"] = float("nan")  # json.dumps writes NaN; the canonical form has none
    manifest.write_text(json.dumps(doc))
    with pytest.raises(TranscriptError, match="not canonical JSON"):
        Transcript(out, spec_hash=cfg.spec_hash())
