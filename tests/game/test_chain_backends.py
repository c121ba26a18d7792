"""Chain backends: connect, accounts, funding, time travel, snapshots, anvil lifetime, JSON-RPC URLs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from game.chain.anvil import AnvilChain, find_anvil
from game.chain.backends import connect
from game.chain.base import TimeTravelUnsupported
from game.chain.deploy import deploy
from game.chain.embedded import EMBEDDED_BALANCE_ETH
from game.chain.rpc import RpcChain, load_account
from game.errors import ChainError, ConfigError

ETHER = 10**18


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purposes once reaped, check /proc state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_connect_unknownSpec_raisesConfigError() -> None:
    with pytest.raises(ConfigError, match="unknown chain"):
        connect("ganache")


def test_embedded_accounts_areFundedLocalAccountsWithTheirKeys(chain: Any) -> None:
    assert len(chain.accounts) == 10
    for acct in chain.accounts:
        assert Account.from_key(acct.key).address == acct.address
        assert chain.balance(acct.address) > (EMBEDDED_BALANCE_ETH - 100) * ETHER
    assert chain.kind == "embedded" and chain.supports_time_travel


def test_embedded_fund_newAccount_receivesExactly(chain: Any) -> None:
    stranger = chain.new_account(fund_wei=3 * ETHER)
    assert chain.balance(stranger.address) == 3 * ETHER
    chain.fund(stranger.address, 5)
    assert chain.balance(stranger.address) == 3 * ETHER + 5


def test_embedded_timeTravel_movesClockExactly(chain: Any) -> None:
    before = chain.now()
    after = chain.time_travel(12_345)
    assert after == before + 12_345 == chain.now()
    with pytest.raises(ValueError):
        chain.time_travel(-1)


def test_embedded_snapshotRevert_restoresBlocksBalancesAndNonces(chain: Any) -> None:
    a, b = chain.account(6), chain.account(7)
    snap = chain.snapshot()
    block, bal_b, nonce_a = chain.block_number(), chain.balance(b.address), chain.nonce(a.address)
    chain.fund(b.address, ETHER, sender=a)
    chain.time_travel(1000)
    assert chain.balance(b.address) == bal_b + ETHER
    chain.revert(snap)
    assert (chain.block_number(), chain.balance(b.address), chain.nonce(a.address)) == (block, bal_b, nonce_a)
    # the sender's cached nonce must not survive the revert
    chain.fund(b.address, 1, sender=a)
    assert chain.nonce(a.address) == nonce_a + 1


def test_embedded_transactionsFoundByPyEvmsIndex_asEthTestersWalkFindsThem_acrossARevert(
    chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mined transaction and its receipt come from py-evm's hash index, not from eth-tester's walk
    back over every block (which made each event scan cost the chain's length a transaction): the
    same values the walk gives, and after a revert the index follows the canonical chain."""
    import eth_tester.backends.pyevm.main as pyevm_main
    from eth_tester import PyEVMBackend
    from web3.exceptions import TransactionNotFound

    a, b = chain.account(6), chain.account(7)
    snap = chain.snapshot()
    first = chain.w3.eth.send_transaction({"from": a.address, "to": b.address, "value": 11})
    chain.mine(5)
    walked = PyEVMBackend.get_transaction_receipt(chain.backend, bytes(first))
    walked_tx = PyEVMBackend.get_transaction_by_hash(chain.backend, bytes(first))
    real_walk = pyevm_main._get_transaction_by_hash

    def no_walk(*args: Any) -> Any:
        raise AssertionError("a mined transaction was looked for by walking the blocks")

    monkeypatch.setattr(pyevm_main, "_get_transaction_by_hash", no_walk)
    assert chain.backend.get_transaction_receipt(bytes(first)) == walked
    assert chain.backend.get_transaction_by_hash(bytes(first)) == walked_tx
    chain.revert(snap)
    monkeypatch.setattr(
        pyevm_main, "_get_transaction_by_hash", real_walk
    )  # an unknown hash: the walk says so
    with pytest.raises(TransactionNotFound):
        chain.w3.eth.get_transaction_receipt(first)
    chain.mine(2)
    again = chain.w3.eth.send_transaction({"from": a.address, "to": b.address, "value": 11})
    assert again == first  # the same transaction, mined again two blocks later
    receipt = chain.w3.eth.get_transaction_receipt(again)
    assert receipt["blockNumber"] == walked["block_number"] + 2 and receipt["status"] == 1


def test_embedded_mine_addsBlocks(chain: Any) -> None:
    n = chain.block_number()
    chain.mine(3)
    assert chain.block_number() == n + 3


def test_embedded_contextManager_closes() -> None:
    with connect("embedded") as ch:
        assert not ch.closed
    assert ch.closed


def test_loadAccount_hexKeyWithOrWithout0x() -> None:
    key = "0x" + "11" * 32
    assert load_account(key).address == load_account(key[2:]).address == Account.from_key(key).address


def test_loadAccount_keystoreDecryptsWithEnvPassword(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    acct = Account.create()
    path = tmp_path / "key.json"
    path.write_text(json.dumps(Account.encrypt(acct.key, "s3cret", iterations=2)))
    monkeypatch.setenv("VGAME_KEYSTORE_PASSWORD", "s3cret")
    assert load_account(str(path)).address == acct.address
    monkeypatch.setenv("VGAME_KEYSTORE_PASSWORD", "wrong")
    with pytest.raises(ConfigError, match="decrypt"):
        load_account(str(path))


def test_loadAccount_nothingGiven_saysHowToGiveAKey(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VGAME_PRIVATE_KEY", raising=False)
    monkeypatch.delenv("VGAME_KEYSTORE", raising=False)
    with pytest.raises(ConfigError, match="VGAME_PRIVATE_KEY"):
        load_account(None)
    with pytest.raises(ConfigError):
        load_account("not-a-key-nor-a-file")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("0x1234", "a hex private key is 64 hex digits (32 bytes); this one has 4"),
        ("ab" * 31 + "zz", "neither a 64-hex-digit private key nor a keystore file"),
        ("keys/missing.json", "no keystore file at keys/missing.json"),
    ],
)
def test_loadAccount_badKey_saysWhatIsWrong_withoutEchoingAKey(given: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_account(given)
    assert says in str(caught.value)
    assert "abab" not in str(caught.value)  # a mistyped private key is not printed back


def test_loadAccount_keystore_notAKeystoreOrNoTerminal_isRefusedBeforeAnyPrompt(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VGAME_KEYSTORE_PASSWORD", raising=False)
    junk = tmp_path / "junk.json"
    junk.write_text('{"x": 1}')
    with pytest.raises(ConfigError, match=r"junk\.json is not an encrypted keystore"):
        load_account(str(junk))
    real = tmp_path / "key.json"
    real.write_text(json.dumps(Account.encrypt(Account.create().key, "pw", iterations=2)))
    monkeypatch.setattr("game.chain.rpc._has_terminal", lambda: False)  # a service: nobody to type it
    with pytest.raises(ConfigError, match="set VGAME_KEYSTORE_PASSWORD"):
        load_account(str(real))


def test_rpc_unreachableNode_raisesChainError() -> None:
    with pytest.raises(ChainError, match=r"^the JSON-RPC node at http://127.0.0.1:9 does not answer"):
        RpcChain("http://127.0.0.1:9", key="0x" + "11" * 32, timeout=2)  # said once, not twice


def test_findAnvil_badEnvPath_raisesConfigError(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("VGAME_ANVIL", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="VGAME_ANVIL"):
        find_anvil()


def test_findAnvil_inAnInstalledPackage_saysToPutAnvilOnPath(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import game.chain.anvil as anvil_mod

    monkeypatch.delenv("VGAME_ANVIL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no anvil on it
    monkeypatch.setattr(anvil_mod, "repo_root", lambda: tmp_path)  # site-packages: no contracts/ beside
    with pytest.raises(ConfigError, match=r"^anvil not found on PATH: install anvil") as caught:
        find_anvil()
    pinned = json.loads((Path(__file__).resolve().parents[2] / "contracts" / "package.json").read_text())
    assert f"npm install -g @foundry-rs/anvil@{pinned['dependencies']['@foundry-rs/anvil']}`" in str(
        caught.value
    )
    assert "npm ci --prefix contracts" not in str(caught.value)  # there is no contracts/ to run it in


@pytest.mark.anvil
def test_anvil_startStop_leavesNoProcess(anvil_chain: Any) -> None:
    pid = anvil_chain.pid
    assert _pid_alive(pid)
    assert anvil_chain.url.startswith("http://127.0.0.1:")
    assert anvil_chain.chain_id == 31337
    anvil_chain.close()
    assert not _pid_alive(pid)
    anvil_chain.close()  # idempotent


@pytest.mark.anvil
def test_anvil_exceptionInsideContext_stillStopsNode() -> None:
    try:
        find_anvil()
    except ConfigError as exc:
        pytest.skip(str(exc))
    pid = None
    with pytest.raises(RuntimeError, match="boom"), connect("anvil") as ch:
        pid = ch.pid
        raise RuntimeError("boom")
    assert pid is not None and not _pid_alive(pid)


@pytest.mark.anvil
def test_anvil_timeTravelSnapshotAndFunding(anvil_chain: Any) -> None:
    assert isinstance(anvil_chain, AnvilChain)
    acct = anvil_chain.account(0)
    assert Account.from_key(acct.key).address == acct.address
    snap = anvil_chain.snapshot()
    before = anvil_chain.now()
    assert anvil_chain.time_travel(600) >= before + 600
    stranger = anvil_chain.new_account(fund_wei=ETHER)
    assert anvil_chain.balance(stranger.address) == ETHER
    anvil_chain.revert(snap)
    assert anvil_chain.balance(stranger.address) == 0
    n = anvil_chain.block_number()
    anvil_chain.mine(2)
    assert anvil_chain.block_number() == n + 2


@pytest.mark.anvil
def test_rpcUrl_againstAnvil_deploysAndPlaysWithPrivateKey(anvil_chain: Any) -> None:
    from game.chain.client import VerificationGameClient

    key = "0x" + bytes(anvil_chain.account(1).key).hex()
    with connect(anvil_chain.url, key=key) as rpc:
        assert rpc.kind == "rpc" and rpc.chain_id == anvil_chain.chain_id
        assert rpc.accounts[0].address == anvil_chain.account(1).address
        with pytest.raises(TimeTravelUnsupported):
            rpc.time_travel(10)
        with pytest.raises(TimeTravelUnsupported):
            rpc.snapshot()
        address = deploy(rpc, rpc.accounts[0])
        client = VerificationGameClient(rpc, address, rpc.accounts[0])
        rec = client.create_task(
            b"\x01" * 32,
            anvil_chain.account(2).address,
            anvil_chain.account(3).address,
            key_hash=b"\x00" * 32,
            num_leaves=2,
            payment=ETHER,
            trainer_bond=1,
            auditor_bond=1,
            clock_allowance=60,
            challenge_window=60,
            judge_window=60,
            commit_window=60,
        )
        assert rec.result == 1 and client.task_count() == 1
        assert client.task(1).client == rpc.accounts[0].address


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_chainPackage_importsNoTorch() -> None:
    code = (
        "import sys\n"
        "import game.chain.client, game.bench.gas, game.chain.anvil, game.chain.rpc, game.chain.embedded\n"
        "import game.merkle\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.anvil
def test_anvil_keyboardInterrupt_nodeStoppedAtExit() -> None:
    try:
        find_anvil()
    except ConfigError as exc:
        pytest.skip(str(exc))
    code = (
        "from game.chain.backends import connect\n"
        "ch = connect('anvil')\n"
        "print(ch.pid, flush=True)\n"
        "raise KeyboardInterrupt\n"
    )
    proc = _run_python(code)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    pid = int(proc.stdout.split()[0])
    assert not _pid_alive(pid)


@pytest.mark.anvil
def test_wsUrl_againstAnvil_readsAndSends(anvil_chain: Any) -> None:
    key = "0x" + bytes(anvil_chain.account(4).key).hex()
    ws_url = anvil_chain.url.replace("http://", "ws://")
    with connect(ws_url, key=key) as rpc:
        assert rpc.chain_id == 31337 and rpc.block_number() == anvil_chain.block_number()
        to = anvil_chain.account(5).address
        before = rpc.balance(to)
        rpc.fund(to, 1234)
        assert anvil_chain.balance(to) == before + 1234


@pytest.mark.anvil
def test_anvil_refusal_decodedAlikeByPrecheckEstimateAndMinedRevert(anvil_chain: Any) -> None:
    from game.chain import errors as E
    from game.chain.client import ClientOptions, VerificationGameClient
    from game.chain.types import Phase
    from game.merkle import MerkleTree

    address = deploy(anvil_chain, anvil_chain.account(0))
    client, trainer, judge, auditor = (
        VerificationGameClient(anvil_chain, address, anvil_chain.account(i)) for i in range(4)
    )
    tid = client.create_task(
        b"\x01" * 32,
        trainer.me,
        judge.me,
        key_hash=b"\x00" * 32,
        num_leaves=9,
        payment=ETHER,
        trainer_bond=1,
        auditor_bond=1,
        clock_allowance=600,
        challenge_window=600,
        judge_window=600,
        commit_window=600,
    ).result
    trainer.accept(tid)
    tree = MerkleTree([bytes([i]) * 32 for i in range(9)])
    trainer.commit_tree(tid, tree, b"\x00" * 32, b"\x00" * 32)
    gid = auditor.challenge(tid).result
    expected = E.NotYourTurn(gid, Phase.AWAITING_REVEAL)
    for options, sent in ((ClientOptions(), 0), (ClientOptions(prechecks=False), 0),
                          (ClientOptions(prechecks=False, fixed_gas=200_000), 1)):  # fmt: skip
        actor = VerificationGameClient(anvil_chain, address, anvil_chain.account(3), options=options)
        nonce = anvil_chain.nonce(actor.me)
        with pytest.raises(E.NotYourTurn) as info:
            actor.respond(gid, True)
        assert info.value == expected
        assert anvil_chain.nonce(actor.me) == nonce + sent
