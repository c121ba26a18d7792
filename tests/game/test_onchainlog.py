"""A log as far as it is on-chain (game.onchainlog), and which of its pieces an auditor demands next
(game.protocol.solver.decide_log_demands), from the events a trainer's answers leave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from game.chain.types import TaskStatus
from game.chunkleaf import PIECE_BYTES, chunk_leaf, pieces
from game.merkle import merkle_root
from game.onchainlog import OnChainLog, OnChainLogError
from game.protocol.solver import DemandData, decide_log_demands
from tests.game.test_protocol import _task


@dataclass
class _Posted:
    index: int
    piece: int
    chunk_length: int
    data: bytes


class _Chain:
    def __init__(self, posted: list[_Posted]) -> None:
        self.posted = posted

    def get_events(self, name: str | None = None, *args: Any, **filters: Any) -> list[Any]:
        assert name == "DataProvided" and filters == {"task_id": 7}
        return list(self.posted)


CHUNKS = [b"", b"one piece", bytes(range(256)) * (2 * PIECE_BYTES // 256 + 3)]  # the last: 3 pieces
ROOT = merkle_root([chunk_leaf(c) for c in CHUNKS])


def _posted(index: int, piece: int) -> _Posted:
    return _Posted(index, piece, len(CHUNKS[index]), pieces(CHUNKS[index])[piece])


def test_missing_aChunkOfUnknownLengthItsFirstPiece_aKnownOneEveryPieceNotPosted() -> None:
    log = OnChainLog.read(_Chain([_posted(2, 1)]), 7, 3)
    assert log.missing() == [(0, 0), (1, 0), (2, 0), (2, 2)]
    assert log.total_pieces(per_chunk=3) == 9 and log.chunk(2) is None and log.chunks(ROOT) is None


def test_theWholeLogOnChain_givesTheChunks_heldToTheRoot() -> None:
    every = [_posted(i, k) for i, c in enumerate(CHUNKS) for k in range(len(pieces(c)))]
    log = OnChainLog.read(_Chain(every[::-1]), 7, 3)  # in any order
    assert log.missing() == [] and log.chunks(ROOT) == CHUNKS
    with pytest.raises(OnChainLogError, match="do not make the committed log root"):
        log.chunks(bytes(32))


def test_decideLogDemands_whatNoOpenDemandNames_atMostMaxOpen_whileAChallengeCanLand() -> None:
    t = _task(TaskStatus.COMMITTED, window_ends=1_000)
    missing = [(0, 0), (1, 0), (2, 0), (2, 2)]
    assert decide_log_demands(t, 10, missing, [(1, 0)], max_open=3) == [DemandData(0, 0), DemandData(2, 0)]
    assert decide_log_demands(t, 10, missing, [], max_open=16) == [DemandData(i, k) for i, k in missing]
    assert decide_log_demands(t, 10, missing, [(9, 9)] * 4, max_open=3) == []
    assert decide_log_demands(t, 999, missing, [], max_open=16) == []  # would land after the window
