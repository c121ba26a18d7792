"""A trainer's transcript read: the manifest, the leaves, every chunk checked against its recorded
hash, checkpoints checked against their leaves, and both roots.

The auditor, the judge, ``vgame audit`` and a resumed trainer read transcripts with
:class:`Transcript`. Who takes only some files out of a published archive (the judge re-running one
step, a client taking the final model) asks :func:`step_files` or :func:`model_files` which ones,
instead of naming them itself. Its own code uses no torch, but the chunk decoders and the kernels it calls
(:mod:`game.training.log`, :mod:`game.training.native`) import it.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from game.errors import RoundingLogError, TranscriptError
from game.merkle import HASH_SIZE, merkle_root
from game.training.log.chunks import chunk_hash
from game.training.log.formats import ChunkLog, decode_chunk, decode_scheduled, schedule_entry
from game.training.log.schedule import ScheduleEntry
from game.training.state import leafnative
from game.training.transcript.files import LogReader, read_hashes
from game.training.transcript.layout import (
    CHUNK_HASHES_NAME,
    LEAVES_NAME,
    LOG_DIR_NAME,
    MANIFEST_NAME,
    TranscriptPaths,
    checkpoint_file_step,
    checkpoint_relpath,
    checkpoint_step,
    chunk_file_step,
    chunk_relpath,
)
from game.training.transcript.manifest import config_of, read_manifest


def steps_on_disk(directory: Path) -> int:
    """How many steps of the transcript in ``directory`` are complete on disk (its whole leaves),
    read only: what a resumed run keeps. 0 when there is no transcript yet."""
    try:
        return TranscriptPaths(Path(directory)).leaves.stat().st_size // HASH_SIZE
    except FileNotFoundError:
        return 0


def step_files(
    names: Collection[str], step: int | None, *, rebuild: bool = False, back: int = 0
) -> list[str]:
    """The files of a published transcript (its archive's ``names``) that re-running ``step`` needs
    (None: only the config): always the manifest and the two hash files; the step's chunk; to
    rebuild its pre-state (``rebuild``), the nearest checkpoint before it and the chunks from there.
    ``back``: an asynchronous task's ``max_staleness``, whose update computes on states as far back
    as ``step - 1 - back``: the checkpoint at or before that one, the checkpoints of the states
    after it (a state an update computes on across a checkpoint has one of its own) and the chunks
    from there. What the archive lacks is left out, for :class:`Transcript` to report as it would
    for a whole copy."""
    out = [MANIFEST_NAME, LEAVES_NAME, CHUNK_HASHES_NAME]
    if step is not None:
        out.append(chunk_relpath(step))
        ckpts = [c for n in names if (c := checkpoint_step(n)) is not None and c < step] if rebuild else []
        if ckpts:
            start = max([c for c in ckpts if c <= step - 1 - back] or [min(ckpts)])
            out += [checkpoint_relpath(c) for c in sorted(ckpts) if start - back <= c]
            out += [chunk_relpath(s) for s in range(start + 1, step)]
    return [n for n in out if n in names]


def files_up_to(names: Collection[str], step: int) -> list[str]:
    """The files of a published transcript (its archive's ``names``) that rebuilding the state
    after ``step`` from any start needs: every checkpoint at or before it and every chunk up to it,
    with the three files every fetch takes. For a rebuild that cannot start at the nearest
    checkpoint (one missing or altered: nothing on the chain checks them)."""
    out = [MANIFEST_NAME, LEAVES_NAME, CHUNK_HASHES_NAME]
    for name in sorted(names):
        ckpt = checkpoint_step(name)
        folder, _, base = name.rpartition("/")
        chunk = chunk_file_step(base) if folder == LOG_DIR_NAME else None
        if (ckpt is not None and ckpt <= step) or (chunk is not None and 1 <= chunk <= step):
            out.append(name)
    return [n for n in out if n in names]


def model_files(final_step: int) -> tuple[str, str]:
    """The files of a published transcript that hold its trained model: the manifest (the config)
    and the checkpoint of the final step (the state the last leaf commits to)."""
    return MANIFEST_NAME, checkpoint_relpath(final_step)


class Transcript:
    """Read access to a transcript directory, with the checks an auditor or judge needs."""

    def __init__(self, directory: Path | str, *, spec_hash: bytes | None = None) -> None:
        """``spec_hash``: the one a transcript someone else wrote is held to (its task's on-chain),
        checked on the recorded config before anything of it is loaded (:func:`.manifest.config_of`)."""
        self.directory = Path(directory)
        if not self.directory.is_dir():
            what = "is a file, not a directory" if self.directory.exists() else "does not exist"
            raise TranscriptError(
                f"transcript directory {self.directory} {what} (pass the --out of `vgame train`)"
            )
        self.paths = TranscriptPaths(self.directory)
        self.manifest = read_manifest(self.directory)
        self.config = config_of(self.manifest, self.paths.manifest, spec_hash)
        self.spec_hash = self.config.spec_hash()
        self._leaves: list[bytes] | None = None
        self._chunk_hashes: list[bytes] | None = None
        self._reader = LogReader(self.paths.log_dir, self.spec_hash)

    @property
    def steps(self) -> int:
        return self.manifest.steps

    @property
    def profile(self) -> str:
        return self.manifest.profile

    def _leaf_list(self) -> list[bytes]:
        if self._leaves is None:
            self._leaves = read_hashes(self.paths.leaves, "leaves")
        return self._leaves

    def _chunk_hash_list(self) -> list[bytes]:
        if self._chunk_hashes is None:
            self._chunk_hashes = read_hashes(self.paths.chunk_hashes, "chunk hashes")
        return self._chunk_hashes

    def leaves(self) -> list[bytes]:
        return list(self._leaf_list())

    def leaf(self, step: int) -> bytes:
        leaves = self._leaf_list()  # not a copy: an audit asks once a step
        if not 0 <= step < len(leaves):
            raise TranscriptError(
                f"step {step} is out of range: the transcript has leaves for steps 0..{len(leaves) - 1}"
            )
        return leaves[step]

    def chunk_hashes(self) -> list[bytes]:
        return list(self._chunk_hash_list())

    def read_log(self, step: int) -> ChunkLog:
        """The rounding log of ``step``, checked against its recorded chunk hash.

        A chunk that matches its hash but does not decode raises RoundingLogError: that is the
        trainer's fault at that step, not a damaged transcript.
        """
        return decode_chunk(self.chunk_bytes(step), self.spec_hash, step)

    def read_scheduled(self, step: int) -> tuple[ScheduleEntry | None, ChunkLog]:
        """The schedule entry of ``step`` (None in a synchronous task's plain chunk) and its log."""
        return decode_scheduled(self.chunk_bytes(step), self.spec_hash, step)

    def update_entry(self, step: int) -> ScheduleEntry | None:
        """The schedule entry that ``step``'s chunk carries (None for a plain chunk), its envelope
        checked and the log inside it left undecoded: a log that does not decode is the trainer's
        fault at that update, which the replay finds (and runs the update without it), where a
        schedule that does not parse stops the replay."""
        return schedule_entry(self.chunk_bytes(step), self.spec_hash, step)

    def schedule(self) -> list[ScheduleEntry]:
        """Every update's schedule entry, in order (a synchronous task's are the sync ones, which
        its chunks do not carry)."""
        if not self.config.scheduled:
            return [ScheduleEntry.sync(u, self.config.accumulate) for u in range(1, self.steps + 1)]
        out = []
        for step in range(1, self.steps + 1):
            entry = self.update_entry(step)
            if entry is None:
                raise RoundingLogError(
                    f"step {step}: the task is asynchronous (max_staleness {self.config.max_staleness}) "
                    "but its chunk carries no schedule"
                )
            out.append(entry)
        return out

    def chunk_bytes(self, step: int) -> bytes:
        """The raw chunk of ``step``, checked against its recorded chunk hash (what the judge gets).
        The bytes checked are the bytes returned: the file is read once."""
        return self._checked_chunk(step)

    def chunk_path(self, step: int) -> Path:
        """Path of the chunk file of ``step`` (what the judge is handed)."""
        return Path(self._reader.chunk_path(step))

    def _checked_chunk(self, step: int) -> bytes:
        hashes = self._chunk_hash_list()
        if not 0 <= step < len(hashes):
            raise TranscriptError(f"no log chunk for step {step}: the transcript has {len(hashes)} chunks")
        try:
            data = self._reader.read_bytes(step)
        except (RoundingLogError, OSError) as exc:
            raise TranscriptError(f"log chunk of step {step} in {self.directory} is unusable: {exc}") from exc
        actual = chunk_hash(data)
        if actual != hashes[step]:
            raise TranscriptError(
                f"log chunk of step {step} hashes to {actual.hex()[:16]}..., but {CHUNK_HASHES_NAME} "
                f"records {hashes[step].hex()[:16]}...: the chunk was altered"
            )
        return data

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_steps(self) -> list[int]:
        ckpt_dir = self.paths.checkpoint_dir
        if not ckpt_dir.is_dir():
            return []
        return sorted(s for p in ckpt_dir.iterdir() if (s := checkpoint_file_step(p.name)) is not None)

    def nearest_checkpoint(self, step: int) -> int:
        """The latest checkpoint at or before ``step``."""
        usable = [s for s in self.checkpoint_steps() if s <= step]
        if not usable:
            raise TranscriptError(f"no checkpoint at or before step {step} in {self.directory}")
        return usable[-1]

    def load_checkpoint(self, step: int) -> bytes:
        """Canonical state bytes at ``step``, verified against leaf ``step``."""
        path = self.paths.checkpoint(step)
        if not path.is_file():
            raise TranscriptError(f"no checkpoint for step {step} in {self.directory}")
        data = path.read_bytes()
        if leafnative.leaf(data) != self.leaf(step):
            raise TranscriptError(f"checkpoint {path.name} does not hash to leaf {step}: it was altered")
        return data

    # -- whole-transcript checks -----------------------------------------------------------

    def verify(self, *, check_chunks: bool = True) -> None:
        """Check counts and both roots (and every chunk against its hash); raise on the first problem."""
        m = self.manifest
        if not m.complete:
            raise TranscriptError(
                f"{self.directory} is an unfinished transcript; resume `vgame train` with the same --out"
            )
        leaves = self.leaves()
        if len(leaves) != m.num_leaves:
            raise TranscriptError(
                f"{LEAVES_NAME} holds {len(leaves)} leaves, the manifest says {m.num_leaves}"
            )
        if merkle_root(leaves).hex() != m.state_root:
            raise TranscriptError(
                f"the state root recomputed from {LEAVES_NAME} differs from the manifest's: a leaf was altered"
            )
        hashes = self.chunk_hashes()
        if len(hashes) != m.num_leaves:
            raise TranscriptError(
                f"{CHUNK_HASHES_NAME} holds {len(hashes)} hashes, the manifest says {m.num_leaves}"
            )
        if merkle_root(hashes).hex() != m.log_root:
            raise TranscriptError(
                f"the log root recomputed from {CHUNK_HASHES_NAME} differs from the manifest's"
            )
        if check_chunks:
            for step in range(m.num_leaves):
                self._checked_chunk(step)
