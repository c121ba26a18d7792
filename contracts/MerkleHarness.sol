// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {MerkleProof} from "./MerkleProof.sol";

/// @title MerkleHarness
/// @notice Exposes the contract's Merkle code for Python-vs-Solidity test vectors. Not used by the game.
contract MerkleHarness {
    /// @notice The most leaves `root` accepts (bounds its loops).
    uint256 public constant MAX_LEAVES = 4096;

    /// @notice Thrown when `root` gets no leaves or more than MAX_LEAVES.
    error LeafCountOutOfRange(uint256 count);

    /// @notice sha256(0x00 || data).
    function leafHash(bytes32 data) external view returns (bytes32) {
        return MerkleProof.leafHash(data);
    }

    /// @notice sha256(0x01 || left || right).
    function nodeHash(bytes32 left, bytes32 right) external view returns (bytes32) {
        return MerkleProof.nodeHash(left, right);
    }

    /// @notice Root of the tree over `leaves`, built level by level (a lone last node is promoted).
    function root(bytes32[] calldata leaves) external view returns (bytes32) {
        uint256 n = leaves.length;
        if (n == 0 || n > MAX_LEAVES) revert LeafCountOutOfRange(n);
        bytes32[] memory level = new bytes32[](n);
        for (uint256 i = 0; i < n; ++i) {
            level[i] = MerkleProof.leafHash(leaves[i]);
        }
        while (n > 1) {
            uint256 half = n / 2;
            for (uint256 i = 0; i < half; ++i) {
                level[i] = MerkleProof.nodeHash(level[2 * i], level[2 * i + 1]);
            }
            if (n % 2 == 1) {
                level[half] = level[n - 1];
                n = half + 1;
            } else {
                n = half;
            }
        }
        return level[0];
    }

    /// @notice The root implied by a leaf and its proof, and whether the proof had a valid shape.
    function rootFromProof(uint64 index, uint64 size, bytes32 leaf, bytes32[] calldata proof)
        external
        view
        returns (bool ok, bytes32 computed)
    {
        return MerkleProof.rootFromProof(index, size, leaf, proof);
    }
}
