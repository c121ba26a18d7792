"""An audit's own progress on disk, so that a replay killed at step 9,000 goes on from there.

Why: the auditor replays the whole training. On a paper-size task that is hours or days, inside a
challenge window that does not wait; a crash, a reboot or a `docker stop` that made it start over
could cost it the window. Every so often (``every_s`` of wall time, so the steps of a small task
pay nothing) :func:`~game.training.engine.audit.audit` saves what it has: its own state after the last
step (its canonical bytes, which hash to the auditor's leaf for that step), the leaves so far,
the corrections, the first divergent step and the rejected log chunks.

Crash-safe by order: the state goes to a file named by its step, then the small JSON record that
names it replaces the old record, and only then is the old state file removed. A crash anywhere
leaves a record whose state file is whole; a record or state that does not check out (another
transcript, another profile, bytes that do not hash to the recorded leaf) is set aside with a
warning and the audit starts from step 0, which is never wrong, only slower.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from game.fsio import atomic_write, fsync_dir, is_temp_name
from game.training.state.leafhash import leaf_of

log = logging.getLogger(__name__)

#: What the record says it is; a record of another format is not read.
FORMAT = "vgame-audit-progress-v1"
RECORD_NAME = "audit-progress.json"
STATE_PREFIX = "audit-state-"
#: Default wall time between two saves: a small task's audit never saves; a long one loses at most this.
DEFAULT_EVERY_S = 300.0


@dataclass(frozen=True)
class AuditProgress:
    """Where an audit stands after ``step``: enough, with the state, to run step ``step + 1``."""

    trainer_state_root: bytes  # which transcript (its committed root)
    profile: str
    use_log: bool
    leaves: tuple[bytes, ...]  # the auditor's own leaves 0..step
    corrections: int
    first_divergent_step: int | None
    rejected_log_steps: tuple[int, ...]
    log_errors: tuple[str, ...]

    @property
    def step(self) -> int:
        return len(self.leaves) - 1

    def to_dict(self, state_file: str) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "trainer_state_root": self.trainer_state_root.hex(),
            "profile": self.profile,
            "use_log": self.use_log,
            "step": self.step,
            "state_file": state_file,
            "leaves": [leaf.hex() for leaf in self.leaves],
            "corrections": self.corrections,
            "first_divergent_step": self.first_divergent_step,
            "rejected_log_steps": list(self.rejected_log_steps),
            "log_errors": list(self.log_errors),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AuditProgress:
        leaves = tuple(bytes.fromhex(h) for h in doc["leaves"])
        if len(leaves) != int(doc["step"]) + 1 or any(len(leaf) != 32 for leaf in leaves):
            raise ValueError("its leaves do not run from step 0 to its step")
        return cls(
            trainer_state_root=bytes.fromhex(doc["trainer_state_root"]),
            profile=str(doc["profile"]),
            use_log=bool(doc["use_log"]),
            leaves=leaves,
            corrections=int(doc["corrections"]),
            first_divergent_step=None
            if doc["first_divergent_step"] is None
            else int(doc["first_divergent_step"]),
            rejected_log_steps=tuple(int(s) for s in doc["rejected_log_steps"]),
            log_errors=tuple(str(e) for e in doc["log_errors"]),
        )


class ProgressSaver:
    """Saves and finds an audit's progress in ``directory`` (the caller holds the directory alone)."""

    def __init__(self, directory: Path, every_s: float = DEFAULT_EVERY_S) -> None:
        if not every_s >= 0:
            raise ValueError(f"every_s must be >= 0, got {every_s}")
        self.directory = Path(directory)
        self.every_s = every_s
        self._last = time.monotonic()

    @property
    def record(self) -> Path:
        return self.directory / RECORD_NAME

    def due(self) -> bool:
        """Whether ``every_s`` has passed since the start or the last save."""
        return time.monotonic() - self._last >= self.every_s

    def save(
        self,
        progress: AuditProgress,
        state_bytes: bytes | memoryview,
        versions: Mapping[int, Mapping[str, Tensor]] | None = None,
    ) -> None:
        """Keep ``progress`` and the canonical bytes of the state after its step; ``versions``: an
        asynchronous task's replay also keeps the parameters and buffers of the older states its
        later updates compute on (the auditor's own, which no transcript holds after a divergence)."""
        name = f"{STATE_PREFIX}{progress.step:09d}.bin"
        atomic_write(self.directory / name, state_bytes)
        kept = {name}
        doc = progress.to_dict(name)
        if versions is not None:
            vname = f"{STATE_PREFIX}{progress.step:09d}.versions"
            buf = io.BytesIO()
            torch.save({int(v): dict(w) for v, w in versions.items()}, buf)
            atomic_write(self.directory / vname, buf.getvalue())
            kept.add(vname)
            doc["versions_file"] = vname
        atomic_write(self.record, json.dumps(doc, indent=1).encode())
        self._remove_states(keep=kept)
        self._last = time.monotonic()
        log.debug("audit progress saved at step %d in %s", progress.step, self.directory)

    def load(
        self, trainer_state_root: bytes, profile: str, use_log: bool
    ) -> tuple[AuditProgress, bytes, dict[int, dict[str, Tensor]]] | None:
        """The progress saved for this transcript, profile and use of the log, with the state's
        bytes and the versions kept beside it (none for a synchronous task); None when there is
        none, or none that checks out (said in a warning)."""
        if not self.record.is_file():
            return None
        try:
            doc = json.loads(self.record.read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"its format is {doc.get('format')!r}, not {FORMAT!r}")
            progress = AuditProgress.from_dict(doc)
            state_file = str(doc["state_file"])
            if "/" in state_file or "\\" in state_file or not state_file.startswith(STATE_PREFIX):
                raise ValueError(f"it names {state_file!r} as its state file")
            state = (self.directory / state_file).read_bytes()
            versions: dict[int, dict[str, Tensor]] = {}
            if doc.get("versions_file") is not None:
                vfile = str(doc["versions_file"])
                if "/" in vfile or "\\" in vfile or not vfile.startswith(STATE_PREFIX):
                    raise ValueError(f"it names {vfile!r} as its versions file")
                versions = torch.load(self.directory / vfile, map_location="cpu", weights_only=True)
                if not isinstance(versions, dict):
                    raise ValueError("its versions file holds no table of versions")
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as exc:
            log.warning("audit progress in %s is unusable (%s): replaying from step 0", self.directory, exc)
            return None
        same = (progress.trainer_state_root, progress.profile, progress.use_log) == (
            trainer_state_root,
            profile,
            use_log,
        )
        if not same:
            log.warning(
                "audit progress in %s is of another audit (transcript root %s..., profile %s, %s); "
                "replaying from step 0",
                self.directory,
                progress.trainer_state_root.hex()[:16],
                progress.profile,
                "with the log" if progress.use_log else "without the log",
            )
            return None
        if leaf_of(state) != progress.leaves[-1]:
            log.warning(
                "audit progress in %s: the state of step %d does not hash to its leaf; replaying from step 0",
                self.directory,
                progress.step,
            )
            return None
        return progress, state, versions

    def clear(self) -> None:
        """Remove the saved progress (the audit it served has finished)."""
        self.record.unlink(missing_ok=True)
        self._remove_states(keep=None)

    def _remove_states(self, keep: set[str] | None) -> None:
        removed = False
        for path in self.directory.glob(f"*{STATE_PREFIX}*"):
            if path.name not in (keep or set()) and (
                path.name.startswith(STATE_PREFIX) or is_temp_name(path.name)
            ):
                path.unlink(missing_ok=True)
                removed = True
        if removed:
            fsync_dir(self.directory)


__all__ = ["DEFAULT_EVERY_S", "AuditProgress", "ProgressSaver"]
