"""The transcript's ``manifest.json``: the task config and its spec hash, the profile, the software
versions, the roots once the run is complete; and where checkpoints are kept.

Why its own module: the writer starts and finishes it, the reader checks it, and a client reads it
alone out of a sealed archive (:mod:`game.delivery`) without any other file of the transcript.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from game import untrusted
from game.errors import ConfigError, TranscriptError
from game.training.task.config import TaskConfig, load_recorded
from game.training.task.inputs import Inputs
from game.training.task.plugins import PluginError
from game.training.task.spec import recorded_spec_hash
from game.training.transcript.layout import FORMAT, MANIFEST_NAME, TranscriptPaths


def software_versions() -> dict[str, str]:
    """Versions that went into a transcript: recorded for people, never part of any hash."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "vgame": version("vgame"),
        "torch": version("torch"),
        "python": platform.python_version(),
        "numpy": version("numpy"),
    }


def is_checkpoint_step(step: int, interval: int, steps: int) -> bool:
    """Checkpoints are kept at init, every ``interval`` steps and at the last step."""
    return step == 0 or step == steps or (interval > 0 and step % interval == 0)


@dataclass(frozen=True)
class Manifest:
    """The transcript's ``manifest.json``; roots are hex strings (``None`` until complete)."""

    config: dict[str, Any]
    spec_hash: str
    profile: str
    steps: int
    checkpoint_interval: int
    versions: dict[str, str] = field(default_factory=software_versions)
    state_root: str | None = None
    log_root: str | None = None
    complete: bool = False
    #: the digests of the task's inputs (data, initial weights, code, libraries) the run used
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def num_leaves(self) -> int:
        """A run of ``S`` steps has ``S + 1`` leaves: leaf 0 is the initial state."""
        return self.steps + 1

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "config": self.config,
            "inputs": self.inputs,
            "spec_hash": self.spec_hash,
            "versions": self.versions,
            "profile": self.profile,
            "steps": self.steps,
            "num_leaves": self.num_leaves,
            "state_root": self.state_root,
            "log_root": self.log_root,
            "checkpoint_interval": self.checkpoint_interval,
            "complete": self.complete,
        }
        return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> Manifest:
        try:
            doc = untrusted.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TranscriptError(f"{where} is not valid JSON ({exc}); the transcript is damaged") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else None
            older = " (an older vgame's, whose log-tree leaves this one does not commit to: train it again)"
            hint = older if found == "vgame-transcript-v1" else ""
            raise TranscriptError(f"{where} has format {found!r}, expected {FORMAT!r}{hint}")
        try:
            manifest = cls(
                config=dict(doc["config"]),
                spec_hash=str(doc["spec_hash"]),
                profile=str(doc["profile"]),
                steps=int(doc["steps"]),
                checkpoint_interval=int(doc["checkpoint_interval"]),
                versions={str(k): str(v) for k, v in dict(doc["versions"]).items()},
                state_root=doc["state_root"],
                log_root=doc["log_root"],
                complete=bool(doc["complete"]),
                inputs=dict(doc["inputs"]),
            )
            num_leaves = int(doc["num_leaves"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TranscriptError(
                f"{where} lacks or mistypes field {exc}; the transcript is damaged"
            ) from None
        if num_leaves != manifest.num_leaves:
            raise TranscriptError(
                f"{where} says num_leaves={num_leaves} but steps={manifest.steps} needs {manifest.num_leaves}"
            )
        return manifest


def config_of(manifest: Manifest, where: Path, spec_hash: bytes | None = None) -> TaskConfig:
    """Rebuild the task config, check this machine's inputs are the recorded ones (naming any that
    differs: :class:`~game.training.task.inputs.InputsMismatch`), and that it all still hashes to
    the recorded spec hash.

    ``spec_hash``: the one the caller holds the transcript to (a task's on-chain). The recorded
    config and inputs must hash to it *before* the config is loaded: loading imports the module
    the config names, and a trainer that sealed another config into its transcript must not make
    an auditor or a judge import whatever module it likes."""
    if spec_hash is not None:
        try:
            recorded = recorded_spec_hash(manifest.config, manifest.inputs)
        except ConfigError as exc:
            raise TranscriptError(f"{where}: {exc}") from None
        if recorded != spec_hash:
            raise TranscriptError(
                f"{where}: the recorded task config hashes to {recorded.hex()[:16]}..., not to the spec "
                f"hash {spec_hash.hex()[:16]}... it is held to: not the task's, so nothing of it is loaded"
            )
    try:
        inputs = Inputs.from_dict(manifest.inputs)
    except ConfigError as exc:
        raise TranscriptError(f"{where}: the recorded inputs are invalid ({exc})") from exc
    try:
        cfg = load_recorded(manifest.config, manifest.inputs)
    except PluginError:
        raise  # the task's code is not here, or not the recorded code: say so as it is
    except Exception as exc:
        raise TranscriptError(f"{where}: the recorded task config is invalid ({exc})") from exc
    cfg.inputs().check_against(inputs, f"the transcript at {where.parent}")
    if cfg.spec_hash().hex() != manifest.spec_hash:
        raise TranscriptError(
            f"{where}: the recorded config hashes to {cfg.spec_hash().hex()} but the manifest's spec_hash "
            f"is {manifest.spec_hash}: the config or the spec hash was edited"
        )
    if cfg.steps != manifest.steps or cfg.checkpoint_interval != manifest.checkpoint_interval:
        raise TranscriptError(f"{where}: steps or checkpoint_interval disagree with the recorded config")
    return cfg


def make_transcript_dir(directory: Path) -> None:
    """Make ``directory`` for a transcript (with its parents), or say in one line why it cannot be."""
    if directory.exists() and not directory.is_dir():
        raise TranscriptError(f"{directory} is a file, not a directory; choose another --out")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TranscriptError(f"cannot make the transcript directory {directory}: {exc}") from exc


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the transcript in ``directory``; a missing one says how to make it."""
    path = TranscriptPaths(directory).manifest
    if not path.is_file():
        raise TranscriptError(
            f"no transcript at {directory}: {MANIFEST_NAME} is missing (run `vgame train --out {directory}`)"
        )
    return Manifest.from_json(path.read_bytes(), path)
