"""The contract's custom errors as Python exceptions, and decoding revert data into them.

Every ``error X(...)`` of ``VerificationGame.sol`` has a class here with the same name, rooted at
:class:`game.errors.VerificationGameError` and mixed with the builtin that says what kind of
problem it is (``NotYourTurn`` is a ``PermissionError``, ``ClockExpired`` a ``TimeoutError``).
The client raises the very same classes from its pre-checks, so a caller handles one exception
whether the contract or the pre-check refused. Typed arguments are attributes in snake_case
(``exc.game_id``, ``exc.phase``: enums decoded) and all of them are in ``exc.fields``. The message
is that raw form, ``WrongTaskStatus(task_id=1, status=OPEN)``, for scripts and logs, then what the
refusal means for a person (the class's ``explain``). The CLI and the nodes print
:meth:`ContractError.for_people` instead: the meaning first, the raw form after it.
Backends and the sender raise the raw form first, :class:`Reverted` with the revert bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from eth_abi import decode as abi_decode
from eth_utils import to_checksum_address

from game.chain.artifacts import Artifact, abi_selector, abi_types, load_artifact
from game.chain.types import ENUMS, Outcome, Phase, TaskStatus, snake
from game.errors import ChainError, VerificationGameError


class Reverted(ChainError):
    """A call or gas estimate reverted; ``data`` holds the raw revert bytes for decoding.

    Backends raise this low-level form; :func:`decode_revert` below turns it into the contract's
    own error class.
    """

    def __init__(self, data: bytes, message: str = "") -> None:
        super().__init__(message or f"execution reverted (data 0x{data.hex()})")
        self.data = data


def revert_data_of(exc: BaseException) -> bytes | None:
    """Raw revert bytes from whatever shape a web3 provider used to report a revert."""
    candidates: list[Any] = []
    data = getattr(exc, "data", None)
    candidates.append(data)
    rpc = getattr(exc, "rpc_response", None)
    if isinstance(rpc, dict):
        err = rpc.get("error")
        if isinstance(err, dict):
            candidates.append(err.get("data"))
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, dict):
            candidates.append(arg.get("data"))
    for cand in candidates:
        if isinstance(cand, dict):
            cand = cand.get("data")
        if isinstance(cand, bytes | bytearray):
            return bytes(cand)
        if isinstance(cand, str) and cand.startswith("0x"):
            try:
                return bytes.fromhex(cand[2:])
            except ValueError:
                continue
    return None


class ContractError(VerificationGameError):
    """A refusal by the game contract (decoded from revert data, or predicted by a pre-check)."""

    #: Solidity parameter names (snake_case) in ABI order; the decoder fills them
    params: ClassVar[tuple[str, ...]] = ()
    #: Solidity enum behind a ``uint8`` parameter, by parameter name
    enum_params: ClassVar[dict[str, type]] = {}
    #: what the refusal means to a person, over the fields (appended to the message after ``: ``)
    explain: ClassVar[str] = ""

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
        if message is None and self.explain:
            message = self.explain.format(**{k: _say(k, v) for k, v in self.fields.items()})
        self.raw = f"{type(self).__name__}({shown})"  # the form scripts and logs match on
        self.meaning = message or ""  # what the refusal means for a person
        super().__init__(self.raw + (f": {message}" if message else ""))

    def for_people(self) -> str:
        """What the refusal means, then the raw form in brackets (``there is no task 9 in this
        game contract ... [TaskNotFound(task_id=9)]``): the line a person reads starts with words."""
        if not self.meaning:
            return f"the game contract refused the call [{self.raw}]"
        return f"{self.meaning} [{self.raw}]"

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
_TIMES = ("window_ends", "deadline", "commit_by")  # fields that hold a block timestamp


def _say(key: str, value: Any) -> str:
    """A field as :attr:`ContractError.explain` puts it: a timestamp also in UTC."""
    if key in _TIMES and isinstance(value, int):
        try:
            when = datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        except (OverflowError, ValueError, OSError):  # past year 9999: no calendar date
            return f"block time {value}"
        return f"{when} (block time {value})"
    return _show(value)


# ---------------------------------------------------------------------------------- the errors
class ZeroPayment(ContractError, ValueError):
    """``createTask`` sent no payment."""

    explain = "a task must escrow a payment above 0 wei"


class InvalidRoles(ContractError, ValueError):
    """Trainer or judge is the zero address, or they are the same."""

    params = ("trainer", "judge")
    explain = "the trainer and the judge must be two different, non-zero addresses"


class InvalidBonds(ContractError, ValueError):
    """A bond of zero: every claim (a commit, a challenge) must cost its maker when it is false."""

    params = ("trainer_bond", "auditor_bond")
    explain = "the trainer's bond and the auditor's bond must each be at least 1 wei"


class InvalidDurations(ContractError, ValueError):
    """A clock allowance, challenge window, judge window or commit window of zero seconds, or longer
    than ``MAX_DURATION`` (30 days)."""

    params = ("clock_allowance", "challenge_window", "judge_window", "commit_window")
    explain = (
        "the clock allowance, the challenge window, the judge window and the commit window must each "
        "be 1 s to 30 days"
    )


class TaskNotFound(ContractError, LookupError):
    params = ("task_id",)
    explain = "there is no task {task_id} in this game contract (is this the contract it was posted to?)"


class GameNotFound(ContractError, LookupError):
    params = ("game_id",)
    explain = "there is no game {game_id} in this game contract"


class WrongTaskStatus(ContractError):
    """The task's status does not allow this call (e.g. commit twice, cancel after commit)."""

    params = ("task_id", "status")
    enum_params: ClassVar[dict[str, type]] = {"status": TaskStatus}
    explain = (
        "task {task_id} is {status}: an OPEN task can be accepted or cancelled, an ACCEPTED one "
        "committed to (or cancelled once its commit window passed), a COMMITTED one challenged or "
        "finalized, a FINALIZED one's rewards claimed, a CANCELLED one nothing more"
    )


class Unauthorized(ContractError, PermissionError):
    """The caller is not the role this call belongs to."""

    params = ("caller", "expected")
    explain = "this call is {expected}'s to make, and the key given is {caller}'s"


class ChallengerNotAllowed(ContractError, PermissionError):
    """The task's trainer or judge tried to challenge it."""

    params = ("caller",)
    explain = "the task's own trainer or judge ({caller}) cannot challenge it"


class WrongBond(ContractError, ValueError):
    params = ("sent", "required")
    explain = "the bond must be exactly {required} wei, as the task fixed; {sent} wei was sent"


class InvalidLeafCount(ContractError, ValueError):
    params = ("num_leaves",)
    explain = "a task needs 2 to 2^48 leaves (1 to 2^48 - 1 steps), not {num_leaves}"


class LeafCountMismatch(ContractError, ValueError):
    """A commitment whose leaf count is not the one the task fixed at creation."""

    params = ("expected", "given")
    explain = "the task asks for {expected} leaves (steps + 1), the commitment has {given}"


class InvalidProof(ContractError, ValueError):
    """A Merkle proof does not lead to the committed root."""

    params = ("index", "leaf")
    explain = "the Merkle proof of leaf {index} does not lead to the committed root"


class InvalidPieceProof(ContractError, ValueError):
    """A posted piece is not the demanded piece of the chunk's piece tree."""

    params = ("index", "piece", "piece_hash")
    explain = "the data posted is not piece {piece} of log chunk {index}: its proof does not lead to the chunk's piece root"


class CommitWindowClosed(ContractError, TimeoutError):
    """The trainer commits after the commit window it accepted."""

    params = ("task_id", "commit_by")
    explain = "task {task_id}'s trainer had to commit by {commit_by}; the client may now cancel it"


class CommitWindowOpen(ContractError):
    """The client cancels an accepted task while its trainer may still commit."""

    params = ("task_id", "commit_by")
    explain = "task {task_id} was accepted: its trainer may commit until {commit_by}, and only after that can it be cancelled"


class WindowClosed(ContractError, TimeoutError):
    """Challenge at or after the end of the challenge window."""

    params = ("task_id", "window_ends")
    explain = "task {task_id}'s challenge window closed at {window_ends}"


class WindowOpen(ContractError):
    """Finalize before the challenge window ended."""

    params = ("task_id", "window_ends")
    explain = "task {task_id}'s challenge window is open until {window_ends}; finalize after that"


class GamesLive(ContractError):
    """Finalize while games of the task are still being played."""

    params = ("task_id", "live_games")
    explain = (
        "{live_games} game(s) of task {task_id} are still being played; finalize once every one has ended"
    )


class DataIndexOutOfRange(ContractError, ValueError):
    """An availability challenge names a log chunk the task does not have."""

    params = ("index", "num_leaves")
    explain = "the task's log has chunks 0..{num_leaves} - 1, not {index}"


class DataAlreadyProvided(ContractError):
    """An availability challenge names a piece of a chunk the trainer has already posted (it is
    public); ``piece`` is the demanded one reduced by the chunk's piece count."""

    params = ("task_id", "index", "piece")
    explain = (
        "the trainer of task {task_id} has already posted piece {piece} of log chunk {index}: "
        "read it from its DataProvided event"
    )


class GameOver(ContractError):
    """A move, ruling or timeout on a game that has ended."""

    params = ("game_id", "outcome")
    enum_params: ClassVar[dict[str, type]] = {"outcome": Outcome}
    explain = "game {game_id} has ended ({outcome})"


class NotYourTurn(ContractError, PermissionError):
    """The game's phase does not accept this move."""

    params = ("game_id", "phase")
    enum_params: ClassVar[dict[str, type]] = {"phase": Phase}
    explain = "game {game_id} is at {phase}, which does not take this move from this account"


class ClockExpired(ContractError, TimeoutError):
    """The mover's clock (or the judge's window) ran out; someone may call ``timeout``."""

    params = ("game_id", "deadline")
    explain = "the mover's time in game {game_id} ran out at {deadline}; anyone may now call timeout"


class ClockRunning(ContractError):
    """``timeout`` before the deadline passed."""

    params = ("game_id", "deadline")
    explain = "game {game_id}'s deadline is {deadline}; a timeout can be called only after it"


class NoReward(ContractError, LookupError):
    """A reward claimed for a game that did not end AuditorWon."""

    params = ("game_id", "outcome")
    enum_params: ClassVar[dict[str, type]] = {"outcome": Outcome}
    explain = "game {game_id} ended {outcome}: only a game the auditor won has a share of the trainer's bond"


class RewardAlreadyClaimed(ContractError):
    """A game's reward claimed a second time."""

    params = ("game_id",)
    explain = "the reward of game {game_id} was credited already"


class NothingToWithdraw(ContractError, LookupError):
    params = ("account",)
    explain = "{account} has no credit in the contract to withdraw"


class TransferFailed(ContractError):
    """The receiver of a withdrawal reverted."""

    params = ("account", "amount")
    explain = "sending {amount} wei to {account} failed: the receiver reverted"


class UnknownContractError(ContractError):
    """A custom error this module has no class for (the ABI grew): name and raw fields kept."""


class RevertedWithReason(ContractError):
    """``revert("...")`` / ``require(..., "...")``: the contract uses none, but a node may."""

    params = ("reason",)
    explain = "the call reverted: {reason}"


class ContractPanic(ContractError, ArithmeticError):
    """``Panic(uint256)``: an assert, overflow or bounds failure, i.e. a contract bug."""

    params = ("code",)
    explain = (
        "the contract panicked with code {code} (an assert, an overflow or an index out of bounds: a bug)"
    )


class EmptyRevert(ContractError):
    """A revert without data (out of gas, invalid opcode, a call to a non-contract)."""

    explain = "the call reverted without a reason (out of gas, or no contract code at the address)"


ERROR_CLASSES: dict[str, type[ContractError]] = {
    cls.__name__: cls
    for cls in (
        ZeroPayment,
        InvalidRoles,
        InvalidBonds,
        InvalidDurations,
        TaskNotFound,
        GameNotFound,
        WrongTaskStatus,
        Unauthorized,
        ChallengerNotAllowed,
        WrongBond,
        InvalidLeafCount,
        LeafCountMismatch,
        InvalidProof,
        InvalidPieceProof,
        CommitWindowClosed,
        CommitWindowOpen,
        WindowClosed,
        WindowOpen,
        GamesLive,
        DataIndexOutOfRange,
        DataAlreadyProvided,
        GameOver,
        NotYourTurn,
        ClockExpired,
        ClockRunning,
        NoReward,
        RewardAlreadyClaimed,
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
            exc = UnknownContractError(
                message=f"the contract refused with {name}({', '.join(map(_show, values))}), "
                "an error this client has no class for"
            )
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
