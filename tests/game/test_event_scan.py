"""Scanning for games across a reorganisation: an event mined again lower down is still seen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests
from web3.exceptions import Web3RPCError

from game.agents import RESCAN_BLOCKS, games_of_task, next_scan_from
from tests.game.conftest import Setup


def test_nextScanFrom_keepsTheNewestBlocks_neverGoesBack() -> None:
    assert next_scan_from(0, 1000) == 1001 - RESCAN_BLOCKS
    assert next_scan_from(990, 1000) == 990  # never behind where this scan began
    assert next_scan_from(5, 5) == 5


def test_challengeMinedAgainInAReplacedBlock_isStillFound(
    committed_task: Callable[[int], Setup], chain: Any
) -> None:
    """A scan that saw blocks up to N, then a reorganisation: the challenge lands in a new block
    at or below N. A scan position of N + 1 would never look there again, and the trainer would
    lose the game on its clock without having seen it."""
    s = committed_task(65)
    start = chain.block_number()
    fork = chain.snapshot()
    chain.mine(3)  # the blocks the first scan sees, which the reorganisation replaces
    seen, nxt = games_of_task(s.trainer, s.task_id, start)
    assert seen == [] and nxt <= start
    chain.revert(fork)
    gid = s.auditor.challenge(s.task_id).result  # mined in a block the first scan already covered
    assert chain.block_number() < start + 3
    found, again = games_of_task(s.trainer, s.task_id, nxt)
    assert found == [gid] and again <= chain.block_number()
    assert games_of_task(s.trainer, s.task_id, again)[0] == [gid]  # seen again: callers dedupe


@pytest.mark.parametrize(
    "refusal",
    [Web3RPCError("exceed maximum block range: 8"), requests.ReadTimeout("read timed out (30 s)")],
    ids=["refused", "timed-out"],
)
def test_getEvents_onANodeThatCapsTheRange_halvesUntilItAnswers_andKeepsTheSpan(
    committed_task: Callable[[int], Setup], chain: Any, monkeypatch: pytest.MonkeyPatch, refusal: Exception
) -> None:
    """Public nodes refuse eth_getLogs over more than their cap (10,000, 2,000, 500 blocks, each
    in its own words): a judge scanning from block 0 must still find its games, not retry the
    same refused range every round forever."""
    from game.chain.events import get_events

    s = committed_task(65)
    gid = s.auditor.challenge(s.task_id).result
    chain.mine(40)
    address = s.trainer.address
    everything = get_events(chain, address, "Challenged")
    assert [e.game_id for e in everything] == [gid]
    real = chain.w3.eth.get_logs
    asked: list[int] = []

    def capped(query: dict[str, Any]) -> Any:
        width = int(query["toBlock"]) - int(query["fromBlock"]) + 1
        asked.append(width)
        if width > 8:
            raise refusal
        return real(query)  # type: ignore[arg-type]

    monkeypatch.setattr(chain.w3.eth, "get_logs", capped)
    assert get_events(chain, address, "Challenged") == everything
    learned = chain._vgame_log_span
    assert learned <= 8
    asked.clear()
    assert get_events(chain, address, "Challenged") == everything
    assert max(asked) <= 8  # the span that worked is where the next query starts

    def broken(query: dict[str, Any]) -> Any:
        raise Web3RPCError("internal error")

    monkeypatch.setattr(chain.w3.eth, "get_logs", broken)
    with pytest.raises(Web3RPCError, match="internal error"):  # down to one block: not a range cap
        get_events(chain, address, "Challenged")
    assert chain._vgame_log_span == learned  # a failure teaches nothing: only a span that answered


def _spy_log_queries(chain: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first block of every ``eth_getLogs`` query from now on, as a list that grows."""
    asked: list[int] = []
    real = chain.w3.eth.get_logs

    def spy(query: dict[str, Any]) -> Any:
        asked.append(int(query["fromBlock"]))
        return real(query)  # type: ignore[arg-type]

    monkeypatch.setattr(chain.w3.eth, "get_logs", spy)
    return asked


def test_clientsFirstBlock_startsEveryScanThere(
    committed_task: Callable[[int], Setup], chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node told the contract's deployment block (`--from-block`) never asks for the blocks
    before it: on a public testnet that is millions of blocks of queries saved."""
    from dataclasses import replace

    from game.chain.client import VerificationGameClient

    s = committed_task(65)
    gid = s.auditor.challenge(s.task_id).result
    at = chain.block_number()  # the challenge's block
    chain.mine(2)

    def client(first_block: int) -> VerificationGameClient:
        options = replace(s.trainer.options, first_block=first_block)
        return VerificationGameClient(chain, s.trainer.address, s.trainer.account, options=options)

    assert games_of_task(client(at), s.task_id, 0)[0] == [gid]
    assert games_of_task(client(at + 1), s.task_id, 0)[0] == []  # the block is before the first
    asked = _spy_log_queries(chain, monkeypatch)
    client(at).get_events("Challenged")
    assert asked and min(asked) == at


def test_clientWithNoFirstBlock_startsAtTheContractsDeploymentBlock(
    committed_task: Callable[[int], Setup], chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no ``--from-block`` a node reads the contract's ``deployedInBlock()`` once and never asks a
    node for the blocks before it (a public chain's millions of blocks since genesis)."""
    from game.chain.client import ClientOptions, VerificationGameClient

    s = committed_task(65)
    gid = s.auditor.challenge(s.task_id).result
    client = VerificationGameClient(chain, s.trainer.address, s.trainer.account, options=ClientOptions())
    first = client.first_block()
    assert 0 < first <= chain.block_number() and client.options.first_block is None
    asked = _spy_log_queries(chain, monkeypatch)
    assert games_of_task(client, s.task_id, 0)[0] == [gid]
    assert asked and min(asked) == first
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(chain, "call", lambda tx, *a, **k: calls.append(tx))
    client.as_account(s.auditor.account).get_events("Challenged")  # read once: it never changes
    assert calls == []


def test_aContractThatDoesNotSayItsDeploymentBlock_isScannedFromBlockZero_withAWarning(
    chain: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A game contract of an older build (here: another contract, which has no such function)."""
    from game.chain.client import VerificationGameClient
    from game.chain.deploy import deploy

    other = VerificationGameClient(chain, deploy(chain, name="MerkleHarness"), chain.account(0))
    with caplog.at_level("WARNING"):
        assert other.first_block() == 0 and other.first_block() == 0
    assert sum(r.getMessage().count("does not say its deployment block") for r in caplog.records) == 1
