// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title Reenterer
/// @notice Test helper: a party (client, auditor) that calls back into the game from its `receive`,
///         so tests can show that `withdraw` pays each credit once and that nothing a receiver does
///         mid-transfer breaks the game's accounting. Not used by the game.
/// @dev    `forward` makes this contract the caller of any game function; `arm` sets a call to make
///         from `receive` on each of the next `times` ether receipts, with every attempt's result
///         recorded (a failing re-entry does not fail the outer transfer).
contract Reenterer {
    struct Attempt {
        bool ok;
        bytes returned;
    }

    address public target;
    bytes public reentryData;
    uint256 public reentryValue;
    uint256 public reentriesLeft;
    /// @notice Total ether received, and the number of receipts.
    uint256 public received;
    uint256 public receipts;
    Attempt[] internal _attempts;

    /// @notice Call `to` with `data` and `msg.value` as this contract; a revert is passed on as is.
    function forward(address to, bytes calldata data) external payable returns (bytes memory ret) {
        bool ok;
        (ok, ret) = to.call{value: msg.value}(data);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    /// @notice On each of the next `times` receipts, call `to` with `data` and `value` (from this
    ///         contract's balance).
    function arm(address to, bytes calldata data, uint256 value, uint256 times) external {
        target = to;
        reentryData = data;
        reentryValue = value;
        reentriesLeft = times;
    }

    function attemptCount() external view returns (uint256) {
        return _attempts.length;
    }

    function attempt(uint256 i) external view returns (bool ok, bytes memory returned) {
        Attempt storage a = _attempts[i];
        return (a.ok, a.returned);
    }

    receive() external payable {
        received += msg.value;
        ++receipts;
        if (reentriesLeft == 0) return;
        --reentriesLeft;
        (bool ok, bytes memory ret) = target.call{value: reentryValue}(reentryData);
        _attempts.push(Attempt(ok, ret));
    }
}
