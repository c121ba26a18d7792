"""One exception tree for the whole project.

Every error raised on purpose derives from :class:`VGameError`, mixed with the builtin that best
describes it, so callers can catch either ``VGameError`` (anything of ours) or the builtin.
Sub-areas add their own subclasses next to their code but always root them here:

* training core: :class:`TrainingError` and children (rounding, log, transcript, replay);
* Merkle and hashing: :class:`MerkleError`;
* chain and contract: :class:`ChainError`, :class:`VerificationGameError` (decoded custom errors);
* configuration and user input: :class:`ConfigError`.
"""

from __future__ import annotations


class VGameError(Exception):
    """Root of every error this project raises on purpose."""

    def for_people(self) -> str:
        """The error as one line for a person (the CLI's ``error:`` line, a node's warning): its
        message, which says what went wrong and what to do. A subclass whose ``str`` leads with a
        raw form for scripts and logs (a contract error's ``TaskNotFound(task_id=9)``) puts that
        last here: an error line never starts with a Python repr."""
        return str(self)


class ConfigError(VGameError, ValueError):
    """A task config, preset name, profile name or CLI argument is invalid."""


class DirectoryInUse(VGameError):
    """Another live process holds a directory this one must write alone (a transcript that a second
    `vgame train` would interleave its steps with, a node's workdir)."""


class MerkleError(VGameError, ValueError):
    """A Merkle tree, leaf or inclusion proof is malformed."""


class TrainingError(VGameError, RuntimeError):
    """Training, replay or audit could not go on."""


class NonFiniteError(TrainingError, ArithmeticError):
    """NaN, or a finite value that rounds to inf, appeared in training (an inf itself passes: it is exact);
    the message names the step and the op."""


class UnsupportedOpError(TrainingError):
    """A step, or a model's construction, met an op that another machine would not replay bit for bit:
    one that draws from torch's generator, a fused kernel whose insides are not rounded, a kernel
    torch picks per device, or (at construction) an inexact op. Raised at the first such op, so a
    trainer learns it at step 1 and not from an auditor's "tampering"; the message names the op
    (``op``) and what to do instead (``fix``)."""

    def __init__(self, message: str, *, op: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.op = op
        self.fix = fix


class TaskCodeError(TrainingError):
    """The task's own code (its model's forward, its loss) raised: a bug of the task, said in one
    line that names the exception; ``VGAME_DEBUG=1`` shows the traceback."""


class CarriedStateError(TrainingError):
    """The task's model, optimizer or loss carries Python state from step to step outside the
    state a step commits (``game.training.engine.carried``), or the state does not come back from
    those bytes (``game.training.engine.states.check_reloads``): a judge re-running a later step
    from its committed state would start without it, so the trainer is stopped before it commits
    the run."""


class StateReloadError(CarriedStateError):
    """The state after the first step a trainer records does not come back from the bytes a step
    commits (``game.training.engine.states.check_reloads``): the task's code loses or changes what
    a judge would load."""


class RoundingLogError(TrainingError):
    """A rounding-log chunk is truncated, corrupt, reordered, foreign or of the wrong length."""


class UnfitChunkError(RoundingLogError):
    """Step ``step``'s chunk decoded but did not fit the step's computation, which raised part way
    and left its state half-updated: who rebuilds a state through that step starts again and runs
    it without the log (:func:`~game.training.engine.replay.state_after`)."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


class TranscriptError(TrainingError):
    """A transcript directory is missing files, inconsistent or does not match its manifest."""


class CheckpointError(TranscriptError, ValueError):
    """Canonical state bytes (a checkpoint) are truncated, corrupt, or do not fit the task's model."""


class StepWriteError(TranscriptError):
    """A step's files could not be written (a full disk, a path that is not writable). The steps
    before it are on disk; the same run, started again once the cause is gone, goes on from there."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


class DeliveryError(VGameError):
    """The trained model cannot be taken from a task: nothing committed yet, the transcript not in
    the store, or its files not what the chain vouches for."""


class ChainError(VGameError, RuntimeError):
    """Talking to a chain backend failed (node not reachable, transaction failed, bad key)."""


class NodeUnreachable(ChainError):
    """The JSON-RPC node did not answer (refused, timed out, closed the connection, an HTTP error),
    after the provider's own retries. Often passes: a long-lived node warns and tries again."""


class InsufficientFunds(ChainError):
    """The sending account cannot pay a transaction's value and gas (a fresh testnet key, a
    payment typed in wei where ether was meant)."""


class ContractGone(ChainError):
    """No game contract answers at the address a client was given: no code there, or a reply that
    does not decode. Why its own class: the chain was reset (a local anvil restarted without its
    state) or the address is wrong, which no retry mends, so a node stops at once with one line
    rather than warning round after round (or dying in a decoding traceback).

    ``no_code``: nothing is deployed there at all (False: something is, but not the game)."""

    def __init__(self, message: str, *, no_code: bool = True) -> None:
        super().__init__(message)
        self.no_code = no_code


class VerificationGameError(ChainError):
    """The game contract refused a call; subclasses mirror the contract's custom errors."""
