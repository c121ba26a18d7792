"""The evidence directory: what an auditor leaves there for the judge, and how anyone reads it.

Why a module of its own: the auditor writes it, the judge and an auditor reading a withheld log
from the chain read it, and anyone at all may write into it. So every file is named by a hash the
reader already holds, and held to that hash before anything in it is used:

- a state under its leaf (``<leaf>.state``): the bytes must hash to the name;
- a task's config under the task's spec hash (``<spec hash>.task.json``): the config and the
  inputs it was recorded with must hash to the name *before* the config is loaded, as a
  transcript's manifest is held (:func:`game.training.task.spec.recorded_spec_hash`). Loading
  imports the module the config's ``task`` names, and a file someone left must not make a judge
  import a module of that someone's choosing. Nor must a module of the task's name that is not
  the recorded code (:func:`game.training.task.config.load_recorded` holds the code it finds to the
  recorded digest before it imports it).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from game import untrusted
from game.errors import ConfigError
from game.fsio import atomic_write
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig, load_recorded
from game.training.task.spec import recorded_spec_hash

log = logging.getLogger(__name__)


def pre_state_path(evidence_dir: Path, state_hash: bytes) -> Path:
    """Where canonical state bytes hashing to ``state_hash`` are left for the judge."""
    return Path(evidence_dir) / f"{state_hash.hex()}.state"


def config_path(evidence_dir: Path, spec_hash: bytes) -> Path:
    """Where a task config whose spec hash is ``spec_hash`` is left for the judge, with its inputs
    (:func:`write_task_config`)."""
    return Path(evidence_dir) / f"{spec_hash.hex()}.task.json"


def write_pre_state(evidence_dir: Path, data: bytes) -> Path:
    """Leave state bytes for the judge under their state hash (their leaf); returns the path. A
    file already there is kept only where it holds these bytes: anyone may write into the
    directory, and a file under a leaf's name that does not hash to it (left by a trainer before
    the pin) kept the auditor's state from the judge."""
    path = pre_state_path(evidence_dir, leaf_of(data))
    try:
        same = path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        same = False
    if not same:
        atomic_write(path, data)
    return path


def left_state(evidence_dir: Path, leaf: bytes) -> bytes | None:
    """State bytes hashing to ``leaf`` that someone left in ``evidence_dir`` (what
    :func:`write_pre_state` writes), or None. Anyone may write there: a file that does not hash to
    its name, or cannot be read (a sparse terabyte raised MemoryError), is ignored."""
    path = pre_state_path(evidence_dir, leaf)
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except (OSError, MemoryError) as exc:
        log.warning("evidence %s cannot be read (%s); ignored", path.name, exc)
        return None
    if leaf_of(data) == leaf:
        return data
    log.warning("evidence %s does not hash to its name; ignored", path.name)
    return None


def write_task_config(evidence_dir: Path, cfg: TaskConfig, spec_hash: bytes) -> Path:
    """Leave the task's config for the judge under ``spec_hash``, with the inputs it hashes with, so
    that a reader can hold the pair to the task before loading it; returns the path."""
    path = config_path(evidence_dir, spec_hash)
    doc = {"config": cfg.to_dict(), "inputs": cfg.inputs().to_dict()}
    atomic_write(path, json.dumps(doc, sort_keys=True).encode())
    return path


def read_task_config(evidence_dir: Path, spec_hash: bytes) -> TaskConfig | None:
    """The task config left under ``spec_hash`` (:func:`write_task_config`), or None where none is.

    Raises :class:`ConfigError` saying why where a file is there but is not the task's config: not
    a config and inputs, hashing to another spec hash (then nothing of it is loaded), or, loaded
    here, hashing to another (this machine's data, initial weights or task code differ; a missing
    task package raises its :class:`~game.training.task.plugins.PluginError`)."""
    path = config_path(evidence_dir, spec_hash)
    if not path.is_file():
        return None
    try:
        doc = untrusted.loads(path.read_bytes())
    except (OSError, MemoryError, ValueError) as exc:  # a sparse terabyte raises MemoryError
        raise ConfigError(f"the config left at {path.name} cannot be read: {exc!r}") from None
    if not (
        isinstance(doc, dict)
        and set(doc) == {"config", "inputs"}
        and all(isinstance(v, dict) for v in doc.values())
    ):
        raise ConfigError(f"the file left at {path.name} is not a task config with its inputs")
    recorded = recorded_spec_hash(doc["config"], doc["inputs"])
    if recorded != spec_hash:
        raise ConfigError(
            f"the config left at {path.name} hashes to {recorded.hex()[:16]}...: not the task's, so "
            "nothing of it is loaded"
        )
    cfg = load_recorded(doc["config"], doc["inputs"])
    if cfg.spec_hash() != spec_hash:
        raise ConfigError(
            f"the config left at {path.name}, loaded here, hashes to {cfg.spec_hash().hex()[:16]}...: "
            "this machine's data, initial weights or task code differ from the trainer's"
        )
    return cfg


__all__ = [
    "config_path",
    "left_state",
    "pre_state_path",
    "read_task_config",
    "write_pre_state",
    "write_task_config",
]
