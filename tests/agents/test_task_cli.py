"""The client's part: the ``game.tasks`` API on the embedded chain and ``vgame task`` without a node."""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from game.chain.errors import WrongTaskStatus
from game.chain.types import TaskStatus
from game.cli import _register
from game.cli.app import app
from game.cli.keys import read_data_key
from game.errors import ConfigError
from game.store.keys import key_fingerprint, new_key
from game.store.sealing import StoreError
from game.tasks import REALTIME_TERMS, TaskTerms, describe_task, finalize_if_due, post_task, reclaim
from game.training.task.config import TaskConfig
from tests.keycheck import assert_key_absent

SPEC = TaskConfig.for_preset("mlp-digits", steps=3).spec_hash()
NUM_LEAVES = 4  # steps + 1


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def _post(game_client: Callable[..., Any], terms: TaskTerms | None = None) -> tuple[Any, int]:
    client = game_client("client")
    rec = post_task(
        client,
        SPEC,
        key_hash=b"\x00" * 32,
        num_leaves=NUM_LEAVES,
        trainer=game_client("trainer").me,
        judge=game_client("judge").me,
        terms=terms or TaskTerms(),
    )
    assert rec.result is not None
    return client, rec.result


def test_post_then_describe_shows_the_terms(game_client: Callable[..., Any]) -> None:
    client, task_id = _post(game_client, REALTIME_TERMS)
    doc = describe_task(client, task_id)
    assert doc["status"] == "open" and doc["games"] == []
    assert doc["spec_hash"] == SPEC.hex()
    assert doc["trainer"] == game_client("trainer").me and doc["judge"] == game_client("judge").me
    for k, v in REALTIME_TERMS.to_dict().items():
        assert doc[k] == v
    assert doc["trainer_paid"] is None
    json.dumps(doc)  # plain JSON all the way down


def test_post_withATrainerAddressMistyped_isRefusedAndPostsNothing(game_client: Callable[..., Any]) -> None:
    client, before = _post(game_client)
    trainer = game_client("trainer").me
    i = next(i for i, ch in enumerate(trainer) if i >= 2 and ch.isalpha())
    typo = trainer[:i] + trainer[i].swapcase() + trainer[i + 1 :]  # one letter's case: the checksum fails
    balance = client.chain.balance(client.me)
    with pytest.raises(ConfigError, match=f"trainer {typo} fails its checksum"):
        post_task(
            client,
            SPEC,
            key_hash=b"\x00" * 32,
            num_leaves=NUM_LEAVES,
            trainer=typo,
            judge=game_client("judge").me,
            terms=TaskTerms(),
        )
    assert client.chain.balance(client.me) == balance  # no payment escrowed, no gas spent
    assert _post(game_client)[1] == before + 1  # and no task was made


def test_cancel_then_reclaim_returns_the_payment(game_client: Callable[..., Any]) -> None:
    client, task_id = _post(game_client)
    chain = client.chain
    assert finalize_if_due(client, task_id) is None  # nothing to settle before a commit
    assert reclaim(client) is None  # nothing owed yet
    before = chain.balance(client.me)
    cancel = client.cancel(task_id)
    assert client.task(task_id).status == TaskStatus.CANCELLED
    rec = reclaim(client)
    assert rec is not None
    fees = 0
    for r in (cancel, rec):
        receipt = chain.w3.eth.get_transaction_receipt(r.tx_hash)
        fees += receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert chain.balance(client.me) - before == TaskTerms().payment - fees
    with pytest.raises(WrongTaskStatus):
        client.cancel(task_id)


@pytest.mark.parametrize(
    "bad", [{"payment": 0}, {"trainer_bond": -1}, {"clock_allowance": 0}, {"challenge_window": 2**32}]
)
def test_terms_are_checked(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        TaskTerms(**bad)


def test_keygen_writesAPrivateKey_andPrintsItNowhere(runner: CliRunner, tmp_path: Path) -> None:
    """The key goes to its file alone: ``--json`` gives the file and the key's SHA-256 fingerprint
    (it gave the key, which a terminal's scrollback or a CI log then kept)."""
    out = tmp_path / "keys" / "task.key"
    res = runner.invoke(app, ["task", "keygen", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    key = bytes.fromhex(out.read_text().strip())
    assert len(key) == 32 and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert json.loads(res.stdout) == {"file": str(out), "data_key_sha256": hashlib.sha256(key).hexdigest()}
    assert_key_absent(res.output + res.stderr, key)
    res = runner.invoke(app, ["task", "keygen", "--out", str(out)])  # it may be a task's only copy
    assert isinstance(res.exception, ConfigError) and "exists and holds another key" in str(res.exception)
    assert out.read_text().strip() == key.hex()
    fresh = tmp_path / "fresh.key"
    res = runner.invoke(app, ["task", "keygen", "--out", str(fresh)])
    assert res.exit_code == 0 and f"--data-key {fresh}" in " ".join(res.stdout.split())
    assert_key_absent(res.output + res.stderr, bytes.fromhex(fresh.read_text().strip()))
    assert fresh.read_text() != out.read_text()
    for json_flag in ([], ["--json"]):  # no file to keep it in: refused, not printed
        res = runner.invoke(app, ["task", "keygen", *json_flag])
        assert isinstance(res.exception, ConfigError) and "pass --out FILE" in str(res.exception)
        assert res.stdout == ""


def test_dataKey_isTakenFromItsFile_orAsHex(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from game.cli.keys import read_data_key

    key = new_key()
    (tmp_path / "data.key").write_text(key.hex() + "\n")
    (tmp_path / "data.key").chmod(0o600)
    assert read_data_key(str(tmp_path / "data.key")) == key
    assert capsys.readouterr().err == ""
    (tmp_path / "data.key").chmod(0o644)  # written by hand (`echo ... > data.key`): readable by all
    assert read_data_key(str(tmp_path / "data.key")) == key
    said = " ".join(capsys.readouterr().err.split())
    assert "(mode 644) can be read by other users" in said and key.hex() not in said
    assert read_data_key("0x" + key.hex()) == key == read_data_key(key.hex())
    with pytest.raises(ConfigError, match=r"--data-key data\.kye: no such file, and not a data key"):
        read_data_key("data.kye")  # a typo of the file's name is named as such
    (tmp_path / "junk.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match=r"junk\.key: the file does not hold a data key"):
        read_data_key(str(tmp_path / "junk.key"))
    with pytest.raises(StoreError, match="64 hex characters"):
        read_data_key("ab" * 31)
    with pytest.raises(ConfigError, match=r"mistyped key\? not shown") as caught:
        read_data_key(f"'{key.hex()}'")  # a key with a stray quote is not named in the error
    assert_key_absent(str(caught.value), key)


@pytest.mark.parametrize(
    ("chain", "warned"), [("https://rpc.example.org", True), ("http://127.0.0.1:8545", False)]
)
def test_aRawDataKeyInArgv_isWarnedAbout(
    chain: str, warned: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from game.cli.keys import warn_data_key_in_argv

    warn_data_key_in_argv("cd" * 32, chain)
    said = " ".join(capsys.readouterr().err.split())
    assert ("the data key given with --data-key can be read by every user" in said) is warned
    assert "cd" * 32 not in said
    (tmp_path / "data.key").write_text("cd" * 32)
    warn_data_key_in_argv(str(tmp_path / "data.key"), chain)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("chain", ["embedded", "anvil", ""])
def test_task_commands_need_a_running_node(runner: CliRunner, chain: str) -> None:
    res = runner.invoke(app, ["task", "show", "1", "--chain", chain, "--contract", "0x" + "11" * 20])
    assert isinstance(res.exception, ConfigError)
    assert "JSON-RPC URL" in str(res.exception)


@pytest.mark.parametrize(
    ("text", "wei"),
    [
        ("1000", 1000),
        ("0.001ether", 10**15),
        ("0.001 ETH", 10**15),
        ("5gwei", 5 * 10**9),
        (".5ether", 5 * 10**17),
    ],
)
def test_amounts_takeWeiOrAUnit_exactly(text: str, wei: int) -> None:
    from game.cli.task import parse_wei

    assert parse_wei(text) == wei


@pytest.mark.parametrize(
    ("text", "says"), [("1.5", "whole number of wei"), ("1e18", "not an amount"), ("2 btc", "not an amount")]
)
def test_amounts_notAnAmount_saySo(runner: CliRunner, text: str, says: str) -> None:
    res = runner.invoke(
        app, ["task", "create", "--config", "x.toml", "--trainer", "0x1", "--judge", "0x2", "--payment", text]
    )
    assert res.exit_code == 2 and says in res.output


def test_taskCreate_withoutAKeptDataKey_isRefusedBeforeAnyNodeIsAsked(
    runner: CliRunner, tmp_path: Path
) -> None:
    """A fresh key printed only (to a pipe, `--json | jq .task_id`) was a task whose data nobody
    could read: the key must go to a file, or come from one."""
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\n')
    res = runner.invoke(
        app,
        ["task", "create", "--chain", "http://127.0.0.1:9", "--key", "0x" + "11" * 32, "--contract",
         "0x" + "22" * 20, "--config", str(tmp_path / "task.toml"), "--trainer", "0x" + "33" * 20,
         "--judge", "0x" + "44" * 20],
    )  # fmt: skip
    assert isinstance(res.exception, ConfigError), res.output  # nothing listens on port 9: not asked
    assert "--data-key-out FILE" in str(res.exception) and "does not answer" not in str(res.exception)


def test_taskCreate_withAnEvidenceDirThatIsAFile_isRefusedBeforeAnyNodeIsAsked(
    runner: CliRunner, tmp_path: Path
) -> None:
    """Found only after the post, the directory's error was a traceback that hid the posted task's
    id; it is now refused first, and nothing is posted or written."""
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\n')
    (tmp_path / "evidence").write_text("a file\n")
    res = runner.invoke(
        app,
        ["task", "create", "--chain", "http://127.0.0.1:9", "--key", "0x" + "11" * 32, "--contract",
         "0x" + "22" * 20, "--config", str(tmp_path / "task.toml"), "--trainer", "0x" + "33" * 20,
         "--judge", "0x" + "44" * 20, "--data-key-out", str(tmp_path / "k"),
         "--evidence-dir", str(tmp_path / "evidence")],
    )  # fmt: skip
    assert isinstance(res.exception, ConfigError), res.output  # nothing listens on port 9: not asked
    assert "--evidence-dir" in str(res.exception) and "does not answer" not in str(res.exception)
    assert not (tmp_path / "k").exists()  # no key file made for a task that was not posted


@contextmanager
def _on(client: Any) -> Iterator[Any]:
    """``_client`` for the embedded chain, which the task commands refuse (it lives one command)."""
    yield client


@pytest.mark.parametrize("given", ["out", "file", "hex"])
@pytest.mark.parametrize("as_json", [False, True])
def test_taskCreate_printsTheKeysFileAndFingerprint_neverTheKey(
    runner: CliRunner,
    game_client: Callable[..., Any],
    game_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    as_json: bool,
) -> None:
    """``--json`` gave the key as ``data_key`` (and the human output, a key given as hex)."""
    import game.cli.task as task_cli

    monkeypatch.setattr(task_cli, "_client", lambda *a, **k: _on(game_client("client")))
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\n')
    key_file = tmp_path / "data.key"
    key = new_key()
    if given != "out":
        key_file.write_text(key.hex() + "\n")
        key_file.chmod(0o600)
    key_args = {
        "out": ["--data-key-out", str(key_file)],
        "file": ["--data-key", str(key_file)],
        "hex": ["--data-key", key.hex()],
    }[given]
    res = runner.invoke(
        app,
        ["task", "create", "--chain", "http://127.0.0.1:9", "--contract", game_address,
         "--config", str(tmp_path / "task.toml"), "--trainer", game_client("trainer").me,
         "--judge", game_client("judge").me, *key_args, *(["--json"] if as_json else [])],
    )  # fmt: skip
    assert res.exit_code == 0, (res.output, res.exception)
    if given == "out":
        key = bytes.fromhex(key_file.read_text().strip())
    assert_key_absent(res.output + res.stderr, key)
    shown_file = None if given == "hex" else str(key_file)
    if as_json:
        doc = json.loads(res.stdout)
        assert "data_key" not in doc and doc["data_key_file"] == shown_file
        assert doc["data_key_sha256"] == hashlib.sha256(key).hexdigest()
    else:
        where = f"in {key_file}" if shown_file else "the one given with --data-key"
        assert f"data key {where}" in " ".join(res.stdout.split())


def test_taskCreate_fixesTheConfigsLeafCount_andATruncatedCommitIsRefused(
    runner: CliRunner,
    game_client: Callable[..., Any],
    game_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44 (truncated commitment): ``task create`` posts the config's steps + 1 as the task's
    leaf count (the user gives nothing new), and a trainer committing fewer leaves, N = 1 (the
    initial state only) or N = 3, is refused by the client and by the contract."""
    import game.cli.task as task_cli
    from game.chain import errors as E
    from game.merkle import MerkleTree

    monkeypatch.setattr(task_cli, "_client", lambda *a, **k: _on(game_client("client")))
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\nsteps = 16\n')
    res = runner.invoke(
        app,
        ["task", "create", "--chain", "http://127.0.0.1:9", "--contract", game_address,
         "--config", str(tmp_path / "task.toml"), "--trainer", game_client("trainer").me,
         "--judge", game_client("judge").me, "--data-key-out", str(tmp_path / "k"), "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, (res.output, res.exception)
    doc = json.loads(res.stdout)
    task_id = int(doc["task_id"])
    trainer = game_client("trainer")
    task = trainer.task(task_id)
    assert task.num_leaves == 17
    # the key's hash is derived from the key written, like the fingerprint the command prints
    assert (
        task.key_hash.hex() == doc["data_key_sha256"] == key_fingerprint(read_data_key(str(tmp_path / "k")))
    )
    trainer.accept(task_id)
    for n in (1, 3):
        short = MerkleTree([bytes([i]) * 32 for i in range(n)])
        for who in (trainer, trainer.with_options(prechecks=False)):  # the client's check, the contract's
            with pytest.raises(E.LeafCountMismatch) as info:
                who.commit_tree(task_id, short, b"\x00" * 32, b"\x00" * 32)
            assert (info.value.expected, info.value.given) == (17, n)


@pytest.mark.parametrize("as_json", [False, True])
def test_taskCreate_withAnEvidenceDir_leavesTheConfigWhereAnAuditorFindsIt(
    runner: CliRunner,
    game_client: Callable[..., Any],
    game_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    as_json: bool,
) -> None:
    """An auditor replays a withheld transcript's log from the chain only with the task's config;
    the client's ``task create`` left none. With ``--evidence-dir`` it leaves it there under the
    posted spec hash, held to it as a node reading it holds it."""
    import game.cli.task as task_cli
    from game.evidencedir import read_task_config

    monkeypatch.setattr(task_cli, "_client", lambda *a, **k: _on(game_client("client")))
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\nsteps = 5\n')
    evidence = tmp_path / "shared" / "evidence"
    res = runner.invoke(
        app,
        ["task", "create", "--chain", "http://127.0.0.1:9", "--contract", game_address,
         "--config", str(tmp_path / "task.toml"), "--trainer", game_client("trainer").me,
         "--judge", game_client("judge").me, "--data-key-out", str(tmp_path / "k"),
         "--evidence-dir", str(evidence), *(["--json"] if as_json else [])],
    )  # fmt: skip
    assert res.exit_code == 0, (res.output, res.exception)
    task_id = int(json.loads(res.stdout)["task_id"]) if as_json else int(res.stdout.split()[1])
    spec = game_client("auditor").task(task_id).spec_hash
    cfg = read_task_config(evidence, spec)
    assert cfg is not None and cfg.steps == 5 and cfg.spec_hash() == spec
    if as_json:
        assert json.loads(res.stdout)["config_left"] == str(evidence / f"{spec.hex()}.task.json")
    else:
        assert "left at" in res.stdout


@pytest.fixture
def committed_task(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    data_key: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, Path]:
    """A task the trainer committed to (its challenge window open), the CLI's client the task's
    client, and the data key in a file: ``(task id, key file)``."""
    import game.cli.task as task_cli
    from tests.agents.conftest import commit, small_config

    cfg = small_config(steps=2)
    task_id = post_task(cfg)
    commit(make_agents(task_id, cfg), roles["client"], task_id)
    monkeypatch.setattr(task_cli, "_client", lambda *a, **k: _on(roles["client"]))
    key_file = tmp_path / "data.key"
    key_file.write_text(data_key.hex() + "\n")
    key_file.chmod(0o600)
    return task_id, key_file


def _task_model(runner: CliRunner, roles: dict[str, Any], store: Any, task_id: int, *args: str) -> Any:
    return runner.invoke(
        app,
        ["task", "model", str(task_id), "--chain", "http://127.0.0.1:9", "--contract", roles["client"].address,
         "--store", str(store.root), *args],
    )  # fmt: skip


@pytest.mark.parametrize("as_json", [False, True])
def test_taskModel_printsTheDataKeyNowhere(
    runner: CliRunner,
    roles: dict[str, Any],
    store: Any,
    data_key: bytes,
    tmp_path: Path,
    committed_task: tuple[int, Path],
    as_json: bool,
) -> None:
    task_id, key_file = committed_task
    for i, given in enumerate((str(key_file), data_key.hex())):
        res = _task_model(
            runner, roles, store, task_id, "--data-key", given, "--out", str(tmp_path / f"model{i}.pt"),
            "--accept-unsettled", *(["--json"] if as_json else []),
        )  # fmt: skip
        assert res.exit_code == 0, (res.output, res.exception)
        assert (tmp_path / f"model{i}.pt").is_file()
        assert_key_absent(res.output + res.stderr, data_key)


@pytest.mark.parametrize("as_json", [False, True])
def test_taskModel_exitsOneUntilSettled_unlessAcceptUnsettled(
    runner: CliRunner,
    roles: dict[str, Any],
    store: Any,
    tmp_path: Path,
    committed_task: tuple[int, Path],
    as_json: bool,
) -> None:
    """A script that ships the file only when the command succeeds never ships a model that can still
    be shown wrong: while the challenge window is open the model is written and the exit code is 1,
    with the reason; --accept-unsettled takes it with exit 0; once finalized, exit 0 without it."""
    task_id, key_file = committed_task

    def model(out: str, *extra: str) -> Any:
        return _task_model(
            runner, roles, store, task_id, "--data-key", str(key_file), "--out", str(tmp_path / out),
            *(["--json"] if as_json else []), *extra,
        )  # fmt: skip

    res = model("open.pt")
    assert res.exit_code == 1, (res.output, res.exception)
    assert (tmp_path / "open.pt").is_file()
    said = " ".join(res.stderr.split())
    assert "not settled" in said and "challenge window is open" in said and "--accept-unsettled" in said
    if as_json:
        assert json.loads(res.stdout)["settled"] is False
    res = model("accepted.pt", "--accept-unsettled")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "not settled" not in res.stderr

    client = roles["client"]
    client.chain.time_travel(client.task(task_id).window_ends - client.chain.now() + 1)
    client.finalize(task_id)
    res = model("settled.pt")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "not settled" not in res.stderr


def test_taskShow_forPeople_amountsInEthTimesInUtcAndFromNow() -> None:
    from game.cli.units import shown

    now = 1_800_000_000  # 2027-01-15 08:00:00 UTC
    assert shown("payment", 10**15, now=now) == "0.001 ETH (1000000000000000 wei)"
    assert shown("auditor_bond", 10**18, now=now) == "1 ETH (1000000000000000000 wei)"
    assert shown("challenge_window", 86400 + 3661, now=now) == "1d 1h 1m 1s (90061 s)"
    assert shown("window_ends", now + 5400, now=now) == "2027-01-15 09:30:00 UTC (1h 30m from now)"
    assert shown("window_ends", now - 60, now=now) == "2027-01-15 07:59:00 UTC (1m ago)"
    assert shown("window_ends", 0, now=now).startswith("not started")
    assert shown("state_root", "00" * 32, now=now) == "none yet"
    assert shown("state_root", "ab" * 32, now=now) == "ab" * 32
    assert shown("trainer_paid", None, now=now) == "not settled yet"
    assert shown("status", "open", now=now) == "open"


@pytest.mark.parametrize(
    ("chain", "warned"),
    [
        ("https://rpc.example.org", True),
        ("wss://10.1.2.3:8546", True),
        ("http://127.0.0.1:8545", False),  # a local anvil: its development keys are public anyway
        ("http://localhost:8545", False),
        ("http://[::1]:8545", False),
        ("anvil", False),
        ("embedded", False),
    ],
)
def test_aRawKeyInArgvForAChainOffThisMachine_isWarnedAbout(
    chain: str, warned: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from game.cli.keys import warn_key_in_argv

    warn_key_in_argv("0x" + "ab" * 32, chain)
    said = capsys.readouterr().err
    assert ("can be read by every user of this machine" in said) is warned
    assert "ab" * 32 not in said  # never the key itself
    keystore = tmp_path / "key.json"
    keystore.write_text("{}")
    warn_key_in_argv(str(keystore), chain)  # a file's name in argv gives nothing away
    warn_key_in_argv(None, chain)
    assert capsys.readouterr().err == ""
