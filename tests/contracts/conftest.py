"""Fixtures: chain (embedded py-evm, anvil) -> deployed contracts -> a fresh snapshot per test.

Every test runs on the embedded chain; tests that are not marked ``embedded_only`` also run on
anvil (marked ``anvil``). The chain and the deployment are made once per session and backend;
each test runs inside a snapshot that is reverted afterwards, so tests never see each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from game.chain.anvil import find_anvil
from game.chain.backends import connect
from game.chain.base import Chain
from game.errors import ConfigError
from tests.contracts.driver import Env, ErrorTable, artifact

# Every block is exactly one second after its parent, so tests can pin transactions to exact
# timestamps: the embedded chain runs this far ahead of the wall clock (py-evm then uses parent + 1),
# anvil gets a fixed block timestamp interval of one second.
AHEAD_OF_WALL_CLOCK = 10 * 365 * 86_400
ACCOUNTS = 12


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "embedded_only: runs on the embedded chain only (slow or heavy on anvil)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the anvil variant of ``embedded_only`` tests (deselect, not skip: it never should run)."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("chain") if callspec is not None else None
        if backend == "anvil" and item.get_closest_marker("embedded_only") is not None:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", params=["embedded", pytest.param("anvil", marks=pytest.mark.anvil)])
def chain(request: pytest.FixtureRequest) -> Iterator[Chain]:
    backend: str = request.param
    if backend == "anvil":
        try:
            find_anvil()
        except ConfigError as exc:
            pytest.skip(str(exc))
    with connect(backend, accounts=ACCOUNTS) as c:
        if backend == "embedded":
            c.time_travel(AHEAD_OF_WALL_CLOCK)
        else:
            resp = c.w3.provider.make_request("anvil_setBlockTimestampInterval", [1])  # type: ignore[arg-type]
            assert "error" not in resp, resp
        yield c


@pytest.fixture(scope="session")
def deployed(chain: Chain) -> dict[str, Any]:
    """The game, the Merkle harness, the ether-rejecting client and the re-entering receiver, deployed
    once per chain."""
    w3 = chain.w3
    out: dict[str, Any] = {}
    abis = []
    for name in ("VerificationGame", "MerkleHarness", "EtherRejecter", "Reenterer"):
        art = artifact(name)
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        tx_hash = factory.constructor().transact({"from": chain.accounts[0].address})
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
        assert receipt["status"] == 1
        out[name] = w3.eth.contract(address=receipt["contractAddress"], abi=art["abi"], decode_tuples=True)
        abis.append(art["abi"])
    out["errors"] = ErrorTable(abis)
    return out


@pytest.fixture
def env(chain: Chain, deployed: dict[str, Any]) -> Iterator[Env]:
    snap = chain.snapshot()
    try:
        yield Env(
            chain=chain,
            game=deployed["VerificationGame"],
            harness=deployed["MerkleHarness"],
            rejecter=deployed["EtherRejecter"],
            reenterer=deployed["Reenterer"],
            errors=deployed["errors"],
        )
    finally:
        chain.revert(snap)
