"""The leaf (``vgame-leaf-v2``): streamed in any pieces it is the one-shot leaf, its levels have the
sizes the definition gives, it is the definition written out with hashlib, and a level of the wrong
size is refused."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.state import leafhash
from game.training.state.leafhash import (
    CHUNK,
    LeafStream,
    finish,
    leaf_of,
    level_sizes,
    next_level,
    reduce_to_final,
)

#: 129 chunks: 4,128 bytes of digests, more than a chunk, so three levels (the last 64 bytes).
THREE_LEVELS = 128 * CHUNK + 17
LENGTHS = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, THREE_LEVELS]


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from(LENGTHS),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(0, THREE_LEVELS), max_size=40),
)
def test_leafStream_inRandomPieces_isTheOneShotLeaf(n: int, seed: int, cuts: list[int]) -> None:
    """Pieces of any size, empty ones among them, cut anywhere (on a chunk's edge or not)."""
    data = _data(n, seed)
    edges = [0, *sorted(c % (n + 1) for c in cuts), n]
    pieces = [data[a:b] for a, b in itertools.pairwise(edges)]
    assert b"".join(pieces) == data
    stream = LeafStream()
    for piece in pieces:
        stream.update(piece)
    assert stream.digest() == leaf_of(data)


def test_leafStream_digestMidway_isTheLeafSoFar() -> None:
    """``digest`` leaves the stream as it was: more pieces may follow."""
    data = _data(THREE_LEVELS)
    stream = LeafStream().update(data[: CHUNK + 5])
    assert stream.digest() == leaf_of(data[: CHUNK + 5])
    assert stream.update(data[CHUNK + 5 :]).digest() == leaf_of(data)


@pytest.mark.parametrize(
    ("total", "sizes"),
    [
        (0, [0]),
        (CHUNK, [CHUNK]),
        (CHUNK + 1, [CHUNK + 1, 64]),
        (128 * CHUNK, [128 * CHUNK, CHUNK]),  # 128 digests fill one chunk exactly: two levels
        (THREE_LEVELS, [THREE_LEVELS, 129 * 32, 64]),
    ],
)
def test_levelSizes_areTheDefinitions(total: int, sizes: list[int]) -> None:
    assert level_sizes(total) == sizes
    assert leafhash.final_level_size(total) == sizes[-1]
    data = _data(total)
    level = data
    for size in sizes[1:]:
        level = next_level(level)
        assert len(level) == size
    assert reduce_to_final(data) == level


def test_leafOf_threeLevels_isTheDefinitionWrittenOut() -> None:
    """The definition with hashlib alone, level by level, on an input of three levels; and that
    leaf as a constant, for other implementations (a GPU's) to check against."""
    data = bytes(i % 251 for i in range(THREE_LEVELS))
    level_1 = b"".join(hashlib.sha256(data[i : i + 4096]).digest() for i in range(0, len(data), 4096))
    assert len(level_1) == 129 * 32 > 4096  # still more than a chunk: one more level
    level_2 = b"".join(hashlib.sha256(level_1[i : i + 4096]).digest() for i in range(0, len(level_1), 4096))
    assert len(level_2) == 64
    expected = hashlib.sha256(b"vgame-leaf-v2\x00" + len(data).to_bytes(8, "little") + level_2).digest()
    assert leaf_of(data) == expected
    assert expected.hex() == "f6bdb7871e08ce6e6b5ebd39469bb8c419fa4afd152ed40f6a9c2c561e07e2ac"


def test_leafOf_oneChunkOrLess_hashesTheBytesWithTheirLength() -> None:
    for data in (b"", b"the state", _data(CHUNK)):
        assert (
            leaf_of(data)
            == hashlib.sha256(b"vgame-leaf-v2\0" + len(data).to_bytes(8, "little") + data).digest()
        )


def test_leafOf_arraysAndViews_areTheirBytes() -> None:
    values = np.random.default_rng(1).standard_normal(3000).astype(np.float32)  # 12,000 bytes
    raw = values.tobytes()
    assert leaf_of(values) == leaf_of(memoryview(values)) == leaf_of(bytearray(raw)) == leaf_of(raw)


def test_leafOf_aLevelGivenAsTheState_isAnotherLeaf() -> None:
    """The length in the final hash keeps the digests of a level from passing for the state."""
    data = _data(THREE_LEVELS)
    assert leaf_of(next_level(data)) != leaf_of(data)
    assert leaf_of(data + b"\0") != leaf_of(data)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert leaf_of(flipped) != leaf_of(data)


@pytest.mark.parametrize(
    ("level", "total"),
    [
        (bytes(64), CHUNK),  # a whole chunk is its own last level
        (bytes(32), CHUNK + 1),  # two chunks end in two digests
        (bytes(CHUNK + 32), THREE_LEVELS),  # more than a chunk is not a last level
        (bytes(4), 5),
    ],
)
def test_finish_aLevelOfTheWrongSize_isRefused(level: bytes, total: int) -> None:
    with pytest.raises(ValueError, match="level"):
        finish(level, total)


def test_finish_theLastLevel_isTheLeaf() -> None:
    data = _data(THREE_LEVELS)
    assert finish(reduce_to_final(data), len(data)) == leaf_of(data)
