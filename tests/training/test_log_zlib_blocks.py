"""A large payload's zlib in blocks (``codec.ZLIB_BLOCK``): one ordinary zlib stream that any inflate
decodes, the same bytes on any number of threads, and what the writer uses above ``ZLIB_BEST_MAX``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from game.training.log import codec
from game.training.log.codec import ZLIB_BEST_MAX, ZLIB_BLOCK, Malformed
from game.training.log.formats import decode_chunk
from tests.training.helpers import ZLIB_BLOCK_CASES, random_sparse_log

SPEC = bytes(range(32))


def _sparse_like(size: int, seed: int = 0) -> bytes:
    """Bytes like a sparse payload's varints: mostly small, a few large."""
    rng = np.random.default_rng(seed)
    out = rng.geometric(0.3, size=size).astype(np.uint8)
    out[::53] = rng.integers(128, 256, size=out[::53].size, dtype=np.uint8)
    return out.tobytes()


@settings(max_examples=80, deadline=None)
@given(case=ZLIB_BLOCK_CASES)
def test_blocks_decodeToThePayload_withTheSameBytesOnAnyThreads(case: tuple[bytes, int, int, int]) -> None:
    payload, block, level, threads = case
    one = codec.zlib_blocks(payload, level, block)
    assert codec.zlib_blocks(payload, level, block, max(threads, 2)) == one
    assert zlib.decompress(one) == payload
    assert codec.decompress(one, "zlib", len(payload)) == payload
    if block >= len(payload):  # a single block is zlib's own stream
        assert one == zlib.compress(payload, level)


@pytest.mark.parametrize("level", range(10))
def test_theHeader_isTheOneZlibWrites(level: int) -> None:
    assert codec.zlib_header(level) == zlib.compress(b"x", level)[:2]


def test_aPayloadAboveZlibBestMax_isWrittenInBlocks_belowItInOnePiece() -> None:
    small, large = _sparse_like(ZLIB_BEST_MAX), _sparse_like(ZLIB_BEST_MAX + 300_001, seed=1)
    assert codec.compress_with(small, "zlib") == zlib.compress(small, 9)
    blocked = codec.compress_with(large, "zlib")
    assert blocked == codec.zlib_blocks(large, codec.ZLIB_LEVEL_LARGE, ZLIB_BLOCK)
    assert blocked != zlib.compress(large, codec.ZLIB_LEVEL_LARGE)  # not one piece
    assert codec.decompress(blocked, "zlib", len(large)) == large
    assert len(blocked) <= len(zlib.compress(large, codec.ZLIB_LEVEL_LARGE)) * 1.002  # as small


def test_aBlockedPayload_stillHasItsChecksum() -> None:
    payload = _sparse_like(5000)
    body = bytearray(codec.zlib_blocks(payload, 1, 1000))
    body[-1] ^= 1  # the whole payload's Adler-32
    with pytest.raises(Malformed, match="corrupt"):
        codec.decompress(bytes(body), "zlib", len(payload))
    body[-1] ^= 1
    body[len(body) // 2] ^= 0x40  # inside a block
    with pytest.raises(Malformed):
        codec.decompress(bytes(body), "zlib", len(payload))


def test_aSparseChunkAboveZlibBestMax_decodesToItsLog() -> None:
    log = random_sparse_log(
        5, codec="zlib", records=4, seed=3, max_count=2_000_000, max_entries=600_000, index_stride=2
    )
    prepared = log.prepare(5, SPEC)
    assert prepared.compressible is not None and len(prepared.compressible.payload) > ZLIB_BEST_MAX
    back = decode_chunk(prepared.compressible.finish(), SPEC, 5)
    assert back.records == log.records
    assert all(
        torch.equal(x.positions, y.positions) for x, y in zip(back.entries(), log.entries(), strict=True)
    )
