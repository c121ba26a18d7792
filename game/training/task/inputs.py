"""What a replay depends on besides the config's numbers: the task's inputs, bound by the spec hash.

A task is its config (:class:`~game.training.task.config.TaskConfig`: every number) *and* what the
numbers are applied to: the data, the initial weights when the task fine-tunes, the code that builds
model, data and loss, and the versions of the libraries that define the model. Two parties agree
on a task only if they agree on all of it, so the spec hash covers each as a digest
(:class:`Inputs`), and a party whose own inputs differ from the ones a transcript records says
*which* differs before it replays anything (:meth:`Inputs.differences`), instead of disagreeing at
step 1 for no stated reason. No torch here: the digests are computed where the inputs live
(:mod:`.datasets`, :mod:`.weights`, :mod:`.plugins`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from game.errors import ConfigError


class InputsMismatch(ConfigError):
    """This party's data, initial weights, task code or libraries are not the ones the task was
    trained with; the message names each that differs."""

    def __init__(self, message: str, differences: list[str]) -> None:
        super().__init__(message)
        self.differences = differences


@dataclass(frozen=True)
class Digest:
    """One input's identity: what it is (for people) and the SHA-256 of its canonical content."""

    kind: str  # "file", "tensors", "items", "package", "module", "state_dict", ...
    sha256: str  # hex
    detail: Mapping[str, Any] = field(default_factory=dict)  # names, sizes: shown, and hashed too

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sha256": self.sha256, **dict(self.detail)}

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Digest:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("kind"), str):
            raise ConfigError(f"{where}: expected a table with kind and sha256, got {doc!r}")
        sha = doc.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64:
            raise ConfigError(f"{where}.sha256: expected 64 hex digits, got {sha!r}")
        detail = {k: v for k, v in doc.items() if k not in ("kind", "sha256")}
        return cls(doc["kind"], sha, detail)

    def describe(self) -> str:
        name = self.detail.get("name") or self.detail.get("target")
        return f"{self.kind} {name} ({self.sha256[:12]}...)" if name else f"{self.kind} {self.sha256[:12]}..."


@dataclass(frozen=True)
class Inputs:
    """The digests a spec binds. ``init`` and ``code`` are None where a task has none (a task that
    starts from its seed; a built-in preset, whose code is vgame's own)."""

    dataset: Digest
    init: Digest | None = None
    code: Digest | None = None
    libraries: Mapping[str, str] = field(default_factory=dict)  # distribution -> version

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset.to_dict(),
            "init": self.init.to_dict() if self.init is not None else None,
            "code": self.code.to_dict() if self.code is not None else None,
            "libraries": dict(sorted(self.libraries.items())),
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Inputs:
        if not isinstance(doc, Mapping):
            raise ConfigError(f"inputs: expected a table, got {doc!r}")
        libs = doc.get("libraries", {})
        if not isinstance(libs, Mapping) or not all(isinstance(v, str) for v in libs.values()):
            raise ConfigError(f"inputs.libraries: expected a table of versions, got {libs!r}")
        return cls(
            dataset=Digest.from_dict(doc.get("dataset"), "inputs.dataset"),
            init=None if doc.get("init") is None else Digest.from_dict(doc["init"], "inputs.init"),
            code=None if doc.get("code") is None else Digest.from_dict(doc["code"], "inputs.code"),
            libraries={str(k): v for k, v in libs.items()},
        )

    def differences(self, recorded: Inputs) -> list[str]:
        """One line per input that differs from ``recorded`` (the trainer's), naming it."""
        out: list[str] = []
        for what, mine, theirs in (
            ("data", self.dataset, recorded.dataset),
            ("initial weights", self.init, recorded.init),
            ("task code", self.code, recorded.code),
        ):
            if mine == theirs:
                continue
            if theirs is None or mine is None:
                has = "has" if theirs is not None else "has no"
                out.append(f"{what}: the task {has} {what}; here: {mine.describe() if mine else 'none'}")
            else:
                hint = (
                    " (if the files are the same: the dataset is made otherwise in every process, its "
                    "split or items drawn from a generator made outside the task's build function, "
                    "such as one made at import, or from the clock; vgame serves the draws a build, "
                    "an item or a collate makes)"
                    if what == "data" and mine.kind == theirs.kind == "items"
                    else ""
                )
                out.append(f"{what}: the task's is {theirs.describe()}, here it is {mine.describe()}{hint}")
        for dist in sorted(set(self.libraries) | set(recorded.libraries)):
            mine_v, theirs_v = self.libraries.get(dist), recorded.libraries.get(dist)
            if mine_v != theirs_v:
                out.append(
                    f"library {dist}: the task was trained with {theirs_v or 'none'}, here {mine_v or 'none'}"
                )
        return out

    def check_against(self, recorded: Inputs, where: str) -> None:
        """Raise :class:`InputsMismatch` naming every input that differs from ``recorded``."""
        diffs = self.differences(recorded)
        if diffs:
            raise InputsMismatch(
                f"{where}: this machine's inputs are not the task's, so a replay here would disagree "
                "for that reason alone: " + "; ".join(diffs),
                diffs,
            )


__all__ = ["Digest", "Inputs", "InputsMismatch"]
