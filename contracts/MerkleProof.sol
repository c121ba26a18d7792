// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title MerkleProof
/// @notice The project's Merkle tree (docs/architecture.md, game/merkle.py): RFC 6962 shape,
///         leaf node = sha256(0x00 || data), inner node = sha256(0x01 || left || right), inclusion
///         proofs verified with RFC 9162 section 2.1.3.2 from (index, size) alone.
/// @dev Hashing calls the sha256 precompile (address 2) directly, hence `view` rather than `pure`.
///      Every loop is bounded: a proof longer than MAX_PROOF_LENGTH is rejected before hashing, and
///      the inner shift loop runs at most 64 times in total because it shifts a uint64 to zero.
library MerkleProof {
    /// @notice The longest proof accepted: a tree of at most 2^64 leaves is at most 64 levels deep.
    uint256 internal constant MAX_PROOF_LENGTH = 64;

    /// @notice Hash of a leaf node: sha256(0x00 || data).
    function leafHash(bytes32 data) internal view returns (bytes32 h) {
        // slither-disable-next-line assembly (the sha256 precompile on scratch memory, see @dev)
        assembly ("memory-safe") {
            // Scratch memory past the free pointer; the pointer is not moved (nothing is kept there).
            let m := mload(0x40)
            mstore8(m, 0x00)
            mstore(add(m, 1), data)
            if iszero(staticcall(gas(), 0x02, m, 33, 0x00, 0x20)) { revert(0, 0) }
            h := mload(0x00)
        }
    }

    /// @notice Hash of an inner node: sha256(0x01 || left || right).
    function nodeHash(bytes32 left, bytes32 right) internal view returns (bytes32 h) {
        // slither-disable-next-line assembly (the sha256 precompile on scratch memory, see @dev)
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore8(m, 0x01)
            mstore(add(m, 1), left)
            mstore(add(m, 33), right)
            if iszero(staticcall(gas(), 0x02, m, 65, 0x00, 0x20)) { revert(0, 0) }
            h := mload(0x00)
        }
    }

    /// @notice Root implied by `leaf` at `index` of a tree of `size` leaves and its sibling path.
    /// @dev The RFC 9162 2.1.3.2 loop of game/merkle.py `root_from_proof`, in assembly because it is
    ///      the hot path of every bisection move (about 200 gas per sibling instead of 700).
    /// @return ok False when the index is out of range or the proof has the wrong length.
    /// @return root The recomputed root (zero when not ok).
    function rootFromProof(uint64 index, uint64 size, bytes32 leaf, bytes32[] calldata proof)
        internal
        view
        returns (bool ok, bytes32 root)
    {
        if (index >= size || proof.length > MAX_PROOF_LENGTH) return (false, bytes32(0));
        root = leafHash(leaf);
        // slither-disable-next-line assembly (the sha256 precompile on scratch memory, see @dev)
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore8(m, 0x01) // node prefix; the two 32-byte words go at m + 1 and m + 33
            let m1 := add(m, 1)
            let fn := index
            let sn := sub(size, 1)
            ok := 1
            for {
                let p := proof.offset
                let end := add(p, shl(5, proof.length))
            } lt(p, end) { p := add(p, 0x20) } {
                // A proof longer than the tree is deep.
                if iszero(sn) {
                    ok := 0
                    break
                }
                // isRight = 1: we are a right child or the right-most node, the sibling goes left.
                let isRight := or(and(fn, 1), eq(fn, sn))
                mstore(add(m1, shl(5, isRight)), root)
                mstore(add(m1, shl(5, iszero(isRight))), calldataload(p))
                if iszero(staticcall(gas(), 0x02, m, 65, 0x00, 0x20)) { revert(0, 0) }
                root := mload(0x00)
                // A right-most node without a sibling was promoted on the levels above: skip them
                // (at most 64 shifts in all, since fn is a uint64). Never runs for a left child.
                if iszero(and(fn, 1)) {
                    if isRight {
                        for {} iszero(or(and(fn, 1), iszero(fn))) {} {
                            fn := shr(1, fn)
                            sn := shr(1, sn)
                        }
                    }
                }
                fn := shr(1, fn)
                sn := shr(1, sn)
            }
            // A proof shorter than the tree is deep.
            if sn { ok := 0 }
        }
        if (!ok) root = bytes32(0);
    }

    /// @notice True when `leaf` is leaf `index` of the tree of `size` leaves with `root`.
    function verify(bytes32 root, uint64 index, uint64 size, bytes32 leaf, bytes32[] calldata proof)
        internal
        view
        returns (bool)
    {
        (bool ok, bytes32 computed) = rootFromProof(index, size, leaf, proof);
        return ok && computed == root;
    }
}
