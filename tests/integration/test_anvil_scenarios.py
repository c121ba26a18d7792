"""Scenarios and the client's commands on a real node: anvil, through the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from game.cli import _register
from game.cli.app import app

pytestmark = pytest.mark.anvil

TINY = ["--preset", "mlp-digits", "--steps", "5"]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    from game.chain.anvil import find_anvil
    from game.errors import ConfigError

    try:
        find_anvil()
    except ConfigError as exc:
        pytest.skip(str(exc))
    _register()
    return CliRunner()


def _json(runner: CliRunner, *args: str) -> dict[str, Any]:
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.mark.parametrize(
    ("scenario", "extra", "winner", "step"),
    [("honest", [], "trainer", None), ("poison", ["--poison-step", "2"], "auditor", 2)],
)
def test_scenario_on_anvil(
    runner: CliRunner, scenario: str, extra: list[str], winner: str, step: int | None
) -> None:
    doc = _json(runner, "demo", "--scenario", scenario, "--chain", "anvil", *TINY, *extra)
    assert doc["chain"] == "anvil"
    assert (doc["winner"], doc["disputed_step"], doc["trainer_paid"]) == (winner, step, winner == "trainer")
    assert doc["balances_ok"] is True and doc["contract_balance"] == 0
    assert doc["balances"]["trainer"]["gas_cost"] > 0


def test_task_commands_against_a_running_node(
    runner: CliRunner, anvil_chain: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("VGAME_PRIVATE_KEY", "VGAME_KEYSTORE"):
        monkeypatch.delenv(name, raising=False)
    url = anvil_chain.url
    client_key = "0x" + bytes(anvil_chain.account(0).key).hex()
    trainer, judge = anvil_chain.account(1).address, anvil_chain.account(2).address
    common = ["--chain", url, "--key", client_key]

    contract = _json(runner, "task", "deploy", *common)["contract"]
    common += ["--contract", contract]
    config = tmp_path / "task.toml"
    config.write_text('preset = "mlp-digits"\nsteps = 5\n')
    key_file = tmp_path / "data.key"
    created = _json(
        runner,
        "task", "create", *common,
        "--config", str(config), "--trainer", trainer, "--judge", judge,
        "--payment", "1000", "--window", "600", "--data-key-out", str(key_file),
    )  # fmt: skip
    task_id = created["task_id"]
    assert task_id == 1
    assert key_file.read_text().strip() == created["data_key"]

    shown = _json(runner, "task", "show", str(task_id), *common)
    assert (shown["status"], shown["payment"], shown["challenge_window"]) == ("open", 1000, 600)
    assert shown["trainer"] == trainer and shown["spec_hash"] == created["spec_hash"]
    # Reading needs no key; anything that sends a transaction still does.
    keyless = ["--chain", url, "--contract", contract]
    assert _json(runner, "task", "show", str(task_id), *keyless) == shown
    res = runner.invoke(app, ["task", "cancel", str(task_id), *keyless])
    assert type(res.exception).__name__ == "ConfigError" and "signing key" in str(res.exception)

    res = runner.invoke(app, ["task", "finalize", str(task_id), *common])
    assert type(res.exception).__name__ == "WrongTaskStatus"  # an open task cannot be settled

    assert _json(runner, "task", "cancel", str(task_id), *common)["done"] is True
    reclaimed = _json(runner, "task", "reclaim", *common)
    assert (reclaimed["done"], reclaimed["amount"]) == (True, 1000)
    assert _json(runner, "task", "reclaim", *common)["done"] is False
    assert _json(runner, "task", "show", str(task_id), *common)["status"] == "cancelled"


def test_real_time_chain_waits_out_the_window(runner: CliRunner, tmp_path: Path) -> None:
    """A JSON-RPC chain (no time travel, one funded key): fresh parties, real waiting, exact money."""
    from game.chain.anvil import AnvilChain
    from game.chain.backends import connect
    from game.demo import run_scenario
    from game.tasks import TaskTerms
    from game.training.config import TaskConfig

    cfg = TaskConfig.for_preset("mlp-digits", steps=3, batch_size=8, model={"hidden": 16})
    terms = TaskTerms(
        payment=10**15,
        trainer_bond=10**14,
        auditor_bond=10**13,
        clock_allowance=30,
        challenge_window=6,
        judge_window=30,
    )
    with AnvilChain(extra_args=["--block-time", "1"]) as node:
        key = "0x" + bytes(node.account(0).key).hex()
        with connect(node.url, key=key) as chain:
            assert not chain.supports_time_travel and len(chain.accounts) == 1
            result = run_scenario("honest", config=cfg, chain=chain, terms=terms, workdir=tmp_path)
    assert result.chain == "rpc"
    assert (result.winner, result.trainer_paid, result.balances_ok) == ("trainer", True, True)
    addresses = {b.address for b in result.balances.values()}
    assert len(addresses) == 4  # three fresh accounts besides the funding key


def test_node_on_a_chain_whose_clock_stands_still_says_so(tmp_path: Path) -> None:
    """anvil without --block-time mines only on transactions, so block time stops and deadlines never
    come due; an idle node says why once, rather than waiting in silence. Ctrl-C stops it, saying so."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from game.chain.anvil import AnvilChain
    from game.chain.client import VerificationGameClient
    from game.chain.deploy import deploy
    from game.cli.node import STALE_BLOCK_S
    from game.store import new_key

    # The chain's clock starts an hour back: its latest block is old as soon as it is mined.
    with AnvilChain(extra_args=["--timestamp", str(int(time.time()) - 3600)]) as node:
        address = deploy(node, node.account(0))
        client = VerificationGameClient(node, address, node.account(0))
        rec = client.create_task(
            b"\x01" * 32, node.account(1).address, node.account(2).address,
            payment=10**15, trainer_bond=10**14, auditor_bond=10**13,
            clock_allowance=600, challenge_window=600, judge_window=600,
        )  # fmt: skip
        assert rec.result == 1  # the judge's task: open, so the judge has nothing to do yet
        assert time.time() - node.now() > STALE_BLOCK_S
        args = ["node", "judge", "--chain", node.url, "--contract", address, "--task", "1"]
        args += ["--store", str(tmp_path / "store"), "--workdir", str(tmp_path / "judge")]
        args += [
            "--key",
            "0x" + bytes(node.account(2).key).hex(),
            "--data-key",
            new_key().hex(),
            "--poll",
            "0.1",
        ]
        log = tmp_path / "judge.err"
        with log.open("w") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "game.cli", *args],
                stdout=subprocess.DEVNULL,
                stderr=err_file,
                env={**os.environ, "COLUMNS": "400"},  # one warning, one line
            )
            try:
                end = time.monotonic() + 60
                while "latest block is" not in log.read_text() and time.monotonic() < end:
                    time.sleep(0.2)
                time.sleep(2)  # some 20 idle rounds more
                proc.send_signal(signal.SIGINT)
                assert proc.wait(30) == 130
            finally:
                proc.kill()
                proc.wait()
        err = log.read_text()
    warnings = [line for line in err.splitlines() if "latest block is" in line]
    assert len(warnings) == 1, err  # once, however long it waits
    assert "--block-time 1" in warnings[0]
    assert err.splitlines()[-1] == "stopped: judge node for task 1; run the same command to go on"


def test_node_with_a_wrong_contract_or_task_says_which(anvil_chain: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    from game.chain.deploy import deploy
    from game.store import new_key

    address = deploy(anvil_chain, anvil_chain.account(0))
    nobody = "0x" + "11" * 20

    def node(contract: str) -> subprocess.CompletedProcess[str]:
        args = ["node", "judge", "--chain", anvil_chain.url, "--contract", contract, "--task", "7"]
        args += [
            "--store",
            str(tmp_path / "s"),
            "--workdir",
            str(tmp_path / "w"),
            "--data-key",
            new_key().hex(),
        ]
        args += ["--key", "0x" + bytes(anvil_chain.account(2).key).hex()]
        return subprocess.run(
            [sys.executable, "-m", "game.cli", *args], capture_output=True, text=True, timeout=120
        )

    for contract, said in [
        ("0xbad", "--contract '0xbad' is not an address"),
        (nobody, f"no contract at {nobody}"),  # all digits: its checksummed spelling too
        (address, "no task 7 in the game contract at"),
    ]:
        r = node(contract)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert said in " ".join(r.stderr.split()), r.stderr


class _AnvilOnPort:
    """anvil on a port of our choosing, with its state in a file: stopped and started again, it is
    the same chain at the same address, as a restarted RPC node is."""

    def __init__(self, port: int, state: Path) -> None:
        self.port, self.state = port, state
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Any = None

    def start(self) -> None:
        import subprocess
        import time

        from web3 import Web3

        from game.chain.anvil import ANVIL_MNEMONIC, find_anvil

        args = [
            str(find_anvil()),
            "--port",
            str(self.port),
            "--mnemonic",
            ANVIL_MNEMONIC,
            "--block-time",
            "1",
        ]
        self.proc = subprocess.Popen(
            [*args, "--state", str(self.state)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        w3 = Web3(Web3.HTTPProvider(self.url))
        end = time.monotonic() + 30
        while not w3.is_connected() and time.monotonic() < end:
            time.sleep(0.1)
        assert w3.is_connected(), "anvil did not come up"

    def stop(self) -> None:
        self.proc.terminate()  # anvil writes its state on the way out
        self.proc.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_node_rides_out_an_rpc_outage(tmp_path: Path) -> None:
    """The RPC node goes away and comes back: a `vgame node` warns while it is gone and carries on
    (it died with a requests traceback)."""
    import os
    import subprocess
    import sys
    import time

    from game.chain.backends import connect
    from game.chain.client import VerificationGameClient
    from game.chain.deploy import deploy
    from game.store import new_key

    node = _AnvilOnPort(_free_port(), tmp_path / "anvil-state.json")
    node.start()
    try:
        keys = []
        with connect("anvil") as scratch:  # anvil's accounts, by the same mnemonic
            keys = ["0x" + bytes(scratch.account(i).key).hex() for i in range(3)]
        with connect(node.url, key=keys[0]) as chain:
            address = deploy(chain, chain.account(0))
            client = VerificationGameClient(chain, address, chain.account(0))
            judge_address = chain.w3.eth.account.from_key(keys[2]).address
            client.create_task(
                b"\x01" * 32, chain.w3.eth.account.from_key(keys[1]).address, judge_address,
                payment=10**15, trainer_bond=10**14, auditor_bond=10**13,
                clock_allowance=600, challenge_window=600, judge_window=600,
            )  # fmt: skip
        args = ["node", "judge", "--chain", node.url, "--contract", address, "--task", "1", "--poll", "0.2"]
        args += [
            "--store",
            str(tmp_path / "s"),
            "--workdir",
            str(tmp_path / "w"),
            "--data-key",
            new_key().hex(),
        ]
        log = tmp_path / "judge.err"
        with log.open("w") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "game.cli", *args, "--key", keys[2]],
                stdout=subprocess.DEVNULL,
                stderr=err_file,
                env={**os.environ, "COLUMNS": "400"},
            )
            try:

                def wait_for(text: str) -> None:
                    end = time.monotonic() + 60
                    while text not in log.read_text() and proc.poll() is None and time.monotonic() < end:
                        time.sleep(0.1)
                    assert text in log.read_text(), log.read_text()

                wait_for("judge node for task 1")
                node.stop()
                wait_for("does not answer")  # the outage, warned of
                time.sleep(6)  # a few more rounds of it
                assert proc.poll() is None, log.read_text()  # lived through,
                assert log.read_text().count("does not answer") == 1  # and said so once
                node.start()
                with connect(node.url, key=keys[0]) as chain:  # the same chain, back
                    VerificationGameClient(chain, address, chain.account(0)).cancel(1)
                assert proc.wait(60) == 0, log.read_text()  # it saw the cancel: its task is settled
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert "judge node: task 1 is done" in log.read_text()
    finally:
        if node.proc.poll() is None:
            node.stop()


@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_rpc_chain_reports_a_lost_node_and_reconnects(tmp_path: Path, scheme: str) -> None:
    """A node gone is one NodeUnreachable (not a requests or websockets error); back, the same
    RpcChain works again (the websocket provider connects afresh)."""
    from game.chain.backends import connect
    from game.errors import NodeUnreachable

    node = _AnvilOnPort(_free_port(), tmp_path / "anvil-state.json")
    node.start()
    try:
        with connect(node.url.replace("http", scheme, 1), reads_only=True) as chain:
            before = chain.block_number()
            node.stop()
            with pytest.raises(NodeUnreachable, match="does not answer"):
                chain.block_number()
            node.start()
            assert chain.block_number() >= before
    finally:
        if node.proc.poll() is None:
            node.stop()
