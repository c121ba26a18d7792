"""The game contract's read side: its views and events, as one signer sees them.

Apart from :mod:`game.chain.client` (the transactions, each pre-checked against the contract's rules
before it is sent) so that each module holds one concern: :class:`GameViews` is the client's base
and holds what reading needs (the contract, its ABI and event decoder, the options, every view, the
event scans), and :class:`GameHandle` a game that reads through to the contract on every access.
Nothing here sends a transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3

from game.chain import errors as E
from game.chain.address import checked_address
from game.chain.artifacts import GAME_CONTRACT, load_artifact
from game.chain.base import Chain
from game.chain.calls import call_view
from game.chain.events import EventDecoder, EventPoller, get_events
from game.chain.tx import GasPolicy
from game.chain.types import ContractEvent, Game, Phase, Task
from game.errors import ContractGone

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientOptions:
    """How a client reads and sends."""

    prechecks: bool = True  # refuse locally, for free, what the contract would refuse
    fixed_gas: int | None = None  # skip the estimate and buy this much gas (reverts get mined)
    policy: GasPolicy = field(default_factory=GasPolicy)
    #: No event scan starts before this block. None: the contract's own ``deployedInBlock()``, read
    #: once (no event of it lies before; a public chain's node would otherwise be asked for every
    #: block since genesis); 0: the whole chain.
    first_block: int | None = None


class GameViews:
    """One signer's view of one deployed game contract: its views and events (the base of
    :class:`~game.chain.client.VerificationGameClient`, which adds the transactions)."""

    def __init__(self, chain: Chain, address: str, account: LocalAccount, *, options: ClientOptions) -> None:
        self.chain = chain
        self.address = checked_address(address, "contract")
        self.account = account
        self.options = options
        self.artifact = load_artifact(GAME_CONTRACT)
        self.contract = chain.w3.eth.contract(address=self.address, abi=self.artifact.abi_list)
        self.events = _decoder()
        self._deployed_in_block: int | None = None

    @property
    def me(self) -> str:
        return str(self.account.address)

    # --------------------------------------------------------------- views
    def task(self, task_id: int) -> Task:
        """``task(taskId)``; raises :class:`TaskNotFound` for an unknown id."""
        return Task.from_abi(self._view("task", task_id)[0])

    def game(self, game_id: int) -> Game:
        """``game(gameId)``; raises :class:`GameNotFound` for an unknown id."""
        return Game.from_abi(self._view("game", game_id)[0])

    def credit(self, account: str | None = None) -> int:
        return int(self._view("credit", Web3.to_checksum_address(account or self.me))[0])

    def clock_left(self, game_id: int) -> tuple[int, int]:
        """(trainer, auditor) seconds left now, the running clock reduced by the time elapsed."""
        trainer, auditor = self._view("clockLeft", game_id)
        return int(trainer), int(auditor)

    def deadline(self, game_id: int) -> int:
        """Time after which ``timeout`` succeeds; 0 once the game has ended."""
        return int(self._view("deadline", game_id)[0])

    def task_count(self) -> int:
        return int(self._view("taskCount")[0])

    def burnt(self) -> int:
        """Wei burnt so far (the halves of forfeited trainer bonds, locked in the contract for good)."""
        return int(self._view("burnt")[0])

    def game_count(self) -> int:
        return int(self._view("gameCount")[0])

    def deployed_in_block(self) -> int:
        """``deployedInBlock()``: the block the contract was deployed in (read once, it never
        changes); 0, with a warning, for a contract of an older build that does not say."""
        if self._deployed_in_block is None:
            try:
                self._deployed_in_block = int(self._view("deployedInBlock")[0])
            except (E.EmptyRevert, ContractGone) as exc:
                if isinstance(exc, ContractGone) and exc.no_code:
                    raise  # not an older build: no contract at all
                log.warning(
                    "the contract at %s does not say its deployment block (a build older than "
                    "deployedInBlock()): event scans start at block 0; --from-block N starts them at N",
                    self.address,
                )
                self._deployed_in_block = 0
        return self._deployed_in_block

    def first_block(self) -> int:
        """The block event scans start at, at the earliest (:attr:`ClientOptions.first_block`)."""
        given = self.options.first_block
        return self.deployed_in_block() if given is None else given

    def verify_leaf(self, root: bytes, index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bool:
        return bool(self._view("verifyLeaf", root, index, size, leaf, list(proof))[0])

    def handle(self, game_id: int) -> GameHandle:
        return GameHandle(self, game_id)

    # --------------------------------------------------------------- events
    def get_events(
        self, name: str | None = None, from_block: int = 0, to_block: int | str = "latest", **filters: Any
    ) -> list[ContractEvent]:
        """The contract's events in ``[from_block, to_block]``, never before :meth:`first_block`."""
        start = max(from_block, self.first_block())
        return get_events(self.chain, self.address, name, start, to_block, decoder=self.events, **filters)

    def poller(
        self, names: Iterable[str] | None = None, from_block: int | None = None, **filters: Any
    ) -> EventPoller:
        """An :class:`EventPoller` starting at ``from_block`` (default: the next block)."""
        start = self.chain.block_number() + 1 if from_block is None else from_block
        return EventPoller(self.chain, self.address, names, start, dict(filters), self.events)

    def _view(self, fn: str, *args: Any) -> tuple[Any, ...]:
        return call_view(self.chain, self.contract, self.artifact, self.me, fn, *args)


class GameHandle:
    """A game that reads through to the contract on every access (never stale)."""

    def __init__(self, client: GameViews, game_id: int) -> None:
        self.client = client
        self.game_id = game_id

    @property
    def state(self) -> Game:
        return self.client.game(self.game_id)

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def task(self) -> Task:
        return self.client.task(self.state.task_id)

    def clock_left(self) -> tuple[int, int]:
        return self.client.clock_left(self.game_id)

    def deadline(self) -> int:
        return self.client.deadline(self.game_id)

    def __repr__(self) -> str:
        return f"GameHandle({self.game_id} at {self.client.address})"


_DECODER: EventDecoder | None = None


def _decoder() -> EventDecoder:
    global _DECODER
    if _DECODER is None:
        _DECODER = EventDecoder()
    return _DECODER


__all__ = ["ClientOptions", "GameHandle", "GameViews"]
