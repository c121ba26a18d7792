"""The default backend: an in-process py-evm chain (Prague rules) through web3's tester provider.

No node, no network, milliseconds per transaction, and full control of the clock, which is what
demos and tests need. Accounts are eth-tester's deterministic keys (1, 2, 3, ...) wrapped as
eth-account ``LocalAccount`` objects so agents sign exactly as they would on a real network.
"""

from __future__ import annotations

import logging
from typing import Any

from eth.exceptions import TransactionNotFound
from eth.vm.spoof import SpoofTransaction
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.backends.pyevm.serializers import serialize_transaction, serialize_transaction_receipt
from eth_tester.exceptions import TransactionFailed
from web3 import EthereumTesterProvider, Web3

from game.chain.base import Chain
from game.chain.errors import Reverted
from game.errors import ChainError

log = logging.getLogger(__name__)

#: ether each embedded account starts with (eth-tester's default genesis balance)
EMBEDDED_BALANCE_ETH = 1_000_000


class EmbeddedChain(Chain):
    """py-evm in this process; time travel, snapshots and mining on demand all work."""

    kind = "embedded"
    supports_time_travel = True

    def __init__(self, accounts: int = 10) -> None:
        # WHY generate_genesis_state: eth-tester funds exactly the keys 1..n, so we know them.
        genesis = PyEVMBackend.generate_genesis_state(num_accounts=accounts)
        self.backend = IndexedBackend(genesis_state=genesis)
        self.tester = EthereumTester(self.backend)
        # WHY: py-evm's default estimator binary-searches (~15 executions per estimate); one run with
        # the block's gas limit gives the gas the call uses, and our headroom covers the rest.
        chain_cls = type(self.backend.chain)
        chain_cls.gas_estimator = staticmethod(single_run_gas_estimate)
        self.backend.chain.gas_estimator = single_run_gas_estimate
        w3 = Web3(EthereumTesterProvider(self.tester))
        keys = [i.to_bytes(32, "big") for i in range(1, accounts + 1)]
        local: list[LocalAccount] = [Account.from_key(k) for k in keys]
        if [a.address for a in local] != list(w3.eth.accounts):
            raise ChainError("eth-tester's default accounts are not the keys 1..n any more")
        super().__init__(w3, local)
        log.debug("embedded chain up: %d accounts, chain id %d", accounts, self.chain_id)

    # WHY go to the tester directly: through web3 the revert bytes arrive only as a repr() string.
    def estimate_gas(self, tx: dict[str, Any]) -> int:
        try:
            return int(self.tester.estimate_gas(_tester_tx(tx)))
        except TransactionFailed as exc:
            raise Reverted(_tester_revert_bytes(exc)) from exc

    def call(self, tx: dict[str, Any], block: int | str = "latest") -> bytes:
        try:
            return bytes(self.w3.eth.call(tx, block))  # type: ignore[arg-type]
        except TransactionFailed as first:
            # re-run through the estimator, which keeps the raw revert bytes that call() loses
            try:
                self.tester.estimate_gas(_tester_tx(tx), block)
            except TransactionFailed as exc:
                raise Reverted(_tester_revert_bytes(exc)) from exc
            raise Reverted(b"", f"call reverted without data: {first}") from first

    def time_travel(self, seconds: int) -> int:
        if seconds < 0:
            raise ValueError("time only moves forward")
        target = self.now() + int(seconds)
        # eth-tester mines the travel block one second before the timestamp it is given
        self.tester.time_travel(target + 1)
        return self.now()

    def mine(self, blocks: int = 1) -> None:
        self.tester.mine_blocks(blocks)

    def snapshot(self) -> Any:
        return self.tester.take_snapshot()

    def revert(self, snapshot_id: Any) -> None:
        self.tester.revert_to_snapshot(snapshot_id)
        self._forget_nonces()


class IndexedBackend(PyEVMBackend):
    """eth-tester's py-evm backend, finding a mined transaction by py-evm's own index of them.

    Why: eth-tester finds a transaction by walking every block back from the head (its own TODO
    says so), and its log filter reads the receipt of every transaction of every block it scans: a
    scan then costs the chain's length for each transaction in it, and the agents scan each round.
    py-evm keeps a hash -> (block, index) lookup for the canonical chain. A reverted snapshot
    leaves the lookups of the blocks above its head, so a block found must be at or below the head
    and hold the transaction at that index; the walk stays for what the index does not hold (the
    pending block, a hash it does not know, a lookup left by a revert)."""

    def _find(self, transaction_hash: bytes) -> tuple[Any, Any, int] | None:
        try:
            number, index = self.chain.chaindb.get_transaction_index(transaction_hash)
        except TransactionNotFound:
            return None
        if number > self.chain.get_canonical_head().block_number:  # a revert leaves the lookups above it
            return None
        block = self.chain.get_canonical_block_by_number(number)
        if index >= len(block.transactions) or block.transactions[index].hash != transaction_hash:
            return None
        return block, block.transactions[index], index

    def get_transaction_by_hash(self, transaction_hash: bytes) -> Any:
        found = self._find(transaction_hash)
        if found is None:
            return super().get_transaction_by_hash(transaction_hash)
        block, transaction, index = found
        return serialize_transaction(block, transaction, index, False)

    def get_transaction_receipt(self, transaction_hash: bytes) -> Any:
        found = self._find(transaction_hash)
        if found is None:
            return super().get_transaction_receipt(transaction_hash)
        block, transaction, index = found
        receipts = block.get_receipts(self.chain.chaindb)
        return serialize_transaction_receipt(block, receipts, transaction, index, False, self.chain.get_vm())


def single_run_gas_estimate(state: Any, transaction: Any) -> int:
    """Gas a transaction uses when given the whole block (refunds not subtracted; reverts raise).

    A lower bound of what it needs only when a callee is starved by the 63/64 rule, which this
    contract never relies on; :class:`game.chain.tx.GasPolicy` headroom and the out-of-gas retry
    cover that case anyway.
    """
    snapshot = state.snapshot()
    try:
        spoof = SpoofTransaction(transaction, gas=state.gas_limit, gas_price=0)
        computation = state.apply_transaction(spoof)
        if computation.is_error:
            raise computation.error
        return int(state.gas_limit - computation.get_gas_remaining())
    finally:
        state.revert(snapshot)


def _tester_tx(tx: dict[str, Any]) -> dict[str, Any]:
    """The subset of a web3 transaction dict eth-tester's estimator accepts, in its formats."""
    out: dict[str, Any] = {}
    for key in ("from", "to", "gas", "value"):
        if tx.get(key) is not None:
            out[key] = tx[key]
    data = tx.get("data", b"")
    out["data"] = data if isinstance(data, str) else "0x" + bytes(data).hex()
    out.setdefault("value", 0)
    return out


def _tester_revert_bytes(exc: TransactionFailed) -> bytes:
    inner = exc.args[0] if exc.args else b""
    raw = inner.args[0] if isinstance(inner, BaseException) and inner.args else inner
    if isinstance(raw, bytes | bytearray):
        return bytes(raw)
    return b""  # a revert without data (e.g. invalid opcode, out of gas)
