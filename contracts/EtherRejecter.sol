// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @notice The part of the game's interface the rejecter calls.
interface IVerificationGameClient {
    function createTask(
        bytes32 specHash,
        bytes32 keyHash,
        address trainer,
        address judge,
        uint64 numLeaves,
        uint128 trainerBond,
        uint128 auditorBond,
        uint32 clockAllowance,
        uint32 challengeWindow,
        uint32 judgeWindow,
        uint32 commitWindow
    ) external payable returns (uint256 taskId);
    function cancel(uint256 taskId) external;
    function withdraw() external;
}

/// @title EtherRejecter
/// @notice Test helper: a client contract that refuses ether, so `withdraw` must revert TransferFailed
///         and keep its credit. Not used by the game.
contract EtherRejecter {
    /// @notice Thrown on every incoming ether transfer.
    error EtherRejected(uint256 value);

    /// @notice Create a task on `game` with this contract as the client, then cancel it.
    function createAndCancel(IVerificationGameClient game, address trainer, address judge)
        external
        payable
        returns (uint256 taskId)
    {
        taskId = game.createTask{value: msg.value}(bytes32(0), bytes32(0), trainer, judge, 2, 1, 1, 1, 1, 1, 1);
        game.cancel(taskId);
    }

    /// @notice Withdraw this contract's credit from `game` (fails: this contract rejects ether).
    function withdrawFrom(IVerificationGameClient game) external {
        game.withdraw();
    }

    receive() external payable {
        revert EtherRejected(msg.value);
    }
}
