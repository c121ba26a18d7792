"""The application schedule of an asynchronous task: which micro-batches each update applied, and on
which state each was computed, carried in the update's log chunk so that the log root binds it.

A task with ``max_staleness = 0`` (the default) trains synchronously: update ``u`` (step ``u``, leaf
``u``) applies the ``accumulate`` micro-batches of step ``u``, every one computed on state ``u - 1``,
as one process does; its chunks are plain sparse or packed chunks. A task with ``max_staleness = B >
0`` lets a parameter server apply gradients as they come: update ``u`` applies any ``accumulate``
micro-batches, each computed on one of the states ``u - 1 - B .. u - 1`` (its *version*, a leaf
index). Every chunk of such a task is an envelope around the step's plain chunk::

    magic        b"vgame-sched-v1\\0"
    update       uint64 LE: u (the envelope's step; the inner chunk names the same step)
    spec hash    32 bytes
    applied      uint32 LE count, then per micro-batch, in fold order:
                   data step uint32 LE, micro-batch index uint32 LE, version uint32 LE
    lost         uint32 LE count, then per update lost to a failover:
                   update uint32 LE, leaf 32 bytes (its post-state, which no lineage keeps)
    inner size   uint32 LE, then the step's plain chunk (sparse or packed)

A micro-batch is named as :class:`~game.training.dispatch.stockops.StockOps` keys it: the data step
whose batch it is cut from and its index in that batch (its example ids follow from both). The
fold order is the order of the micro-batch ids, so an entry lists them sorted; the chunk hash is
``sha256`` of the envelope's bytes, as for any chunk, so the log root binds the schedule and the
log together. What an entry must satisfy on its own (:meth:`ScheduleEntry.check`) the judge checks
for the one update it re-runs. Every micro-batch applied exactly once over the run
(:func:`check_schedule`) is pinned to one update too: the first update that applies a micro-batch
an earlier update applied (:func:`first_repeats`, :func:`repeated_in`) is the trainer's fault there,
and the earlier update's chunk, proved against the log root, is the judge's witness. None applied
twice means none left out: ``steps`` entries of ``accumulate`` distinct micro-batches each are the
task's ``steps * accumulate`` micro-batches.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from game.errors import RoundingLogError
from game.training.log.chunks import HASH_SIZE, ChunkFormatError, PreparedChunk, check_chunk_identity

MAGIC = b"vgame-sched-v1\0"
_HEAD = struct.Struct("<Q32s")
_COUNT = struct.Struct("<I")
_APPLIED = struct.Struct("<III")
_LOST = struct.Struct("<I32s")
_U32 = 2**32


class ScheduleError(RoundingLogError):
    """A schedule entry breaks the task's rules (a micro-batch twice, a version out of the
    staleness window, the wrong number of micro-batches): the trainer's fault at that update."""


@dataclass(frozen=True, order=True)
class MicroBatchId:
    """One micro-batch of the task's data: micro-batch ``index`` of step ``step``'s batch."""

    step: int
    index: int

    def __str__(self) -> str:
        return f"{self.step}.{self.index}"


@dataclass(frozen=True)
class Applied:
    """A micro-batch an update applied, and the version (leaf index) its gradients were computed on."""

    micro: MicroBatchId
    version: int


@dataclass(frozen=True)
class LostUpdate:
    """An update computed and then lost to a failover: its index and its post-state's leaf."""

    update: int
    leaf: bytes


@dataclass(frozen=True)
class ScheduleEntry:
    """What update ``update`` applied (in fold order), and the updates it replaces that were lost."""

    update: int
    applied: tuple[Applied, ...]
    lost: tuple[LostUpdate, ...] = ()

    @classmethod
    def sync(cls, update: int, accumulate: int) -> ScheduleEntry:
        """The synchronous entry: the micro-batches of step ``update``, all on state ``update - 1``."""
        return cls(update, tuple(Applied(MicroBatchId(update, j), update - 1) for j in range(accumulate)))

    @property
    def versions(self) -> tuple[int, ...]:
        """The distinct versions the update needs, ascending."""
        return tuple(sorted({a.version for a in self.applied}))

    def check(self, *, accumulate: int, steps: int, max_staleness: int) -> None:
        """Raise :class:`ScheduleError` when the entry breaks a rule it can break on its own."""
        u = self.update
        where = f"update {u}"
        if not 1 <= u <= steps:
            raise ScheduleError(f"{where}: the task has updates 1..{steps}")
        if len(self.applied) != accumulate:
            raise ScheduleError(
                f"{where}: applies {len(self.applied)} micro-batches, the task folds {accumulate}"
            )
        ids = [a.micro for a in self.applied]
        if ids != sorted(set(ids)):
            raise ScheduleError(f"{where}: micro-batches not in fold order (ascending, each once)")
        for a in self.applied:
            if not (1 <= a.micro.step <= steps and 0 <= a.micro.index < accumulate):
                raise ScheduleError(f"{where}: micro-batch {a.micro} is not one of the task's")
            if not max(0, u - 1 - max_staleness) <= a.version <= u - 1:
                raise ScheduleError(
                    f"{where}: micro-batch {a.micro} was computed on state {a.version}, outside the "
                    f"window {max(0, u - 1 - max_staleness)}..{u - 1} (max_staleness {max_staleness})"
                )
        for lost in self.lost:
            if lost.update < u or len(lost.leaf) != HASH_SIZE:
                raise ScheduleError(f"{where}: a lost update must be {u} or later, with a 32-byte leaf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "update": self.update,
            "applied": [[a.micro.step, a.micro.index, a.version] for a in self.applied],
            "lost": [{"update": lost.update, "leaf": lost.leaf.hex()} for lost in self.lost],
        }

    # ---- bytes ---------------------------------------------------------------------------------

    def envelope(self, spec_hash: bytes, inner: bytes) -> bytes:
        """The chunk of the update: this entry around the step's plain chunk ``inner``."""
        if len(spec_hash) != HASH_SIZE:
            raise RoundingLogError(f"update {self.update}: spec hash must be {HASH_SIZE} bytes")
        parts = [MAGIC, _HEAD.pack(self.update, bytes(spec_hash)), _COUNT.pack(len(self.applied))]
        for a in self.applied:
            for value in (a.micro.step, a.micro.index, a.version):
                if not 0 <= value < _U32:
                    raise RoundingLogError(f"update {self.update}: {value} does not fit uint32")
            parts.append(_APPLIED.pack(a.micro.step, a.micro.index, a.version))
        parts.append(_COUNT.pack(len(self.lost)))
        parts += [_LOST.pack(lost.update, lost.leaf) for lost in self.lost]
        parts += [_COUNT.pack(len(inner)), inner]
        return b"".join(parts)


def is_envelope(data: bytes | memoryview) -> bool:
    """Whether chunk bytes are a schedule envelope."""
    return bytes(data[: len(MAGIC)]) == MAGIC


def open_envelope(data: bytes, *, step: int | None, spec_hash: bytes) -> tuple[ScheduleEntry, bytes]:
    """The entry and the inner chunk's bytes of an envelope; a malformed or foreign one is a
    :class:`ChunkFormatError` (:class:`ChunkMismatchError` for another step or task)."""
    where = f"step {step}" if step is not None else "step ?"
    if not is_envelope(data):
        raise ChunkFormatError(f"{where}: not a schedule envelope (bad magic or version)")
    view = memoryview(data)
    pos = len(MAGIC)

    def take(s: struct.Struct) -> tuple[Any, ...]:
        nonlocal pos
        if pos + s.size > len(view):
            raise ChunkFormatError(f"{where}: schedule envelope truncated at byte {pos}")
        out = s.unpack_from(view, pos)
        pos += s.size
        return out

    own_step, own_spec = take(_HEAD)
    where = check_chunk_identity(own_step, own_spec, step, spec_hash)
    (n_applied,) = take(_COUNT)
    if n_applied * _APPLIED.size > len(view) - pos:
        raise ChunkFormatError(f"{where}: schedule envelope truncated in its micro-batches")
    applied = tuple(Applied(MicroBatchId(s, j), v) for s, j, v in (take(_APPLIED) for _ in range(n_applied)))
    (n_lost,) = take(_COUNT)
    if n_lost * _LOST.size > len(view) - pos:
        raise ChunkFormatError(f"{where}: schedule envelope truncated in its lost updates")
    lost = tuple(LostUpdate(u, bytes(leaf)) for u, leaf in (take(_LOST) for _ in range(n_lost)))
    (size,) = take(_COUNT)
    if pos + size != len(view):
        raise ChunkFormatError(
            f"{where}: schedule envelope says its chunk has {size} bytes, {len(view) - pos} follow"
        )
    return ScheduleEntry(own_step, applied, lost), bytes(view[pos:])


class ScheduledLog:
    """A step's log chunk with its schedule entry, as the transcript writer takes it
    (:meth:`prepare`); ``log`` is the plain chunk (a ``StepLog`` or ``SparseStepLog``)."""

    def __init__(self, entry: ScheduleEntry, log: Any) -> None:
        self.entry = entry
        self.log = log
        self.format = log.format

    def prepare(self, step: int, spec_hash: bytes) -> PreparedChunk:
        if step != self.entry.update:
            raise RoundingLogError(
                f"the schedule of update {self.entry.update} was handed over as step {step}"
            )
        inner = self.log.prepare(step, spec_hash)
        return PreparedChunk(
            step, spec_hash, lambda: self.entry.envelope(spec_hash, inner.encode(step, spec_hash))
        )

    def encode(self, step: int, spec_hash: bytes) -> bytes:
        return self.prepare(step, spec_hash).encode(step, spec_hash)


def check_schedule(
    entries: Sequence[ScheduleEntry], *, accumulate: int, steps: int, max_staleness: int
) -> list[str]:
    """What is wrong with a whole run's schedule (empty when nothing): each entry on its own, and
    every micro-batch of steps ``1..steps`` applied exactly once over the run."""
    problems: list[str] = []
    for u, entry in enumerate(entries, start=1):
        if entry.update != u:
            problems.append(f"entry {u} is the schedule of update {entry.update}")
            continue
        try:
            entry.check(accumulate=accumulate, steps=steps, max_staleness=max_staleness)
        except ScheduleError as exc:
            problems.append(str(exc))
    seen = Counter(a.micro for entry in entries for a in entry.applied)
    twice = sorted(m for m, n in seen.items() if n > 1)
    never = [MicroBatchId(s, j) for s in range(1, steps + 1) for j in range(accumulate)]
    never = [m for m in never if m not in seen]
    if twice:
        problems.append(f"{len(twice)} micro-batches applied more than once, first {twice[0]}")
    if never:
        problems.append(f"{len(never)} micro-batches never applied, first {never[0]}")
    return problems


def repeated_in(entry: ScheduleEntry, earlier: ScheduleEntry) -> MicroBatchId | None:
    """The first micro-batch (in fold order) that ``entry`` applies and ``earlier`` applied too."""
    before = {a.micro for a in earlier.applied}
    return next((a.micro for a in entry.applied if a.micro in before), None)


def first_repeats(entries: Iterable[ScheduleEntry]) -> dict[int, tuple[MicroBatchId, int]]:
    """For each update that applies a micro-batch an earlier update of ``entries`` applied: that
    micro-batch (its first such, in fold order) and the first update that applied it."""
    first: dict[MicroBatchId, int] = {}
    out: dict[int, tuple[MicroBatchId, int]] = {}
    for entry in entries:
        for a in entry.applied:
            if a.micro in first:
                out.setdefault(entry.update, (a.micro, first[a.micro]))
        for a in entry.applied:
            first.setdefault(a.micro, entry.update)
    return out


def last_uses(entries: Iterable[ScheduleEntry]) -> dict[int, int]:
    """For each version a schedule computes on, the last update that needs it (a replay keeps a
    state only until then)."""
    out: dict[int, int] = {}
    for entry in entries:
        for v in entry.versions:
            out[v] = max(out.get(v, 0), entry.update)
    return out


__all__ = [
    "MAGIC",
    "Applied",
    "LostUpdate",
    "MicroBatchId",
    "ScheduleEntry",
    "ScheduleError",
    "ScheduledLog",
    "check_schedule",
    "first_repeats",
    "is_envelope",
    "last_uses",
    "open_envelope",
    "repeated_in",
]
