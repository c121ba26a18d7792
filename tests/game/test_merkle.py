"""The Merkle tree against a slow, literal transcription of RFC 6962 (MTH and PATH)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import MerkleError
from game.merkle import InclusionProof, MerkleTree, merkle_root, root_from_proof, verify_proof


def _largest_pow2_below(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    """RFC 6962 section 2.1, word for word."""
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = _largest_pow2_below(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    """RFC 6962 section 2.1.1 PATH(m, D[n])."""
    if len(d) == 1:
        return []
    k = _largest_pow2_below(len(d))
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def leaves(n: int, salt: int = 0) -> list[bytes]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).digest() for i in range(n)]


@pytest.mark.parametrize("n", [*range(1, 40), 64, 65, 100, 127, 128, 129])
def test_root_and_every_proof_match_rfc6962(n: int) -> None:
    d = leaves(n)
    tree = MerkleTree(d)
    assert tree.root == ref_mth(d) == merkle_root(d)
    for i in range(n):
        proof = tree.proof(i)
        assert list(proof.siblings) == ref_path(i, d)
        assert verify_proof(tree.root, d[i], proof)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_proof_rejects_wrong_leaf_index_or_length(n: int, data: st.DataObject) -> None:
    d = leaves(n, salt=n)
    tree = MerkleTree(d)
    i = data.draw(st.integers(0, n - 1))
    proof = tree.proof(i)
    assert not verify_proof(tree.root, hashlib.sha256(b"other").digest(), proof)
    if n > 1:
        j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
        assert not verify_proof(tree.root, d[i], InclusionProof(j, n, proof.siblings))
        assert not verify_proof(tree.root, d[i], InclusionProof(i, n, proof.siblings[:-1]))


def test_leaf_and_node_hashes_are_domain_separated() -> None:
    # A two-leaf tree's root must not verify as a leaf of a one-leaf tree (second-preimage guard).
    d = leaves(2)
    tree = MerkleTree(d)
    inner = tree.root
    assert merkle_root([hashlib.sha256(b"\x00" + d[0]).digest()]) != inner


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(MerkleError, match="at least one leaf"):
        MerkleTree([])
    with pytest.raises(MerkleError, match="32 bytes"):
        MerkleTree([b"short"])
    tree = MerkleTree(leaves(3))
    with pytest.raises(MerkleError, match="out of range"):
        tree.proof(3)
    with pytest.raises(MerkleError, match="longer"):
        root_from_proof(leaves(1)[0], InclusionProof(0, 1, (b"\x00" * 32,)))
