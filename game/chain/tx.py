"""Sending one transaction safely: gas with headroom, nonces, fees, receipts, idempotent retries.

Agents in deployed dispute games lost because they under-estimated gas or raced their own nonces
(BoLD #355, Dave #233). So every transaction here is: estimated (a revert surfaces now, for free,
with its decoded reason), given ``estimate * headroom + margin`` gas, signed locally with an
explicit nonce, broadcast, and waited for. Retries never double-execute: a transient failure
re-broadcasts the *same* signed bytes (same hash, so at most one lands); a transaction left
unmined (its fee fell below the market: a base-fee spike would hold it until the chess clock ran
out) is replaced at the *same nonce* with higher fees, and every version is watched, so whichever
lands is the one; only a transaction that provably had no effect (out of gas, or its nonce went to
nothing of ours) is re-signed at a new nonce.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import requests
from eth_account.signers.local import LocalAccount
from eth_utils import ValidationError
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import TimeExhausted, TransactionNotFound, Web3RPCError

from game.chain.errors import Reverted
from game.errors import ChainError, InsufficientFunds

log = logging.getLogger(__name__)

_TRANSIENT = (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)
# how nodes word "this account cannot pay": geth and anvil, then py-evm's two checks
_CANNOT_PAY = ("insufficient funds", "cannot afford txn gas", "not have enough balance")
# how nodes word "not at these fees": geth's pool and replacements, anvil's and erigon's base-fee
# check, nethermind's FeeTooLow, besu's replacement and minimum prices
_UNDERPRICED = (
    "underpriced",
    "less than block base fee",
    "fee too low",
    "feetoolow",
    "price is too low",
    "below configured minimum",
)


class Chain(Protocol):
    """What a sender needs of a chain; every :class:`game.chain.base.Chain` is one.

    A protocol rather than the base class: the base class's ``fund`` sends with a
    :class:`TxSender`, so this module cannot import it back.
    """

    @property
    def w3(self) -> Web3: ...

    @property
    def chain_id(self) -> int: ...

    def nonce(self, address: str) -> int: ...

    def balance(self, address: str) -> int: ...

    def estimate_gas(self, tx: dict[str, Any]) -> int: ...

    def call(self, tx: dict[str, Any], block: int | str = "latest") -> bytes: ...


@dataclass(frozen=True)
class GasPolicy:
    """How much gas to buy and how hard to try."""

    headroom: float = 1.25  # x the node's estimate: state may change between estimate and inclusion
    margin: int = 20_000  # + flat gas: covers cold-slot surprises and refund-capped estimates
    max_attempts: int = 4  # broadcasts per transaction, counting out-of-gas and transient retries
    oog_bump: float = 1.5  # x the previous limit after an out-of-gas revert
    receipt_timeout: float = 120.0  # seconds to wait for inclusion before replacing with higher fees
    backoff: float = 0.5  # seconds before a retry, doubled each time
    poll: float = 0.1  # seconds between receipt queries while waiting (growing to 2 s)


#: A replacement at the same nonce must raise both fee fields by at least 10% (geth's, and anvil's,
#: price bump) to be accepted: ours adds an eighth, and never offers less than the market's fee.
def replacement_fees(previous: dict[str, int], market: dict[str, int]) -> dict[str, int]:
    """The fees of a transaction that replaces one offered at ``previous``."""
    fees = {k: max(v + v // 8 + 1, market.get(k, 0)) for k, v in previous.items()}
    if "maxFeePerGas" in fees:
        fees["maxFeePerGas"] = max(fees["maxFeePerGas"], fees["maxPriorityFeePerGas"])
    return fees


def gas_limit(estimate: int, policy: GasPolicy, block_gas_limit: int | None = None) -> int:
    """``estimate * headroom + margin``, never above the block gas limit."""
    limit = int(estimate * policy.headroom) + policy.margin
    if block_gas_limit is not None:
        limit = min(limit, block_gas_limit)
    return limit


@dataclass(frozen=True)
class Sent:
    """A mined, successful transaction and what it took to get it there."""

    receipt: Any  # the node's receipt (web3 AttributeDict)
    gas_limit: int  # the gas bought for the attempt that landed
    attempts: int  # broadcasts made (1 unless something was retried)


class NonceBook:
    """Next nonce per address for one chain, so quick successive sends never reuse one."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, chain: Chain, address: str) -> int:
        nonce = max(chain.nonce(address), self._next.get(address, 0))
        self._next[address] = nonce + 1
        return nonce

    def forget(self, address: str) -> None:
        self._next.pop(address, None)


def nonce_book(chain: Chain) -> NonceBook:
    book = getattr(chain, "_vgame_nonce_book", None)
    if book is None:
        book = NonceBook()
        chain._vgame_nonce_book = book  # type: ignore[attr-defined]
    return book


class TxSender:
    """Estimate, sign, send and confirm transactions on one chain."""

    def __init__(self, chain: Chain, policy: GasPolicy | None = None) -> None:
        self.chain = chain
        self.policy = policy or GasPolicy()

    @property
    def w3(self) -> Web3:
        return self.chain.w3

    def estimate(self, account: LocalAccount, tx: dict[str, Any]) -> int:
        """The node's gas estimate; raises :class:`Reverted` (raw data) when the call would revert,
        and :class:`InsufficientFunds` or :class:`ChainError` when the node will not run it at all."""
        try:
            return self.chain.estimate_gas({**tx, "from": account.address})
        except (Web3RPCError, ValueError, ValidationError) as exc:
            raise self._refusal(account, int(tx.get("value", 0)), exc) from exc

    def _refusal(self, account: LocalAccount, value: int, exc: Exception) -> ChainError:
        """The node's refusal of a transaction as our error: an account that cannot pay says how
        much it holds and what was asked (each node words that refusal its own way)."""
        text = str(exc)
        if any(m in text.lower() for m in _CANNOT_PAY):
            try:
                holds = f"holds {Web3.from_wei(self.chain.balance(account.address), 'ether')} ETH"
            except Exception:  # the refusal is the news; the balance only adds to it
                holds = "cannot pay"
            return InsufficientFunds(
                f"{account.address} {holds}; this transaction sends "
                f"{Web3.from_wei(value, 'ether')} ETH ({value} wei) plus its gas: fund the account, "
                f"or send less (the node said: {text})"
            )
        return ChainError(f"the node refused the transaction: {text}")

    def transfer(self, account: LocalAccount, to: str, wei: int) -> Sent:
        return self.send(account, {"to": Web3.to_checksum_address(to), "value": wei, "data": b""}, gas=21_000)

    def send(self, account: LocalAccount, tx: dict[str, Any], *, gas: int | None = None) -> Sent:
        """Send ``tx`` (``to``, ``data``, ``value``) from ``account``; return it once mined.

        ``gas=None`` estimates (a would-be revert raises :class:`Reverted` before anything is sent).
        A fixed ``gas`` skips the estimate, so a reverting call is mined and paid for; its reason
        is recovered by replaying it and raised as :class:`Reverted` too.
        """
        policy = self.policy
        latest = self.w3.eth.get_block("latest")
        block_limit = int(latest["gasLimit"])
        limit = gas if gas is not None else gas_limit(self.estimate(account, tx), policy, block_limit)
        base = {
            "to": tx.get("to"),
            "data": tx.get("data", b""),
            "value": int(tx.get("value", 0)),
            "chainId": self.chain.chain_id,
        }
        if base["to"] is None:
            base.pop("to")
        book = nonce_book(self.chain)
        attempt = 0
        signed: Any = None
        nonce = -1
        fees = self._fees(latest)
        versions: list[HexBytes] = []  # the hashes signed at this nonce: at most one of them lands
        while True:
            attempt += 1
            if signed is None:
                if nonce < 0:
                    nonce = book.take(self.chain, account.address)
                signed = account.sign_transaction({**base, **fees, "gas": limit, "nonce": nonce})
                versions.append(HexBytes(signed.hash))
            tx_hash = HexBytes(signed.hash)
            try:
                self._broadcast(signed.raw_transaction)
                receipt = self._wait_any(versions, policy.receipt_timeout)
            except TimeExhausted:
                if attempt >= policy.max_attempts:
                    raise ChainError(
                        f"transaction {tx_hash.hex()} was not mined after {attempt} tries (the last "
                        f"offered {self._fee_text(fees)})"
                    ) from None
                fees = replacement_fees(fees, self._market_fees())
                log.warning(
                    "tx %s not mined in %.0f s; replacing it at nonce %d with %s",
                    tx_hash.hex(),
                    policy.receipt_timeout,
                    nonce,
                    self._fee_text(fees),
                )
                signed = None
                continue
            except _TRANSIENT as exc:
                mined = self._receipt_if_mined(versions)
                if mined is not None:
                    receipt = mined
                else:
                    if attempt >= policy.max_attempts:
                        raise ChainError(f"node unreachable while sending {tx_hash.hex()}: {exc}") from exc
                    log.warning("transient error sending %s (%s); retrying", tx_hash.hex(), exc)
                    time.sleep(policy.backoff * 2 ** (attempt - 1))
                    continue
            except Web3RPCError as exc:
                msg = str(exc).lower()
                mined = self._receipt_if_mined(versions)
                if mined is not None:
                    receipt = mined  # an earlier version landed while this one was on its way
                elif "nonce too low" in msg or "nonce is too low" in msg:
                    # our nonce went to another transaction of this account: ours never ran
                    book.forget(account.address)
                    if attempt >= policy.max_attempts:
                        raise ChainError(f"could not find a free nonce for {account.address}") from exc
                    signed, versions, nonce = None, [], -1
                    continue
                elif any(m in msg for m in _UNDERPRICED) and attempt < policy.max_attempts:
                    # the node would not take this version at its fees (a base fee risen past its
                    # cap, or too small a bump over a pending version): offer more, same nonce
                    versions.pop()
                    fees = replacement_fees(fees, self._market_fees())
                    log.warning(
                        "tx %s refused as underpriced; offering %s", tx_hash.hex(), self._fee_text(fees)
                    )
                    signed = None
                    continue
                else:
                    if len(versions) == 1:
                        book.forget(account.address)
                    raise self._refusal(account, base["value"], exc) from exc
            except ValidationError as exc:  # py-evm's refusal (e.g. intrinsic gas too low)
                book.forget(account.address)
                raise self._refusal(account, base["value"], exc) from exc
            landed = HexBytes(receipt["transactionHash"])
            if receipt["status"] == 1:
                log.debug(
                    "tx %s mined in block %d, gas %d/%d",
                    landed.hex(),
                    receipt["blockNumber"],
                    receipt["gasUsed"],
                    limit,
                )
                return Sent(receipt=receipt, gas_limit=limit, attempts=attempt)
            # reverted on-chain: out of gas is ours to fix, anything else is the contract's answer
            if receipt["gasUsed"] >= limit * 0.98:
                new_limit = min(int(limit * policy.oog_bump), block_limit)
                if attempt >= policy.max_attempts or new_limit <= limit:
                    raise ChainError(
                        f"transaction ran out of gas at a limit of {limit} after {attempt} tries"
                    )
                log.warning("tx %s ran out of gas at %d; retrying with %d", landed.hex(), limit, new_limit)
                latest = self.w3.eth.get_block("latest")
                limit, signed, versions, nonce, fees = new_limit, None, [], -1, self._fees(latest)
                continue
            raise self._replay_revert(account, base, receipt)

    def _wait_any(self, versions: list[HexBytes], timeout: float) -> Any:
        """The receipt of whichever version is mined first; TimeExhausted after ``timeout``.
        Transient errors are raised (the caller retries them, checking every version)."""
        end = time.monotonic() + timeout
        polls = 0
        while True:
            receipt = self._receipt_if_mined(versions, transient_ok=False)
            if receipt is not None:
                return receipt
            if time.monotonic() >= end:
                raise TimeExhausted(f"none of {len(versions)} version(s) mined in {timeout} s")
            polls += 1  # quick on a local chain; on a public node, a query every 2 s at the most
            time.sleep(min(self.policy.poll * (1 + polls // 10), 2.0))

    def _market_fees(self) -> dict[str, int]:
        """What a fresh transaction would offer for the next block ({} when the node cannot say:
        the bump alone). The pending block holds the next base fee where a node tells it."""
        for block in ("pending", "latest"):
            try:
                return self._fees(self.w3.eth.get_block(block))
            except (*_TRANSIENT, Web3RPCError, ValueError):
                continue
        return {}

    @staticmethod
    def _fee_text(fees: dict[str, int]) -> str:
        return ", ".join(f"{k} {Web3.from_wei(v, 'gwei')} gwei" for k, v in fees.items())

    def _fees(self, latest: Any) -> dict[str, int]:
        base_fee = latest.get("baseFeePerGas")
        if base_fee is None:
            return {"gasPrice": int(self.w3.eth.gas_price)}
        try:
            tip = int(self.w3.eth.max_priority_fee)
        except Exception:  # nodes without eth_maxPriorityFeePerGas
            tip = 10**9
        return {"maxFeePerGas": 2 * int(base_fee) + tip, "maxPriorityFeePerGas": tip}

    def _broadcast(self, raw: bytes) -> None:
        try:
            self.w3.eth.send_raw_transaction(raw)
        except Web3RPCError as exc:
            msg = str(exc).lower()
            if "already known" in msg or "known transaction" in msg or "already imported" in msg:
                return  # a previous broadcast of these exact bytes reached the node
            raise

    def _receipt_if_mined(self, versions: list[HexBytes], *, transient_ok: bool = True) -> Any:
        """The receipt of a mined version, or None; a transient error counts as "not known to be
        mined" (``transient_ok``) or is raised."""
        skip = (TransactionNotFound, *_TRANSIENT) if transient_ok else (TransactionNotFound,)
        for h in versions:
            try:
                return self.w3.eth.get_transaction_receipt(h)
            except skip:
                continue
        return None

    def _replay_revert(self, account: LocalAccount, base: dict[str, Any], receipt: Any) -> Exception:
        """Re-run a mined, failed call to learn why it reverted: on the state before its block, then
        on the state after it, which holds what a transaction ahead of ours in the same block did
        (two parties calling ``timeout`` at once: the second finds the game over)."""
        call = {k: v for k, v in base.items() if k != "chainId"}
        call["from"] = account.address
        block = int(receipt["blockNumber"])
        for state_at in (max(0, block - 1), block):
            try:
                self.chain.call(call, state_at)
            except Reverted as rev:
                return rev
        return ChainError(
            f"transaction {HexBytes(receipt['transactionHash']).hex()} reverted on-chain "
            f"(gas used {receipt['gasUsed']}) and a replay before and after its block did not reproduce it"
        )
