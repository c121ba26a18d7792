"""A log chunk's leaf in the log tree: the root of a tree of the chunk's pieces, bound to its length.

Why pieces: an availability demand is answered on-chain, and one transaction carries at most about
128 KiB (a node's pool refuses more: geth's ``txMaxSize``). A whole chunk in one ``provideData`` capped
the chunks a trainer could defend at that size, and a GPT-2-size step logs megabytes. So a demand
names a chunk *and a piece of it*, and the trainer posts that piece alone with two proofs: the piece
in the chunk's piece tree, and the chunk's leaf in the committed log tree. The contract
(``VerificationGame.provideData``) checks exactly what this module computes:

* the chunk's bytes are cut into pieces of :data:`PIECE_BYTES` (the last may be shorter; an empty
  chunk is one empty piece);
* the piece tree is the project's Merkle tree (:mod:`game.merkle`) over ``sha256(piece)``;
* the leaf is ``sha256(uint64_be(len(chunk)) || piece_root)``. The length fixes the piece count,
  and with it the shape of the piece tree, so a trainer cannot pass one piece off as another by
  proving it in a tree of another size.

A demand's piece number is reduced modulo the chunk's piece count once the length is known
(:func:`piece_of`): an auditor that has never seen the chunk can demand any number.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from game.errors import MerkleError
from game.merkle import InclusionProof, MerkleTree

PIECE_BYTES = 120 * 1024  # with its proofs and the call's encoding, one provideData stays under 128 KiB
LEAF_LENGTH_BYTES = 8  # the chunk's length, big-endian, as Solidity's abi.encodePacked(uint64)


def piece_count(length: int) -> int:
    """How many pieces a chunk of ``length`` bytes is cut into (at least one)."""
    if length < 0:
        raise MerkleError(f"a chunk's length cannot be negative, got {length}")
    return max(1, -(-length // PIECE_BYTES))


def piece_of(demanded: int, length: int) -> int:
    """The piece a demand for piece ``demanded`` of a chunk of ``length`` bytes names."""
    return demanded % piece_count(length)


def _views(chunk: bytes) -> list[memoryview]:
    view = memoryview(chunk)
    return [view[i * PIECE_BYTES : (i + 1) * PIECE_BYTES] for i in range(piece_count(len(chunk)))]


def pieces(chunk: bytes) -> list[bytes]:
    """The chunk's pieces, in order."""
    return [bytes(v) for v in _views(chunk)]


def piece_tree(chunk: bytes) -> MerkleTree:
    """The tree over the pieces' SHA-256 (the leaf data, as the log tree's are the chunks' leaves).
    The pieces are hashed where they lie: a reader checks every chunk it reads by its leaf."""
    return MerkleTree([hashlib.sha256(v).digest() for v in _views(chunk)])


def leaf_of_parts(length: int, piece_root: bytes) -> bytes:
    """The log-tree leaf of a chunk of ``length`` bytes whose piece tree has root ``piece_root``."""
    if not 0 <= length < 1 << 64:
        raise MerkleError(f"a chunk's length must fit 64 bits, got {length}")
    return hashlib.sha256(length.to_bytes(LEAF_LENGTH_BYTES, "big") + piece_root).digest()


def chunk_leaf(chunk: bytes) -> bytes:
    """The chunk's leaf data in the log tree."""
    return leaf_of_parts(len(chunk), piece_tree(chunk).root)


@dataclass(frozen=True)
class PieceAnswer:
    """What a trainer posts to answer a demand for a piece of a chunk (less the log-tree proof)."""

    length: int  # the chunk's length
    piece_root: bytes
    piece: int  # the piece answered: the demanded number reduced by the piece count
    data: bytes
    proof: InclusionProof  # of sha256(data) in the piece tree


def answer(chunk: bytes, demanded: int) -> PieceAnswer:
    """The answer to a demand for piece ``demanded`` of ``chunk``."""
    tree = piece_tree(chunk)
    k = piece_of(demanded, len(chunk))
    return PieceAnswer(len(chunk), tree.root, k, bytes(_views(chunk)[k]), tree.proof(k))


__all__ = [
    "PIECE_BYTES",
    "PieceAnswer",
    "answer",
    "chunk_leaf",
    "leaf_of_parts",
    "piece_count",
    "piece_of",
    "piece_tree",
    "pieces",
]
