"""What every chain backend offers: the :class:`Chain` base class the backends subclass.

A backend (:mod:`game.chain.embedded`, :mod:`game.chain.anvil`, :mod:`game.chain.rpc`) builds
``w3`` and ``accounts``; everything else an agent asks of a chain is here, once. Every backend
signs locally with eth-account ``LocalAccount`` objects, so an agent sends transactions the same
way whatever the chain. Test-only powers (time travel, snapshots) raise
:class:`TimeTravelUnsupported` where the chain cannot offer them instead of silently doing nothing.
:func:`game.chain.backends.connect` picks a backend by name.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import ContractLogicError, Web3RPCError

from game.chain.errors import Reverted, revert_data_of
from game.chain.tx import TxSender
from game.errors import ChainError, ConfigError


class TimeTravelUnsupported(ChainError, NotImplementedError):
    """The backend is a real network: its clock, blocks and state cannot be moved or rewound."""


class Chain:
    """One connection to one chain, with funded local accounts; a context manager.

    Subclasses build ``w3`` and ``accounts`` and implement the test-only powers they can offer.
    """

    #: short name of the backend: "embedded", "anvil" or "rpc"
    kind: str = "abstract"
    #: whether :meth:`time_travel`, :meth:`snapshot`, :meth:`revert` and :meth:`mine` work
    supports_time_travel: bool = False

    def __init__(self, w3: Web3, accounts: list[LocalAccount]) -> None:
        self.w3 = w3
        self.accounts: list[LocalAccount] = accounts
        self._closed = False

    # ---------------------------------------------------------------- basics
    @property
    def chain_id(self) -> int:
        """Asked once: a connection never changes chains (and every signature needs it)."""
        cached = self.__dict__.get("_chain_id")
        if cached is None:
            cached = self.__dict__["_chain_id"] = int(self.w3.eth.chain_id)
        return int(cached)

    def block_number(self) -> int:
        return int(self.w3.eth.block_number)

    def now(self) -> int:
        """Timestamp of the latest block: the time contracts saw last."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def balance(self, address: str) -> int:
        return int(self.w3.eth.get_balance(Web3.to_checksum_address(address)))

    def nonce(self, address: str) -> int:
        """Number of transactions ``address`` has sent (pending included)."""
        return int(self.w3.eth.get_transaction_count(Web3.to_checksum_address(address), "pending"))

    def account(self, index: int = 0) -> LocalAccount:
        if not 0 <= index < len(self.accounts):
            raise ConfigError(f"{self.kind} chain has {len(self.accounts)} accounts, asked for #{index}")
        return self.accounts[index]

    # --------------------------------------------------------- low-level calls
    def estimate_gas(self, tx: dict[str, Any]) -> int:
        """Gas the node estimates for ``tx``; raises :class:`Reverted` with the revert data."""
        try:
            return int(self.w3.eth.estimate_gas(tx))  # type: ignore[arg-type]
        except (ContractLogicError, Web3RPCError, ValueError) as exc:
            data = revert_data_of(exc)
            if data is None:
                raise
            raise Reverted(data) from exc

    def call(self, tx: dict[str, Any], block: int | str = "latest") -> bytes:
        """``eth_call``; raises :class:`Reverted` with the revert data."""
        try:
            return bytes(self.w3.eth.call(tx, block))  # type: ignore[arg-type]
        except (ContractLogicError, Web3RPCError, ValueError) as exc:
            data = revert_data_of(exc)
            if data is None:
                raise
            raise Reverted(data) from exc

    def new_account(self, fund_wei: int = 0) -> LocalAccount:
        """A fresh key pair, optionally funded from account 0 (tests want strangers)."""
        acct: LocalAccount = Account.create()
        if fund_wei:
            self.fund(acct.address, fund_wei)
        return acct

    def fund(self, address: str, wei: int, *, sender: LocalAccount | None = None) -> None:
        """Send ``wei`` plain ether to ``address`` from ``sender`` (default account 0)."""
        TxSender(self).transfer(sender or self.account(0), address, wei)

    # ------------------------------------------------------- test-only powers
    def time_travel(self, seconds: int) -> int:
        """Move the clock ``seconds`` forward and mine a block there; return the new :meth:`now`."""
        raise TimeTravelUnsupported(f"the {self.kind} backend cannot move time; use embedded or anvil")

    def mine(self, blocks: int = 1) -> None:
        raise TimeTravelUnsupported(f"the {self.kind} backend cannot mine on demand")

    def snapshot(self) -> Any:
        """An opaque id to :meth:`revert` to later."""
        raise TimeTravelUnsupported(f"the {self.kind} backend has no snapshots")

    def revert(self, snapshot_id: Any) -> None:
        raise TimeTravelUnsupported(f"the {self.kind} backend has no snapshots")

    def _forget_nonces(self) -> None:
        """After a revert or a restart the node's nonces went back: drop what senders cached."""
        self.__dict__.pop("_vgame_nonce_book", None)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Release what the backend holds (anvil: stop the node). Idempotent."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Chain:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def describe(self) -> str:
        return f"{self.kind} (chain id {self.chain_id})"
