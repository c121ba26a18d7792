"""`vgame node` as a long-lived process against a real JSON-RPC node (anvil): what it says when
the chain's clock stands still, when it is pointed at the wrong contract or task, when the RPC
node goes away and comes back, and when it is stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from game.chain.client import VerificationGameClient
from game.chain.deploy import deploy
from game.store.keys import new_key
from tests.procs import default_signals


def _accounts() -> list[Any]:
    """anvil's first three accounts (its default mnemonic): client, trainer, judge."""
    from eth_account import Account

    from game.chain.anvil import ANVIL_MNEMONIC

    Account.enable_unaudited_hdwallet_features()
    return [Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}") for i in range(3)]


def _key(account: Any) -> str:
    return "0x" + bytes(account.key).hex()


def _post_task(chain: Any, address: str) -> int:
    """A task of the client's with its trainer and judge (:func:`_accounts`); nobody commits to
    it, so its judge has nothing to do."""
    client_acct, trainer, judge = _accounts()
    client = VerificationGameClient(chain, address, client_acct)
    rec = client.create_task(
        b"\x01" * 32, trainer.address, judge.address, key_hash=b"\x02" * 32, num_leaves=17,
        payment=10**15, trainer_bond=10**14, auditor_bond=10**13,
        clock_allowance=600, challenge_window=600, judge_window=600, commit_window=600,
    )  # fmt: skip
    return int(rec.result or 0)


def _judge(url: str, address: str, task: int, key: str, workdir: Path, *extra: str) -> list[str]:
    """The command line of a judge node (polling every 0.2 s)."""
    args = ["node", "judge", "--chain", url, "--contract", address, "--task", str(task), "--key", key]
    args += ["--store", str(workdir / "store"), "--workdir", str(workdir / "judge"), "--poll", "0.2"]
    return [sys.executable, "-m", "game.cli", *args, "--data-key", new_key().hex(), *extra]


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as err:  # the child keeps its own descriptor
        return subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "COLUMNS": "400"},  # a warning is one line
            preexec_fn=default_signals,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.1)
    assert text in log.read_text(), log.read_text()


@pytest.mark.anvil
def test_node_on_a_chain_whose_clock_stands_still_says_so(tmp_path: Path) -> None:
    """anvil without --block-time mines only on transactions, so block time stops and deadlines never
    come due; an idle node says why once, rather than waiting in silence. Ctrl-C stops it, saying so."""
    from game.chain.anvil import AnvilChain
    from game.cli.nodeloop import STALE_BLOCK_S

    # The chain's clock starts an hour back: its latest block is old as soon as it is mined.
    with AnvilChain(extra_args=["--timestamp", str(int(time.time()) - 3600)]) as node:
        address = deploy(node, node.account(0))
        assert _post_task(node, address) == 1
        assert time.time() - node.now() > STALE_BLOCK_S
        log = tmp_path / "judge.err"
        proc = _start(_judge(node.url, address, 1, _key(_accounts()[2]), tmp_path), log)
        try:
            _wait_for(log, "latest block is", proc)
            time.sleep(2)  # some ten idle rounds more
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


@pytest.mark.anvil
def test_node_with_a_wrong_contract_task_or_profile_says_which_at_start(
    anvil_chain: Any, tmp_path: Path
) -> None:
    import torch

    address = deploy(anvil_chain, anvil_chain.account(0))
    _post_task(anvil_chain, address)
    nobody = "0x" + "11" * 20
    cases = [
        ("0xbad", [], "--contract '0xbad' is not an address"),
        (nobody, [], f"no contract at {nobody}"),  # all digits: its checksummed spelling too
        ("0x" + address[2:].swapcase(), [], "fails its checksum"),  # every letter in the other case
        (address, ["--task", "7"], "no task 7 in the game contract at"),
        (address, ["--profile", "nope"], "unknown profile 'nope'; valid: cpu-1t"),
    ]
    cases.append((address, ["--poll", "-1"], "Invalid value for '--poll'"))  # was a traceback from time.sleep
    cases.append((address, ["--poll", "0"], "Invalid value for '--poll'"))  # a loop that hammers the node
    cases.append((address, ["--save-every", "-1"], "Invalid value for '--save-every'"))
    cases.append(
        (address, ["--from-block", "1000000"], "--from-block 1000000 is after the chain's latest block")
    )
    cases.append((address, ["--from-block", "-1"], "Invalid value for '--from-block'"))
    if not torch.cuda.is_available():
        cases.append((address, ["--profile", "cuda"], "profile 'cuda' is not available on this machine"))
    for contract, extra, said in cases:
        argv = _judge(anvil_chain.url, contract, 1, _key(_accounts()[2]), tmp_path, *extra)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert said in " ".join(r.stderr.split()), r.stderr


@pytest.mark.anvil
def test_node_onAWorkdirAnotherNodeHolds_stopsAtOnceSayingSo(anvil_chain: Any, tmp_path: Path) -> None:
    """Two nodes on one workdir would write each other's state and transcript: the second stops."""
    from game.fsio import exclusive_directory

    address = deploy(anvil_chain, anvil_chain.account(0))
    _post_task(anvil_chain, address)
    argv = _judge(anvil_chain.url, address, 1, _key(_accounts()[2]), tmp_path)
    with exclusive_directory(tmp_path / "judge", "held by the test"):  # as a running node holds it
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said = " ".join(r.stderr.split())
    assert f"{tmp_path / 'judge'} is in use by another running node (the same --workdir)" in said, said
    assert "judge node for task 1 as" not in said  # it stopped before it began


@pytest.mark.anvil
def test_node_withAKeyThatIsNotTheRoles_saysWhoseKeyItNeeds(anvil_chain: Any, tmp_path: Path) -> None:
    """A judge node with another account's key would wait in silence for games it can never rule on
    (seen by hand: the judge's window ran out and the game ended void)."""
    address = deploy(anvil_chain, anvil_chain.account(0))
    _post_task(anvil_chain, address)
    _, trainer, judge = _accounts()
    as_judge = _judge(anvil_chain.url, address, 1, _key(trainer), tmp_path)
    as_auditor = _judge(anvil_chain.url, address, 1, _key(judge), tmp_path)
    as_auditor[as_auditor.index("judge")] = "auditor"
    for argv, said in (
        (as_judge, f"task 1's judge is {judge.address}, and the key given is {trainer.address}'s"),
        (
            as_auditor,
            "the key given is task 1's judge, which the contract does not let challenge its own task",
        ),
    ):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert said in " ".join(r.stderr.split()), r.stderr


def test_node_takesChainAndContractFromTheEnvironment_asTheTaskCommandsDo(tmp_path: Path) -> None:
    argv = _judge("unused", "unused", 1, "0x" + "11" * 32, tmp_path)
    for flag in ("--chain", "--contract"):
        i = argv.index(flag)
        del argv[i : i + 2]
    env = {**os.environ, "VGAME_CHAIN": "http://127.0.0.1:9", "VGAME_CONTRACT": "0xbad", "COLUMNS": "400"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "the JSON-RPC node at http://127.0.0.1:9 does not answer" in r.stderr, (
        r.stderr
    )


class _AnvilOnPort:
    """anvil on a port of our choosing, with its state in a file: stopped and started again, it is
    the same chain at the same address, as a restarted RPC node is."""

    def __init__(self, state: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.state = state
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from web3 import Web3

        from game.chain.anvil import ANVIL_MNEMONIC, find_anvil

        args = [str(find_anvil()), "--port", str(self.port), "--mnemonic", ANVIL_MNEMONIC]
        args += ["--block-time", "1", "--state", str(self.state)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        w3 = Web3(Web3.HTTPProvider(self.url))
        end = time.monotonic() + 30
        while not w3.is_connected() and time.monotonic() < end:
            time.sleep(0.1)
        assert w3.is_connected(), "anvil did not come up"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # anvil writes its state on the way out
            self.proc.wait(30)


@pytest.mark.anvil
def test_node_rides_out_an_rpc_outage(tmp_path: Path) -> None:
    """The RPC node goes away and comes back: a `vgame node` warns once while it is gone and
    carries on (it died with a requests traceback)."""
    from game.chain.backends import connect

    client_key, judge_key = _key(_accounts()[0]), _key(_accounts()[2])
    node = _AnvilOnPort(tmp_path / "anvil-state.json")
    node.start()
    try:
        with connect(node.url, key=client_key) as chain:
            address = deploy(chain, chain.account(0))
            assert _post_task(chain, address) == 1
        log = tmp_path / "judge.err"
        proc = _start(_judge(node.url, address, 1, judge_key, tmp_path), log)
        try:
            _wait_for(log, "judge node for task 1", proc)
            node.stop()
            _wait_for(log, "does not answer", proc)  # the outage, warned of
            time.sleep(6)  # a few more rounds of it
            assert proc.poll() is None, log.read_text()  # lived through,
            assert log.read_text().count("does not answer") == 1  # and said so once
            node.start()
            with connect(node.url, key=client_key) as chain:  # the same chain, back
                VerificationGameClient(chain, address, chain.account(0)).cancel(1)
            assert proc.wait(60) == 0, log.read_text()  # it saw the cancel: its task is settled
        finally:
            if proc.poll() is None:
                proc.kill()
        assert "judge node: task 1 is done" in log.read_text()
    finally:
        node.stop()


@pytest.mark.anvil
@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_rpc_chain_reports_a_lost_node_and_reconnects(tmp_path: Path, scheme: str) -> None:
    """A node gone is one NodeUnreachable (not a requests or websockets error); back, the same
    RpcChain works again (the websocket provider connects afresh)."""
    from game.chain.backends import connect
    from game.errors import NodeUnreachable

    node = _AnvilOnPort(tmp_path / "anvil-state.json")
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
        node.stop()


@pytest.mark.anvil
def test_node_onAChainReset_stopsWithOneErrorLine_notATraceback(tmp_path: Path) -> None:
    """anvil started afresh (its state gone): no code at the game's address any more. Every running
    node died with an eth_abi InsufficientDataBytes traceback (exit code 1); a reset is no outage to
    wait out, so the node stops at once, saying why in one line (exit code 2)."""
    from game.chain.backends import connect

    state = tmp_path / "anvil-state.json"
    node = _AnvilOnPort(state)
    node.start()
    try:
        with connect(node.url, key=_key(_accounts()[0])) as chain:
            address = deploy(chain, chain.account(0))
            assert _post_task(chain, address) == 1
        log = tmp_path / "judge.err"
        proc = _start(_judge(node.url, address, 1, _key(_accounts()[2]), tmp_path), log)
        try:
            _wait_for(log, "judge node for task 1", proc)
            node.stop()
            state.unlink()  # the chain starts again from genesis
            node.start()
            assert proc.wait(60) == 2, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        node.stop()
    err = log.read_text()
    assert "Traceback" not in err and "InsufficientDataBytes" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith(f"error: the game contract is gone from {address} on JSON-RPC {node.url}"), err
    assert "no code at that address (the chain was reset" in last and "the address is wrong" in last


@pytest.mark.anvil
def test_node_printsTheDataKeyNowhere_givenAsHexOrAsAFile(anvil_chain: Any, tmp_path: Path) -> None:
    """A judge node with the key on its command line (the worst case), for people and ``--json``,
    and with the key's file: its output holds the key in no form."""
    from tests.keycheck import assert_key_absent

    address = deploy(anvil_chain, anvil_chain.account(0))
    task = _post_task(anvil_chain, address)
    key = new_key()
    key_file = tmp_path / "data.key"
    key_file.write_text(key.hex() + "\n")
    key_file.chmod(0o600)
    runs: list[tuple[Path, bool, subprocess.Popen[bytes]]] = []
    for name, given, as_json in (
        ("hex", key.hex(), False),
        ("hex-json", key.hex(), True),
        ("file", str(key_file), False),
    ):
        argv = _judge(anvil_chain.url, address, task, _key(_accounts()[2]), tmp_path / name)
        argv[argv.index("--data-key") + 1] = given
        out = tmp_path / f"{name}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [*argv, *(["--json"] if as_json else [])], stdout=sink, stderr=subprocess.STDOUT
            )
        runs.append((out, as_json, proc))
    try:
        for out, as_json, proc in runs:
            if not as_json:  # for people it says when it is up; --json says nothing
                _wait_for(out, "judge node for task", proc)
        time.sleep(1)  # a few idle rounds each
        VerificationGameClient(anvil_chain, address, _accounts()[0]).cancel(task)  # the task settles
        for out, _, proc in runs:
            assert proc.wait(60) == 0, out.read_text()
    finally:
        for _, _, proc in runs:
            if proc.poll() is None:
                proc.kill()
    for out, as_json, _ in runs:
        assert as_json != ("is done" in out.read_text()), out.read_text()
        assert_key_absent(out.read_bytes(), key, out.name)
        if as_json:  # its last line says the work is over, and how the task ended
            last = json.loads(out.read_text().strip().splitlines()[-1])
            assert (last["actor"], last["what"], last["task_id"]) == ("judge", "done", task)
            assert last["detail"] == f"task {task} cancelled"


def test_progressBars_showWhileWorkRuns_andGoWhenItEnds() -> None:
    """A node's bar lives only as long as its work: a node idles for hours with no live display."""
    import io

    from rich.console import Console

    from game.cli.nodeloop import ProgressBars

    out = io.StringIO()
    bars = ProgressBars("task 3", Console(file=out, force_terminal=True, width=100))
    for done in range(1, 5):
        bars("train", done, 8)
        assert bars.bars is not None and bars.bars.live.is_started
    bars("train", 8, 8)
    assert bars.bars is None  # the work ended: no live display left
    assert "train (task 3)" in out.getvalue()
    bars("replay", 1, 2)  # the next work gets a bar of its own
    assert bars.bars is not None
    bars.close()
    assert bars.bars is None


class _Agent:
    """An agent whose rounds raise what it is given, in turn, then report done."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.rounds = 0

    @property
    def done(self) -> bool:
        return not self.failures

    def step(self) -> list[Any]:
        self.rounds += 1
        if self.failures:
            raise self.failures.pop(0)
        return []


class _Clock:
    def now(self) -> int:
        return int(time.time())


def test_node_run_fileErrorStopsSayingHowToGoOn_networkErrorIsRiddenOut(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import requests

    from game.agents import AgentError, NotThereYet
    from game.cli.nodeloop import run

    flaky = _Agent(
        requests.ConnectionError("connection refused"),
        ConnectionResetError("reset by peer"),
        NotThereYet("the transcript of task 1 is not in the store yet"),
    )
    run(flaky, _Clock(), poll=0, as_json=False, label="auditor node: task 1")  # type: ignore[arg-type]
    assert flaky.rounds == 3 and flaky.done
    warned = " ".join(capsys.readouterr().err.split())
    assert "warning: the transcript of task 1 is not in the store yet" in warned
    full = _Agent(OSError(28, "No space left on device"))
    with pytest.raises(AgentError) as caught:
        run(full, _Clock(), poll=0, as_json=True, label="trainer node: task 1")  # type: ignore[arg-type]
    said = str(caught.value)
    assert said.startswith("trainer node: task 1 stopped: [Errno 28] No space left on device")
    assert "run the same command to go on" in said


def test_node_run_aContractGoneFromItsAddress_stopsTheNode_notWarnedOfAndTriedAgain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ChainError is warned of and tried again next round (an outage passes); a contract gone
    from its address (the chain was reset) does not come back: the node stops, saying so."""
    from game.cli.nodeloop import run
    from game.errors import ContractGone

    gone = _Agent(ContractGone("the game contract is gone from 0x11"), ContractGone("again"))
    with pytest.raises(ContractGone, match="is gone from 0x11"):
        run(gone, _Clock(), poll=0, as_json=False, label="judge node: task 1")  # type: ignore[arg-type]
    assert gone.rounds == 1 and "warning" not in capsys.readouterr().err


class _IdleAgent:
    """An agent with nothing to do for ``rounds`` rounds, then done."""

    def __init__(self, rounds: int) -> None:
        self.left = rounds

    @property
    def done(self) -> bool:
        return self.left == 0

    def step(self) -> list[Any]:
        self.left -= 1
        return []


class _CountingClock(_Clock):
    def __init__(self) -> None:
        self.asked = 0

    def now(self) -> int:
        self.asked += 1
        return super().now()


def test_node_idle_looksAtTheChainsClock_onceInAWhile_notEveryRound() -> None:
    """An idle node asked for the latest block every round (every 2 s by default) only to see
    whether the chain's clock stands still: most of its requests to a public endpoint."""
    from game.cli.nodeloop import CLOCK_CHECK_S, run

    clock = _CountingClock()
    started = time.monotonic()
    run(_IdleAgent(200), clock, poll=0.001, as_json=True, label="judge node: task 1")  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert took < CLOCK_CHECK_S  # so one look is all there is room for
    assert clock.asked == 1


def test_node_trainer_checksItsConfigBeforeAskingAnyNode(tmp_path: Path) -> None:
    bad = tmp_path / "task.toml"
    bad.write_text('preset = "mlp-digits"\nlr = -1.0\n')
    base = [sys.executable, "-m", "game.cli", "node", "trainer", "--chain", "http://127.0.0.1:9",
            "--key", "0x" + "11" * 32, "--contract", "0x" + "22" * 20, "--task", "1",
            "--store", str(tmp_path / "s"), "--workdir", str(tmp_path / "w"), "--data-key", new_key().hex()]  # fmt: skip
    for extra, said in (([], "needs the task config"), (["--config", str(bad)], "lr: -1.0 is outside")):
        r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and said in r.stderr, r.stderr
        assert "does not answer" not in r.stderr  # nothing listens on port 9: no node was asked
