"""A transcript directory's layout: the one module that knows its file names.

Layout of a transcript directory (format ``vgame-transcript-v2``: v1's chunk hashes were the chunks'
SHA-256, v2's are their log-tree leaves, :mod:`game.chunkleaf`)::

    manifest.json                      task config, spec hash, versions, profile, roots, ``complete``
    leaves.bin                         32-byte state hashes; leaf i = state after step i (leaf 0 = init)
    chunk_hashes.bin                   32-byte log-tree leaves of the chunks of steps 0..S, same order
    log/step-<step:09d>.bin            one rounding-log chunk per step
    checkpoints/state-<step:09d>.bin   canonical state bytes at step 0, every k steps and the last

A published transcript is an archive of these files under the same relative names (``/``-separated):
:func:`chunk_relpath` and :func:`checkpoint_relpath` name them there. Why one module: the writer,
the reader, the judge (which takes only a step's files from the archive) and the client's delivery
(the manifest and the last checkpoint) must agree on every name; anyone else asks here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FORMAT = "vgame-transcript-v2"
MANIFEST_NAME = "manifest.json"
LEAVES_NAME = "leaves.bin"
CHUNK_HASHES_NAME = "chunk_hashes.bin"
LOG_DIR_NAME = "log"
CHECKPOINT_DIR_NAME = "checkpoints"
_CHUNK_NAME = re.compile(r"^step-(\d{9})\.bin$")
_CHECKPOINT_NAME = re.compile(r"^state-(\d{9})\.bin$")


def chunk_file_name(step: int) -> str:
    """The file name of ``step``'s log chunk in the log directory."""
    return f"step-{step:09d}.bin"


def chunk_file_step(name: str) -> int | None:
    """The step of the log chunk file called ``name``; None for any other file."""
    m = _CHUNK_NAME.match(name)
    return int(m.group(1)) if m else None


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step`` in the checkpoint directory."""
    return f"state-{step:09d}.bin"


def checkpoint_file_step(name: str) -> int | None:
    """The step of the checkpoint file called ``name``; None for any other file."""
    m = _CHECKPOINT_NAME.match(name)
    return int(m.group(1)) if m else None


def chunk_relpath(step: int) -> str:
    """``step``'s log chunk relative to the transcript, as a published archive names it."""
    return f"{LOG_DIR_NAME}/{chunk_file_name(step)}"


def checkpoint_relpath(step: int) -> str:
    """The checkpoint of ``step`` relative to the transcript, as a published archive names it."""
    return f"{CHECKPOINT_DIR_NAME}/{checkpoint_name(step)}"


def checkpoint_step(relpath: str) -> int | None:
    """The step of the checkpoint at ``relpath`` (relative to the transcript, ``/``-separated, as
    a published archive names it); None for any other file."""
    folder, _, name = relpath.rpartition("/")
    step = checkpoint_file_step(name)
    return step if folder == CHECKPOINT_DIR_NAME else None


@dataclass(frozen=True)
class TranscriptPaths:
    """The paths of a transcript's files under ``directory``."""

    directory: Path

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST_NAME

    @property
    def leaves(self) -> Path:
        return self.directory / LEAVES_NAME

    @property
    def chunk_hashes(self) -> Path:
        return self.directory / CHUNK_HASHES_NAME

    @property
    def log_dir(self) -> Path:
        return self.directory / LOG_DIR_NAME

    @property
    def checkpoint_dir(self) -> Path:
        return self.directory / CHECKPOINT_DIR_NAME

    def chunk(self, step: int) -> Path:
        return self.log_dir / chunk_file_name(step)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoint_dir / checkpoint_name(step)
