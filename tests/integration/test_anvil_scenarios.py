"""Scenarios and the client's commands on a real node: anvil, through the command line."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from game.cli import _register
from game.cli.app import app
from game.tasks import TaskTerms
from tests.procs import default_signals

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
    # the contract keeps only the burnt half of a lost trainer's bond
    assert doc["balances_ok"] is True and doc["contract_balance"] == doc["burnt"]
    assert doc["burnt"] == (0 if winner == "trainer" else TaskTerms().trainer_bond // 2)
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

    deployed = _json(runner, "task", "deploy", *common)
    contract = deployed["contract"]
    assert anvil_chain.w3.eth.get_transaction_receipt(deployed["tx_hash"])["blockNumber"] == deployed["block"]
    common += ["--contract", contract]
    config = tmp_path / "task.toml"
    config.write_text('preset = "mlp-digits"\nsteps = 5\n')
    key_file = tmp_path / "data.key"
    created = _json(
        runner,
        "task", "create", *common,
        "--config", str(config), "--trainer", trainer, "--judge", judge,
        "--payment", "0.000000000000001ether", "--window", "600", "--data-key-out", str(key_file),
    )  # fmt: skip
    task_id = created["task_id"]
    assert task_id == 1
    broke = runner.invoke(
        app,
        ["task", "create", *common, "--config", str(config), "--trainer", trainer, "--judge", judge,
         "--payment", str(10**30), "--data-key", str(key_file)],
    )  # fmt: skip
    assert type(broke.exception).__name__ == "InsufficientFunds", broke.output  # was web3's raw RPC error
    assert "ETH (1000000000000000000000000000000 wei) plus its gas" in str(broke.exception)
    key = bytes.fromhex(key_file.read_text())
    assert "data_key" not in created and created["data_key_file"] == str(key_file)  # never the key
    assert created["data_key_sha256"] == hashlib.sha256(key).hexdigest()
    # The key reaches its file before the task reaches the chain; a file holding another key is
    # never overwritten; a key no task holds (the contract or the funds refused) is not left behind.
    post = ["task", "create", *common, "--config", str(config), "--trainer", trainer, "--judge", judge]
    (tmp_path / "a-file").write_text("")
    for out, extra, said in (
        (key_file, [], "exists and holds another key"),
        (tmp_path / "a-file" / "key", [], "File exists"),  # main() adds what it means
        (tmp_path / "fresh.key", ["--payment", str(10**30)], "plus its gas"),
    ):
        res = runner.invoke(app, [*post, *extra, "--data-key-out", str(out)])
        assert res.exit_code != 0 and said in str(res.exception), (res.output, res.exception)
    assert bytes.fromhex(key_file.read_text()) == key and not (tmp_path / "fresh.key").exists()
    reused = _json(runner, *post, "--data-key", str(key_file), "--data-key-out", str(key_file))
    assert reused["task_id"] == 2  # none of the refused ones posted a task
    assert reused["data_key_sha256"] == created["data_key_sha256"]  # the key read from its file

    # Reading takes no key; anything that sends a transaction needs one.
    keyless = ["--chain", url, "--contract", contract]
    shown = _json(runner, "task", "show", str(task_id), *keyless)
    assert (shown["status"], shown["payment"], shown["challenge_window"]) == ("open", 1000, 600)
    assert shown["trainer"] == trainer and shown["spec_hash"] == created["spec_hash"]
    from_deploy = ["--from-block", str(deployed["block"])]  # scans start where the contract began
    assert _json(runner, "task", "show", str(task_id), *keyless, *from_deploy) == shown
    res = runner.invoke(app, ["task", "show", str(task_id), *keyless, "--from-block", str(10**9)])
    assert type(res.exception).__name__ == "ConfigError" and "after the chain's latest block" in str(
        res.exception
    )
    res = runner.invoke(
        app,
        ["task", "model", str(task_id), *keyless, "--store", str(tmp_path / "store"),
         "--data-key", str(key_file), "--out", str(tmp_path / "model.pt")],
    )  # fmt: skip
    assert type(res.exception).__name__ == "DeliveryError" and "no commitment yet" in str(res.exception)
    assert not (tmp_path / "model.pt").exists()
    res = runner.invoke(app, ["task", "cancel", str(task_id), *keyless])
    assert type(res.exception).__name__ == "ConfigError" and "signing key" in str(res.exception)

    res = runner.invoke(app, ["task", "finalize", str(task_id), *common])
    assert type(res.exception).__name__ == "WrongTaskStatus"  # an open task cannot be settled
    assert "task 1 is OPEN: an OPEN task can be accepted or cancelled" in str(res.exception)
    assert shown["key_hash"] == created["data_key_sha256"]  # the task commits to the key it was made with

    assert _json(runner, "task", "cancel", str(task_id), *common)["done"] is True
    reclaimed = _json(runner, "task", "reclaim", *common)
    assert (reclaimed["done"], reclaimed["amount"]) == (True, 1000)
    assert _json(runner, "task", "reclaim", *common)["done"] is False
    again = runner.invoke(app, ["task", "reclaim", *common])
    assert again.exit_code == 0 and "nothing reclaimed: this account has no credit" in again.stdout
    assert _json(runner, "task", "show", str(task_id), *keyless)["status"] == "cancelled"


def test_real_time_chain_waits_out_the_window(runner: CliRunner, tmp_path: Path) -> None:
    """A JSON-RPC chain (no time travel, one funded key): fresh parties, real waiting, exact money."""
    from game.chain.anvil import AnvilChain
    from game.chain.backends import connect
    from game.demo import run_scenario
    from game.tasks import TaskTerms
    from game.training.task.config import TaskConfig

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


def _children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid`` and their names, from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            found[int(stat.parent.name)] = name
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
def test_demo_onAnvil_stoppedBySigterm_stopsTheAnvilItStarted(runner: CliRunner, tmp_path: Path) -> None:
    argv = ["demo", "--scenario", "poison", "--chain", "anvil", "--workdir", str(tmp_path / "wd")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "game.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    anvil: list[int] = []
    deadline = time.monotonic() + 120
    while not anvil and proc.poll() is None and time.monotonic() < deadline:
        anvil = [pid for pid, name in _children(proc.pid).items() if name == "anvil"]
        time.sleep(0.02)
    assert len(anvil) == 1, proc.communicate(timeout=60)
    proc.send_signal(signal.SIGTERM)  # what `docker stop` or systemd sends
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.rstrip().endswith("interrupted: vgame demo (SIGTERM)"), stderr
    assert not Path(f"/proc/{anvil[0]}").exists()  # stopped and reaped, not left running alone
