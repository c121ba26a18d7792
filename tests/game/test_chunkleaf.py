"""A log chunk's leaf: its pieces' tree bound to its length (game.chunkleaf), as the contract checks it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game import chunkleaf
from game.chunkleaf import PIECE_BYTES, answer, chunk_leaf, leaf_of_parts, piece_count, piece_tree, pieces
from game.merkle import InclusionProof, root_from_proof, verify_proof

SMALL = 8  # pieces of a few bytes, so that a property sees many pieces and every edge


@contextmanager
def small_pieces() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunkleaf, "PIECE_BYTES", SMALL)
        yield


def test_pieceCount_atTheEdges() -> None:
    assert [piece_count(n) for n in (0, 1, PIECE_BYTES - 1, PIECE_BYTES, PIECE_BYTES + 1)] == [1, 1, 1, 1, 2]
    assert piece_count(10 * PIECE_BYTES) == 10 and piece_count(10 * PIECE_BYTES + 1) == 11
    assert pieces(b"") == [b""]


@settings(max_examples=60, deadline=None)
@given(chunk=st.binary(max_size=9 * SMALL + 3), demanded=st.integers(0, 2**32 - 1))
def test_everyAnswer_provesItsPiece_andTheChunksLeaf_andThePiecesMakeTheChunk(
    chunk: bytes, demanded: int
) -> None:
    with small_pieces():
        _answers_hold(chunk, demanded)


def _answers_hold(chunk: bytes, demanded: int) -> None:
    count = piece_count(len(chunk))
    got = answer(chunk, demanded)
    assert got.piece == demanded % count and got.length == len(chunk)
    assert verify_proof(got.piece_root, hashlib.sha256(got.data).digest(), got.proof)
    assert got.proof.size == count  # the size the contract takes from the length
    assert leaf_of_parts(got.length, got.piece_root) == chunk_leaf(chunk)
    assert b"".join(answer(chunk, k).data for k in range(count)) == chunk
    assert answer(chunk, demanded + count).piece == got.piece  # a demand past the count wraps


def test_aPieceProvedInATreeOfAnotherSize_doesNotGiveTheCommittedLeaf() -> None:
    """Why the length is in the leaf: without it, a three-piece tree proves its third piece as the
    second of a two-piece tree, and a trainer keeping back the second piece would answer its demand."""
    with small_pieces():
        chunk = bytes(range(3 * SMALL))
        tree = piece_tree(chunk)
        third = hashlib.sha256(pieces(chunk)[2]).digest()
        forged = InclusionProof(index=1, size=2, siblings=tree.proof(2).siblings)  # (the first two's node)
        assert root_from_proof(third, forged) == tree.root  # the unbound root alone would take it
        assert leaf_of_parts(2 * SMALL, tree.root) != chunk_leaf(chunk)  # the bound leaf refuses it


@settings(max_examples=40, deadline=None)
@given(a=st.binary(max_size=4 * SMALL), b=st.binary(max_size=4 * SMALL))
def test_differentChunks_differentLeaves(a: bytes, b: bytes) -> None:
    with small_pieces():
        assert (chunk_leaf(a) == chunk_leaf(b)) == (a == b)


def test_aChunkOfManyRealPieces_answeredPieceByPiece() -> None:
    chunk = hashlib.sha256(b"seed").digest() * ((2 * PIECE_BYTES + 1000) // 32)
    assert piece_count(len(chunk)) == 3
    last = answer(chunk, 2)
    assert len(last.data) == len(chunk) - 2 * PIECE_BYTES
    assert [len(answer(chunk, k).data) for k in range(2)] == [PIECE_BYTES, PIECE_BYTES]
    assert leaf_of_parts(len(chunk), last.piece_root) == chunk_leaf(chunk)
