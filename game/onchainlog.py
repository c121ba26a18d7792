"""A task's rounding log as far as the trainer has posted it on-chain, piece by piece.

Why: a trainer that withholds its transcript but answers availability demands held its data, and
before this an auditor could only wait for the store, so a trainer that trained wrong and kept its
transcript back was paid. Every piece it posts is public in ``DataProvided`` and verified against
the committed log root, so an auditor can demand the log's every piece and replay from the chain
(:mod:`auditor_node.chainlog`), and the judge can take the pinned step's chunk from there
(:mod:`game.judge`). This module reads what the chain holds and says what is missing; the rules
of a chunk's leaf are :mod:`game.chunkleaf`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from game.chunkleaf import PIECE_BYTES, chunk_leaf, piece_count
from game.errors import VerificationGameError
from game.merkle import MerkleTree


class OnChainLogError(VerificationGameError):
    """The pieces on-chain do not make the committed log (they cannot, unless the chain is not the
    one the task was committed on)."""


class _Events(Protocol):
    def get_events(self, name: str | None = None, *args: Any, **filters: Any) -> list[Any]: ...


@dataclass
class OnChainLog:
    """The pieces of a task's log chunks that are on-chain, by chunk and piece."""

    num_leaves: int
    lengths: dict[int, int] = field(default_factory=dict)  # chunk -> its length, once a piece is posted
    pieces: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (chunk, piece) -> bytes

    @classmethod
    def read(cls, client: _Events, task_id: int, num_leaves: int) -> OnChainLog:
        """Every piece the trainer of ``task_id`` has posted (its ``DataProvided`` events)."""
        found = cls(num_leaves)
        for ev in client.get_events("DataProvided", task_id=task_id):
            found.lengths[ev.index] = ev.chunk_length
            found.pieces[(ev.index, ev.piece)] = bytes(ev.data)
        return found

    def missing(self) -> list[tuple[int, int]]:
        """The (chunk, piece) pairs not posted yet, in order: a chunk whose length is not known yet
        is missing its first piece (whose answer makes the length, and so the count, known)."""
        out: list[tuple[int, int]] = []
        for index in range(self.num_leaves):
            length = self.lengths.get(index)
            count = 1 if length is None else piece_count(length)
            out += [(index, k) for k in range(count) if (index, k) not in self.pieces]
        return out

    def total_pieces(self, per_chunk: int) -> int:
        """How many pieces the whole log has, counting ``per_chunk`` for a chunk of unknown length."""
        return sum(
            per_chunk if self.lengths.get(i) is None else piece_count(self.lengths[i])
            for i in range(self.num_leaves)
        )

    def chunk(self, index: int) -> bytes | None:
        """Chunk ``index`` when all its pieces are on-chain, else None."""
        length = self.lengths.get(index)
        if length is None:
            return None
        parts = [self.pieces.get((index, k)) for k in range(piece_count(length))]
        if any(p is None for p in parts):
            return None
        data = b"".join(p for p in parts if p is not None)
        if len(data) != length:
            raise OnChainLogError(
                f"the pieces of chunk {index} make {len(data)} bytes, its length is {length}"
            )
        return data

    def chunks(self, log_root: bytes) -> list[bytes] | None:
        """Every chunk, held to ``log_root``, when the whole log is on-chain; else None."""
        out = [self.chunk(i) for i in range(self.num_leaves)]
        if any(c is None for c in out):
            return None
        whole = [c for c in out if c is not None]
        if MerkleTree([chunk_leaf(c) for c in whole]).root != log_root:
            raise OnChainLogError("the chunks posted on-chain do not make the committed log root")
        return whole


__all__ = ["PIECE_BYTES", "OnChainLog", "OnChainLogError"]
