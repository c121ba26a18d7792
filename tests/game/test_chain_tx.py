"""Sending: gas bought with headroom, out-of-gas retries, idempotent retries after a lost answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

from game.chain.tx import GasPolicy, TxSender, gas_limit
from game.errors import ChainError
from game.protocol.solver import decide_reveal
from tests.game.conftest import Setup


def test_gasLimit_isEstimateTimesHeadroomPlusMargin_cappedByBlock() -> None:
    policy = GasPolicy(headroom=1.25, margin=20_000)
    assert gas_limit(40_000, policy) == 70_000
    assert gas_limit(40_000, policy, block_gas_limit=60_000) == 60_000


def test_transact_buysEstimateWithHeadroom(committed_task: Callable[[int], Setup], chain: Any) -> None:
    s = committed_task(1025)
    gid = s.auditor.challenge(s.task_id).result
    tree = s.tree
    assert tree is not None
    g = s.trainer.game(gid)
    data = s.trainer.contract.encode_abi("reveal", [gid, tree.leaf(g.mid), list(tree.proof(g.mid).siblings)])
    estimate = chain.estimate_gas({"from": s.trainer.me, "to": s.trainer.address, "data": data, "value": 0})
    rev = decide_reveal(g, tree)
    rec = s.trainer.reveal(gid, rev.leaf, rev.proof)
    policy = s.trainer.options.policy
    assert rec.gas_limit == int(estimate * policy.headroom) + policy.margin
    assert rec.gas_used <= estimate < rec.gas_limit


def test_send_outOfGas_retriesWithMoreGas_andRunsOnce(
    committed_task: Callable[[int], Setup], chain: Any
) -> None:
    s = committed_task(1025)
    gid = s.auditor.challenge(s.task_id).result
    tree = s.tree
    assert tree is not None
    mid = s.trainer.game(gid).mid
    stingy = s.trainer.with_options(fixed_gas=30_000, policy=GasPolicy(oog_bump=1.5, max_attempts=4))
    nonce = chain.nonce(s.trainer.me)
    rec = stingy.reveal(gid, tree.leaf(mid), tree.proof(mid))
    # 30k and 45k run out; 67.5k is enough: three transactions mined, one effect
    assert rec.gas_limit == 67_500 and chain.nonce(s.trainer.me) == nonce + 3
    assert len(s.trainer.get_events("LeafRevealed", game_id=gid)) == 1


def test_send_outOfGasEveryTime_givesUpWithChainError(committed_task: Callable[[int], Setup]) -> None:
    s = committed_task(65)
    gid = s.auditor.challenge(s.task_id).result
    tree = s.tree
    assert tree is not None
    mid = s.trainer.game(gid).mid
    hopeless = s.trainer.with_options(fixed_gas=40_000, policy=GasPolicy(oog_bump=1.1, max_attempts=2))
    with pytest.raises(ChainError, match="out of gas"):
        hopeless.reveal(gid, tree.leaf(mid), tree.proof(mid))
    below_intrinsic = s.trainer.with_options(fixed_gas=21_000)
    nonce = s.trainer.chain.nonce(s.trainer.me)
    with pytest.raises(ChainError, match="refused"):
        below_intrinsic.reveal(gid, tree.leaf(mid), tree.proof(mid))
    assert s.trainer.chain.nonce(s.trainer.me) == nonce
    s.trainer.reveal(gid, tree.leaf(mid), tree.proof(mid))  # the nonce book recovered


def test_send_answerLostAfterBroadcast_doesNotSendTwice(
    open_task: Setup, chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = TxSender(chain, GasPolicy(backoff=0.0))
    real = chain.w3.eth.send_raw_transaction
    calls = {"n": 0}

    def flaky(raw: bytes) -> Any:
        calls["n"] += 1
        out = real(raw)
        if calls["n"] == 1:
            raise requests.ConnectionError("connection reset after the node accepted the tx")
        return out

    monkeypatch.setattr(chain.w3.eth, "send_raw_transaction", flaky)
    payer = chain.account(7)
    to = chain.account(8).address
    before, nonce = chain.balance(to), chain.nonce(payer.address)
    sent = sender.transfer(payer, to, 12_345)
    assert sent.receipt["status"] == 1
    assert chain.balance(to) == before + 12_345 and chain.nonce(payer.address) == nonce + 1


def test_send_nodeDownBeforeBroadcast_retriesSameBytes(
    open_task: Setup, chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = TxSender(chain, GasPolicy(backoff=0.0))
    real = chain.w3.eth.send_raw_transaction
    seen: list[bytes] = []

    def down_once(raw: bytes) -> Any:
        seen.append(bytes(raw))
        if len(seen) == 1:
            raise requests.ConnectionError("connection refused")
        return real(raw)

    monkeypatch.setattr(chain.w3.eth, "send_raw_transaction", down_once)
    payer, to = chain.account(7), chain.account(8).address
    before = chain.balance(to)
    sent = sender.transfer(payer, to, 777)
    assert sent.attempts == 2 and seen[0] == seen[1]  # the very same signed transaction
    assert chain.balance(to) == before + 777


def test_nonces_backToBackSends_useConsecutiveNonces(chain: Any) -> None:
    sender = TxSender(chain)
    payer, to = chain.account(6), chain.account(9).address
    start = chain.nonce(payer.address)
    nonces = []
    for _ in range(3):
        sent = sender.transfer(payer, to, 1)
        nonces.append(chain.w3.eth.get_transaction(sent.receipt["transactionHash"])["nonce"])
    assert nonces == [start, start + 1, start + 2]


@pytest.mark.parametrize("fixed_gas", [None, 21_000])  # refused at the estimate, or at the broadcast
@pytest.mark.parametrize("rich", [False, True])  # nothing at all, or less than the value sent
def test_send_accountThatCannotPay_saysWhatItHoldsAndWhatWasAsked(
    chain: Any, fixed_gas: int | None, rich: bool
) -> None:
    from eth_account import Account

    from game.errors import InsufficientFunds

    sender = chain.account(0) if rich else Account.create()
    value = chain.balance(chain.account(0).address) * 2 if rich else 10**18
    nonce = chain.nonce(sender.address)
    tx = {"to": chain.account(1).address, "value": value, "data": b""}
    with pytest.raises(InsufficientFunds) as caught:
        TxSender(chain).send(sender, tx, gas=fixed_gas)
    said = str(caught.value)
    assert said.startswith(f"{sender.address} holds ") and f"({value} wei) plus its gas" in said
    assert chain.nonce(sender.address) == nonce  # nothing was sent


def test_replayRevert_aTransactionAheadInTheSameBlock_givesTheRevertItCaused() -> None:
    """Two parties call ``timeout`` in one block: the second's revert shows only on the state after
    the block (before it, the game was still running), and that is the reason to report."""
    from game.chain.errors import Reverted

    class _Chain:
        def __init__(self, reverts_from: int) -> None:
            self.reverts_from = reverts_from
            self.asked: list[int] = []

        def call(self, call: dict[str, Any], block: int) -> bytes:
            self.asked.append(block)
            if block >= self.reverts_from:
                raise Reverted(b"\xde\xad")
            return b""

    receipt = {"blockNumber": 7, "transactionHash": b"\x01" * 32, "gasUsed": 26_304}
    account = type("A", (), {"address": "0x" + "11" * 20})()
    base = {"to": "0x" + "22" * 20, "data": b"", "value": 0, "chainId": 1}
    ahead = _Chain(reverts_from=7)  # the state after block 7 reverts, the one before does not
    got = TxSender(ahead)._replay_revert(account, base, receipt)  # type: ignore[arg-type]
    assert isinstance(got, Reverted) and got.data == b"\xde\xad" and ahead.asked == [6, 7]
    never = _Chain(reverts_from=99)
    got = TxSender(never)._replay_revert(account, base, receipt)  # type: ignore[arg-type]
    assert type(got) is ChainError and "before and after its block" in str(got)


def test_replacementFees_raiseBothFieldsByMoreThanTenPercent_andMeetTheMarket() -> None:
    from game.chain.tx import replacement_fees

    prev = {"maxFeePerGas": 2_000_000_001, "maxPriorityFeePerGas": 1_000_000_000}
    bumped = replacement_fees(prev, {"maxFeePerGas": 1, "maxPriorityFeePerGas": 1})
    assert all(bumped[k] * 10 > prev[k] * 11 for k in prev)  # geth's and anvil's 10% price bump
    spiked = replacement_fees(prev, {"maxFeePerGas": 50 * 10**9, "maxPriorityFeePerGas": 10**9})
    assert spiked["maxFeePerGas"] == 50 * 10**9 and spiked["maxPriorityFeePerGas"] > 10**9
    assert replacement_fees({"gasPrice": 800}, {}) == {"gasPrice": 901}  # a legacy chain's one price


@pytest.mark.anvil
@pytest.mark.parametrize("spiked", ["before", "after"])  # refused at once, or taken and left unmined
def test_send_underpricedByABaseFeeSpike_isReplacedAtTheSameNonce_andRunsOnce(
    anvil_chain: Any, spiked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base fee that rises past the offered fee holds a transaction unmined for as long as it
    stays up: re-broadcasting the same bytes never lands it (a party would lose on its clock)."""
    import threading

    chain = anvil_chain
    payer, to = chain.account(7), chain.account(8).address
    before, nonce = chain.balance(to), chain.nonce(payer.address)
    spike = 50 * int(chain.w3.eth.get_block("latest")["baseFeePerGas"]) + 10**10
    chain._rpc("evm_setAutomine", [False])
    sender = TxSender(chain, GasPolicy(receipt_timeout=1.5, poll=0.05))
    quoted, stop = threading.Event(), threading.Event()
    real_broadcast = sender._broadcast

    def broadcast(raw: bytes) -> None:  # the first offer is priced before any spike, always
        if spiked == "before" and not quoted.is_set():
            chain._rpc("anvil_setNextBlockBaseFeePerGas", [hex(spike)])
            chain._rpc("anvil_mine", ["0x1"])  # the fee rises between the quote and the send
        quoted.set()
        real_broadcast(raw)

    monkeypatch.setattr(sender, "_broadcast", broadcast)

    def congested_blocks() -> None:  # every block's base fee far above what the first offer allows
        while not quoted.is_set() and not stop.is_set():
            stop.wait(0.02)
        while spiked == "after" and chain.nonce(payer.address) == nonce and not stop.is_set():
            stop.wait(0.02)  # until the first version is in the node's pool
        while not stop.is_set():
            chain._rpc("anvil_setNextBlockBaseFeePerGas", [hex(spike)])
            chain._rpc("anvil_mine", ["0x1"])
            stop.wait(0.2)

    miner = threading.Thread(target=congested_blocks, daemon=True)
    miner.start()
    try:
        sent = sender.transfer(payer, to, 4242)
    finally:
        stop.set()
        miner.join()
    tx = chain.w3.eth.get_transaction(sent.receipt["transactionHash"])
    assert sent.attempts >= 2 and tx["nonce"] == nonce and tx["maxFeePerGas"] >= spike
    assert chain.balance(to) == before + 4242 and chain.nonce(payer.address) == nonce + 1


@pytest.mark.anvil
def test_send_anEarlierVersionLands_whileItIsBeingReplaced_isTakenNotSentAgain(
    anvil_chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first version is mined just as the wait for it ends: the replacement finds its nonce
    used, and the sender must return the earlier version's receipt, not sign the call anew at the
    next nonce (which would run it twice)."""
    from web3.exceptions import TimeExhausted

    chain = anvil_chain
    payer, to = chain.account(5), chain.account(6).address
    before, nonce = chain.balance(to), chain.nonce(payer.address)
    chain._rpc("evm_setAutomine", [False])
    sender = TxSender(chain, GasPolicy(receipt_timeout=0.5, poll=0.05))
    real_wait = sender._wait_any
    waits: list[int] = []

    def late(versions: list[Any], timeout: float) -> Any:
        waits.append(len(versions))
        if len(waits) == 1:
            chain._rpc("anvil_mine", ["0x1"])  # the first version lands only now ...
            raise TimeExhausted("... and the sender has already given up waiting for it")
        chain._rpc("evm_setAutomine", [True])
        return real_wait(versions, timeout)

    monkeypatch.setattr(sender, "_wait_any", late)
    sent = sender.transfer(payer, to, 99)
    first = chain.w3.eth.get_transaction_by_block(sent.receipt["blockNumber"], 0)
    assert sent.receipt["transactionHash"] == first["hash"] and first["nonce"] == nonce
    assert chain.balance(to) == before + 99 and chain.nonce(payer.address) == nonce + 1
