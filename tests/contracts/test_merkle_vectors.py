"""Python (game.merkle) and Solidity (MerkleProof.sol) agree on every root and proof (invariant 6)."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from game.merkle import InclusionProof, MerkleTree, leaf_hash, node_hash, root_from_proof, verify_proof
from tests.contracts.driver import Env, leaves

SIZES = [1, 2, 3, 4, 5, 8, 13, 1024]


def _check_all_proofs(env: Env, tree: MerkleTree, indices: list[int]) -> None:
    for i in indices:
        siblings = list(tree.proof(i).siblings)
        ok, root = env.harness.functions.rootFromProof(i, tree.size, tree.leaf(i), siblings).call()
        assert ok and root == tree.root, f"leaf {i} of {tree.size}"
        assert env.game.functions.verifyLeaf(tree.root, i, tree.size, tree.leaf(i), siblings).call()


def test_leafAndNodeHash_matchPython(env: Env) -> None:
    data = hashlib.sha256(b"x").digest()
    other = hashlib.sha256(b"y").digest()
    assert env.harness.functions.leafHash(data).call() == leaf_hash(data)
    assert env.harness.functions.nodeHash(data, other).call() == node_hash(data, other)
    # domain separation: a leaf hash is never the node hash of the same bytes
    assert leaf_hash(data) != hashlib.sha256(data).digest()


@pytest.mark.parametrize("n", SIZES)
def test_root_matchesPython(env: Env, n: int) -> None:
    data = leaves(n, tag=f"root{n}")
    assert env.harness.functions.root(data).call() == MerkleTree(data).root


@pytest.mark.parametrize("n", SIZES)
def test_everyProof_verifies(env: Env, n: int) -> None:
    tree = MerkleTree(leaves(n, tag=f"proof{n}"))
    indices = list(range(n)) if n <= 13 else [0, 1, 2, 511, 512, 513, 1000, 1022, 1023]
    _check_all_proofs(env, tree, indices)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 13])
def test_wrongIndexSizeOrSibling_rejected(env: Env, n: int) -> None:
    """Python and Solidity give the same verdict on every tampered proof, and reject all but a
    wrong size (a path can also fit a tree of another size: the contract always uses the committed N)."""
    tree = MerkleTree(leaves(n, tag=f"neg{n}"))
    for i in range(n):
        sib = list(tree.proof(i).siblings)
        leaf = tree.leaf(i)
        variants: list[tuple[int, int, bytes, list[bytes]]] = [
            (i, n, hashlib.sha256(leaf).digest(), sib),  # wrong leaf
            (i, n, leaf, [*sib, b"\x00" * 32]),  # too long
            (n, n, leaf, sib),  # index out of range
        ]
        if sib:
            variants.append((i, n, leaf, sib[:-1]))  # too short
            variants.append((i, n, leaf, [bytes([sib[0][0] ^ 1]) + sib[0][1:], *sib[1:]]))  # flipped sibling
        if n > 1:
            variants.append(((i + 1) % n, n, leaf, sib))  # wrong index
        for index, size, data, proof in variants:
            py = (
                verify_proof(tree.root, data, InclusionProof(index, size, tuple(proof)))
                if index < size
                else False
            )
            sol = env.game.functions.verifyLeaf(tree.root, index, size, data, proof).call()
            assert py == sol is False, (index, size)
        wrong_size = verify_proof(tree.root, leaf, InclusionProof(i, n + 1, tuple(sib)))
        assert env.game.functions.verifyLeaf(tree.root, i, n + 1, leaf, sib).call() == wrong_size


def test_proofLongerThanMax_rejected(env: Env) -> None:
    leaf = hashlib.sha256(b"deep").digest()
    proof = [hashlib.sha256(bytes([k])).digest() for k in range(65)]
    ok, root = env.harness.functions.rootFromProof(0, 2**64 - 1, leaf, proof).call()
    assert (ok, root) == (False, b"\x00" * 32)
    assert env.game.functions.MAX_PROOF_LENGTH().call() == 64


def test_maxDepthProof_accepted(env: Env) -> None:
    """64-sibling proofs (the bound) in a tree of 2^64 - 1 leaves are computed like Python."""
    leaf = hashlib.sha256(b"edge").digest()
    proof = tuple(hashlib.sha256(bytes([k])).digest() for k in range(64))
    size = 2**64 - 1
    for index in (0, 2**63, 2**63 + 12345):
        expected = root_from_proof(leaf, InclusionProof(index, size, proof))
        ok, root = env.harness.functions.rootFromProof(index, size, leaf, list(proof)).call()
        assert ok and root == expected


def test_rootOfNoLeaves_reverts(env: Env) -> None:
    assert env.reverts(env.harness.functions.root([]), env.outsider) == ("LeafCountOutOfRange", (0,))


@pytest.mark.embedded_only
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_randomTrees_agree(env: Env, n: int, seed: int) -> None:
    rng = random.Random(seed)
    data = [rng.randbytes(32) for _ in range(n)]
    tree = MerkleTree(data)
    assert env.harness.functions.root(data).call() == tree.root
    i = rng.randrange(n)
    _check_all_proofs(env, tree, [i])
    # a random other index or size: both sides agree (almost always: reject)
    j, m = rng.randrange(n), rng.randint(1, n + 2)
    sib = list(tree.proof(i).siblings)
    py = j < m and verify_proof(tree.root, tree.leaf(i), InclusionProof(j, m, tuple(sib)))
    assert env.game.functions.verifyLeaf(tree.root, j, m, tree.leaf(i), sib).call() == py
