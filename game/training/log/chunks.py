"""What both chunk formats share: the errors, a record, the chunk's identity check, the chunk hash,
a chunk prepared for the writer's thread and the cursor that hands records to a replay.

Why a module of its own: the packed format (:mod:`~game.training.log.packed`) and the sparse one
(:mod:`~game.training.log.sparse`) both build on these, and neither needs the other. A chunk names
its step and its task (the spec hash), so a reordered or foreign chunk is caught when decoded
(:func:`check_chunk_identity`); ``chunk_hash`` is the leaf data of the log tree whichever the
format (:mod:`game.chunkleaf`: the root of the chunk's pieces' tree, bound to its length).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from game.chunkleaf import chunk_leaf
from game.errors import RoundingLogError
from game.training.log.codec import Compressible

_Item = TypeVar("_Item")

HASH_SIZE = 32  # a spec hash, a chunk hash


class ChunkFormatError(RoundingLogError, ValueError):
    """A chunk is truncated, has trailing bytes, a bad magic or a malformed record."""


class ChunkMismatchError(RoundingLogError):
    """A well-formed chunk that belongs elsewhere: another step (reordered) or another task (foreign)."""


class LogSequenceError(RoundingLogError):
    """The replaying computation's ops do not match the log's records (name, count, too few, too many)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One rounded inexact tensor: the op's index within the step, its ATen name, its value count."""

    op_index: int
    op_name: str
    count: int


def step_label(step: int | None) -> str:
    """The ``step N`` (``step ?`` when unknown) that error messages about a chunk start with."""
    return f"step {step}" if step is not None else "step ?"


def check_chunk_identity(own_step: int, own_spec: bytes, step: int | None, spec_hash: bytes) -> str:
    """Raise ChunkMismatchError when a chunk names another step (reordered) or task (foreign);
    returns the ``step N`` that error messages about the chunk start with."""
    if step is not None and own_step != step:
        raise ChunkMismatchError(f"step {step}: chunk is the log of step {own_step} (reordered chunk)")
    if own_spec != bytes(spec_hash):
        raise ChunkMismatchError(
            f"step {own_step}: chunk belongs to task {own_spec.hex()[:16]}..., not "
            f"{bytes(spec_hash).hex()[:16]}... (foreign chunk)"
        )
    return f"step {own_step}"


def chunk_hash(data: bytes) -> bytes:
    """The chunk's leaf data in the log tree: the root of its pieces' tree bound to its length
    (:func:`game.chunkleaf.chunk_leaf`), so that an availability demand is answered a piece at a time."""
    return chunk_leaf(data)


@dataclass(frozen=True, slots=True)
class BuildLater:
    """A :class:`Compressible` chunk whose payload is built by whoever first asks for it
    (:attr:`PreparedChunk.compressible`): a large sparse log's, which the writer's thread builds
    (:meth:`SparseStepLog.prepare <game.training.log.sparse.SparseStepLog.prepare>` says when)."""

    build: Callable[[], Compressible]


class PreparedChunk:
    """A step's chunk as far as :meth:`StepLog.prepare` or :meth:`SparseStepLog.prepare` built it on
    the caller's thread; :meth:`encode` finishes it (the transcript writer's thread compresses it and
    packs its header). Why: that thread shares the GIL with the trainer's, and a few hundred
    microseconds of its Python made the trainer's thread wait for the GIL several times a step,
    where the same work costs the trainer's thread 40 to 70 us done there at once
    (docs/benchmarks.md). ``finish`` is what is left to do, or a :class:`Compressible` chunk (a
    sparse one), which the writer's C call can finish without Python (:attr:`compressible`), or
    one to build first (:class:`BuildLater`: a payload of millions of entries, whose building
    would hold the caller's thread for milliseconds while the GIL is free beside it)."""

    __slots__ = ("_finish", "spec_hash", "step")

    def __init__(
        self, step: int, spec_hash: bytes, finish: Callable[[], bytes] | Compressible | BuildLater
    ) -> None:
        self.step = step
        self.spec_hash = bytes(spec_hash)
        self._finish = finish

    @property
    def compressible(self) -> Compressible | None:
        """The chunk as a head and a payload to compress, when it is one (built now if it was
        left to build, on the thread that asks)."""
        if isinstance(self._finish, BuildLater):
            self._finish = self._finish.build()
        return self._finish if isinstance(self._finish, Compressible) else None

    def encode(self, step: int, spec_hash: bytes) -> bytes:
        """The chunk bytes; ``step`` and ``spec_hash`` must be the ones it was prepared for."""
        self.check_for(step, spec_hash)
        compressible = self.compressible
        if compressible is not None:
            return compressible.finish()
        assert callable(self._finish)
        return self._finish()

    def check_for(self, step: int, spec_hash: bytes) -> None:
        """Refuse a step or a task other than the ones the chunk was prepared for."""
        if step != self.step or bytes(spec_hash) != self.spec_hash:
            raise RoundingLogError(
                f"a chunk prepared for step {self.step} of task {self.spec_hash.hex()[:16]}... was asked "
                f"for as step {step} of task {bytes(spec_hash).hex()[:16]}..."
            )


class EncodedChunk:
    """A chunk whose bytes another process encoded (a parameter server's update), handed to the
    transcript writer as they are: :meth:`prepare` gives them back for the step they were made for."""

    def __init__(self, step: int, data: bytes, format: str) -> None:
        self.step = step
        self.data = bytes(data)
        self.format = format

    def prepare(self, step: int, spec_hash: bytes) -> PreparedChunk:
        if step != self.step:
            raise RoundingLogError(f"the chunk of step {self.step} was handed over as step {step}")
        data = self.data
        return PreparedChunk(step, spec_hash, lambda: data)


class Heads(NamedTuple):
    """What a cursor checks of each record, in order, without the records themselves."""

    op_indices: list[int]
    op_names: list[str]
    counts: list[int]


class RecordCursor(Generic[_Item]):
    """The auditor's view of a log: records taken in order, each checked against the op asking.

    Shared by both formats: ``items[i]`` is what record ``i`` carries (trits, or sparse entries).
    """

    def __init__(self, step: int | None, records: Sequence[LogRecord], items: Sequence[_Item]) -> None:
        self._step = step
        self._lists: tuple[list[LogRecord], list[_Item]] | None = (list(records), list(items))
        self._load: Callable[[], tuple[Sequence[LogRecord], Sequence[_Item]]] | None = None
        self._heads: Callable[[], Heads] | Heads | None = None
        self._count = len(records)
        self._pos = 0

    @classmethod
    def later(
        cls,
        step: int | None,
        count: int,
        load: Callable[[], tuple[Sequence[LogRecord], Sequence[_Item]]],
        heads: Callable[[], Heads] | None = None,
    ) -> RecordCursor[_Item]:
        """A cursor over ``count`` records that ``load`` gives only when one is read: a replay the C++
        front runs reads none of them here, only moves the cursor. ``heads`` gives what
        :meth:`check` compares without the records (a deferred replay has their entries on the
        device already, so it reads none of them either)."""
        cursor = cls(step, (), ())
        cursor._lists, cursor._load, cursor._count, cursor._heads = None, load, count, heads
        return cursor

    @property
    def _records(self) -> list[LogRecord]:
        return self._loaded()[0]

    @property
    def _items(self) -> list[_Item]:
        return self._loaded()[1]

    def _loaded(self) -> tuple[list[LogRecord], list[_Item]]:
        if self._lists is None:
            assert self._load is not None
            records, items = self._load()
            self._lists, self._load = (list(records), list(items)), None
            if len(records) != self._count:
                raise LogSequenceError(f"{step_label(self._step)}: the log changed under its cursor")
        return self._lists

    @property
    def position(self) -> int:
        """Number of records taken so far."""
        return self._pos

    def move_to(self, position: int) -> None:
        """Count records taken elsewhere, in order (the C++ front's kernels check each against its
        op as :meth:`take` does)."""
        if not self._pos <= position <= self._count:
            raise LogSequenceError(
                f"{step_label(self._step)}: cursor moved from record {self._pos} to {position} of {self._count}"
            )
        self._pos = position

    def _head(self, i: int) -> tuple[int, str, int]:
        """Record ``i``'s op index, op name and value count: from the heads while the records are
        not loaded (and the heads are there), else from the record."""
        if self._lists is None and self._heads is not None:
            if callable(self._heads):
                self._heads = self._heads()
                if len(self._heads.op_indices) != self._count:
                    raise LogSequenceError(f"{step_label(self._step)}: the log changed under its cursor")
            h = self._heads
            return h.op_indices[i], h.op_names[i], h.counts[i]
        rec = self._records[i]
        return rec.op_index, rec.op_name, rec.count

    def check(self, op_index: int, op_name: str, numel: int) -> int:
        """Take the next record without its payload, after checking it was recorded for this op;
        its index (:meth:`item` gives the payload, should it be needed after all)."""
        if self._pos >= self._count:
            raise LogSequenceError(
                f"{step_label(self._step)}: op #{op_index} {op_name} ({numel} values) is past the end "
                f"of the log ({self._count} records)"
            )
        index, name, count = self._head(self._pos)
        if index != op_index or name != op_name:
            raise LogSequenceError(
                f"{step_label(self._step)}: op #{op_index} {op_name} does not match log record "
                f"{self._pos} (op #{index} {name})"
            )
        if count != numel:
            raise LogSequenceError(
                f"{step_label(self._step)}: op #{op_index} {op_name} has {numel} values but log "
                f"record {self._pos} has {count}"
            )
        self._pos += 1
        return self._pos - 1

    def take(self, op_index: int, op_name: str, numel: int) -> _Item:
        """The next record's payload, after checking it was recorded for this op."""
        return self._items[self.check(op_index, op_name, numel)]

    def item(self, i: int) -> _Item:
        """Record ``i``'s payload."""
        return self._items[i]

    def finish(self) -> None:
        """Raise when records remain unread: the replay ran fewer ops than the trainer logged."""
        if self._pos < self._count:
            rec = self._records[self._pos]
            raise LogSequenceError(
                f"{step_label(self._step)}: {self._count - self._pos} log records left unread, "
                f"first: record {self._pos} (op #{rec.op_index} {rec.op_name})"
            )
