"""The contract's custom errors as Python exceptions, and decoding revert data into them.

Every ``error X(...)`` of ``VerificationGame.sol`` has a class here with the same name, rooted at
:class:`game.errors.VerificationGameError` and mixed with the builtin that says what kind of
problem it is (``NotYourTurn`` is a ``PermissionError``, ``ClockExpired`` a ``TimeoutError``).
The client raises the very same classes from its pre-checks, so a caller handles one exception
whether the contract or the pre-check refused. Typed arguments are attributes in snake_case
(``exc.game_id``, ``exc.phase``: enums decoded) and all of them are in ``exc.fields``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from eth_abi import decode as abi_decode
from eth_utils import to_checksum_address

from game.chain.artifacts import Artifact, abi_selector, abi_types, load_artifact
from game.chain.types import ENUMS, Outcome, Phase, TaskStatus
from game.errors import VerificationGameError

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake(name: str) -> str:
    """``taskId`` -> ``task_id`` (the Python spelling of a Solidity name)."""
    return _CAMEL.sub("_", name).lower()


class ContractError(VerificationGameError):
    """A refusal by the game contract (decoded from revert data, or predicted by a pre-check)."""

    #: Solidity parameter names (snake_case) in ABI order; the decoder fills them
    params: ClassVar[tuple[str, ...]] = ()
    #: Solidity enum behind a ``uint8`` parameter, by parameter name
    enum_params: ClassVar[dict[str, type]] = {}

    def __init__(self, *values: Any, message: str | None = None, **named: Any) -> None:
        if values and named:
            raise TypeError("pass the error's arguments either positionally or by name, not both")
        if values:
            if len(values) != len(self.params):
                raise TypeError(
                    f"{type(self).__name__} takes {len(self.params)} arguments, got {len(values)}"
                )
            named = dict(zip(self.params, values, strict=True))
        elif set(named) != set(self.params):
            raise TypeError(f"{type(self).__name__} takes {self.params}, got {tuple(named)}")
        for key, enum in self.enum_params.items():
            named[key] = enum(named[key])
        self.fields: dict[str, Any] = {k: named[k] for k in self.params}
        for key, value in self.fields.items():
            setattr(self, key, value)
        shown = ", ".join(f"{k}={_show(v)}" for k, v in self.fields.items())
        super().__init__(f"{type(self).__name__}({shown})" + (f": {message}" if message else ""))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.fields == getattr(other, "fields", None)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(self.fields.items())))


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, ENUMS_TUPLE):
        return value.name
    return str(value)


ENUMS_TUPLE = tuple(ENUMS.values())


# ---------------------------------------------------------------------------------- the errors
class ZeroPayment(ContractError, ValueError):
    """``createTask`` sent no payment."""


class InvalidRoles(ContractError, ValueError):
    """Trainer or judge is the zero address, or they are the same."""

    params = ("trainer", "judge")


class InvalidDurations(ContractError, ValueError):
    """A clock allowance, challenge window or judge window of zero seconds."""

    params = ("clock_allowance", "challenge_window", "judge_window")


class TaskNotFound(ContractError, LookupError):
    params = ("task_id",)


class GameNotFound(ContractError, LookupError):
    params = ("game_id",)


class WrongTaskStatus(ContractError):
    """The task's status does not allow this call (e.g. commit twice, cancel after commit)."""

    params = ("task_id", "status")
    enum_params: ClassVar[dict[str, type]] = {"status": TaskStatus}


class Unauthorized(ContractError, PermissionError):
    """The caller is not the role this call belongs to."""

    params = ("caller", "expected")


class ChallengerNotAllowed(ContractError, PermissionError):
    """The task's trainer or judge tried to challenge it."""

    params = ("caller",)


class WrongBond(ContractError, ValueError):
    params = ("sent", "required")


class InvalidLeafCount(ContractError, ValueError):
    params = ("num_leaves",)


class InvalidProof(ContractError, ValueError):
    """A Merkle proof does not lead to the committed root."""

    params = ("index", "leaf")


class WindowClosed(ContractError, TimeoutError):
    """Challenge at or after the end of the challenge window."""

    params = ("task_id", "window_ends")


class WindowOpen(ContractError):
    """Finalize before the challenge window ended."""

    params = ("task_id", "window_ends")


class GamesLive(ContractError):
    """Finalize while games of the task are still being played."""

    params = ("task_id", "live_games")


class NothingToBisect(ContractError, ValueError):
    """A bisection challenge against a one-leaf commitment."""

    params = ("task_id",)


class GameOver(ContractError):
    """A move, ruling or timeout on a game that has ended."""

    params = ("game_id", "outcome")
    enum_params: ClassVar[dict[str, type]] = {"outcome": Outcome}


class NotYourTurn(ContractError, PermissionError):
    """The game's phase does not accept this move."""

    params = ("game_id", "phase")
    enum_params: ClassVar[dict[str, type]] = {"phase": Phase}


class ClockExpired(ContractError, TimeoutError):
    """The mover's clock (or the judge's window) ran out; someone may call ``timeout``."""

    params = ("game_id", "deadline")


class ClockRunning(ContractError):
    """``timeout`` before the deadline passed."""

    params = ("game_id", "deadline")


class NothingToWithdraw(ContractError, LookupError):
    params = ("account",)


class TransferFailed(ContractError):
    """The receiver of a withdrawal reverted."""

    params = ("account", "amount")


class UnknownContractError(ContractError):
    """A custom error this module has no class for (the ABI grew): name and raw fields kept."""


class RevertedWithReason(ContractError):
    """``revert("...")`` / ``require(..., "...")``: the contract uses none, but a node may."""

    params = ("reason",)


class ContractPanic(ContractError, ArithmeticError):
    """``Panic(uint256)``: an assert, overflow or bounds failure, i.e. a contract bug."""

    params = ("code",)


class EmptyRevert(ContractError):
    """A revert without data (out of gas, invalid opcode, a call to a non-contract)."""


ERROR_CLASSES: dict[str, type[ContractError]] = {
    cls.__name__: cls
    for cls in (
        ZeroPayment,
        InvalidRoles,
        InvalidDurations,
        TaskNotFound,
        GameNotFound,
        WrongTaskStatus,
        Unauthorized,
        ChallengerNotAllowed,
        WrongBond,
        InvalidLeafCount,
        InvalidProof,
        WindowClosed,
        WindowOpen,
        GamesLive,
        NothingToBisect,
        GameOver,
        NotYourTurn,
        ClockExpired,
        ClockRunning,
        NothingToWithdraw,
        TransferFailed,
    )
}

_ERROR_STRING = bytes.fromhex("08c379a0")  # Error(string)
_PANIC = bytes.fromhex("4e487b71")  # Panic(uint256)


class ErrorDecoder:
    """Selector -> (class, ABI types) for one contract ABI."""

    def __init__(self, artifact: Artifact | None = None) -> None:
        art = artifact or load_artifact()
        self._by_selector: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for entry in art.items("error"):
            names = [snake(i["name"]) for i in entry.get("inputs", [])]
            self._by_selector[abi_selector(entry)] = (entry["name"], abi_types(entry), names)

    def decode(self, data: bytes) -> ContractError:
        """The exception the contract meant by reverting with ``data``."""
        if len(data) < 4:
            return EmptyRevert()
        selector, body = data[:4], data[4:]
        if selector == _ERROR_STRING:
            return RevertedWithReason(abi_decode(["string"], body)[0])
        if selector == _PANIC:
            return ContractPanic(abi_decode(["uint256"], body)[0])
        known = self._by_selector.get(selector)
        if known is None:
            return UnknownContractError(
                message=f"unknown error selector 0x{selector.hex()} (data 0x{body.hex()})"
            )
        name, types, names = known
        values = [_py(t, v) for t, v in zip(types, abi_decode(types, body), strict=True)]
        cls = ERROR_CLASSES.get(name)
        if cls is None:
            exc = UnknownContractError(message=f"{name}({', '.join(map(_show, values))})")
            exc.fields = dict(zip(names, values, strict=True))
            return exc
        return cls(*values)


def _py(abi_type: str, value: Any) -> Any:
    if abi_type == "address":
        return to_checksum_address(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value


_default: ErrorDecoder | None = None


def decode_revert(data: bytes) -> ContractError:
    """Decode revert ``data`` of the VerificationGame contract (decoder built once, lazily)."""
    global _default
    if _default is None:
        _default = ErrorDecoder()
    return _default.decode(data)
