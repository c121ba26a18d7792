"""What every ``vgame`` command offers and refuses (issue 44): help on every option, one meaning of
``--chain``, no option that does nothing for a role, and error lines that start with words."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from game.cli import _register
from game.cli.app import app, error_line
from game.errors import ConfigError
from game.store.keys import new_key

NOBODY = "http://127.0.0.1:9"  # nothing listens there: a command that gets that far asked a node
CONTRACT = "0x" + "22" * 20


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def _commands() -> Iterator[tuple[str, Any]]:
    """Every leaf command as ``("vgame task show", command)``."""
    _register()

    def walk(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield path, cmd
            return
        for name, sub in subs.items():
            yield from walk(sub, f"{path} {name}")

    yield from walk(typer.main.get_command(app), "vgame")


def _options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if type(p).__name__.endswith("Option")]


def test_everyCommand_andEveryOption_hasHelpText() -> None:
    commands = dict(_commands())
    assert {"vgame node", "vgame task show", "vgame task model", "vgame demo", "vgame bench gas"} <= set(
        commands
    )
    missing = [
        f"{path} {'/'.join(getattr(p, 'opts', [p.name]))}"
        for path, cmd in commands.items()
        for p in cmd.params  # options and arguments
        if not (getattr(p, "help", None) or "").strip()
    ]
    assert missing == []
    assert [path for path, cmd in commands.items() if not (cmd.help or "").strip()] == []


def test_readingCommands_takeNoKey_andTheirHelpSaysSo() -> None:
    """``task show`` and ``task model`` said "needs no --key" and listed --key, which did nothing."""
    commands = dict(_commands())
    for path in ("vgame task show", "vgame task model"):
        cmd = commands[path]
        assert all("--key" not in p.opts for p in _options(cmd)), path
        assert "takes no key" in cmd.help and "``" not in cmd.help, path
    for path in ("vgame task create", "vgame task cancel", "vgame task finalize", "vgame task reclaim"):
        assert any("--key" in p.opts for p in _options(commands[path])), path  # they sign


def test_everyChainOption_saysWhatTheFreshChainsAre() -> None:
    """``--chain`` means one thing everywhere: embedded and anvil are fresh chains that end with the
    command, a URL a running node. Each command's help says which of them it takes."""
    helps = {
        path: next(p.help for p in _options(cmd) if "--chain" in p.opts)
        for path, cmd in _commands()
        if any("--chain" in p.opts for p in _options(cmd))
    }
    assert {"vgame demo", "vgame node", "vgame task create", "vgame bench gas", "vgame bench game"} <= set(
        helps
    )
    for path, text in helps.items():
        assert "fresh" in text and ("anvil" in text), (path, text)
        assert ("URL" in text) or path.startswith("vgame bench"), (path, text)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["task", "show", "1", "--chain", "anvil", "--contract", CONTRACT], "--chain anvil is a fresh chain that ends"),
        (["task", "create", "--chain", "embedded"], "--chain embedded is a fresh chain that ends with this command"),
        (["node", "judge", "--chain", "anvil"], "--chain anvil is a fresh chain that ends with this command, but a node"),
        (["node", "judge"], "--chain is required: the JSON-RPC URL of a running node"),
        (["node", "judge", "--chain", "bogus"], "--chain 'bogus' is not a chain: give the JSON-RPC URL"),
        (["bench", "gas", "--chain", NOBODY], "which a running node does not allow; use --chain embedded or --chain anvil"),
        (["bench", "game", "--chain", NOBODY], "which a running node does not allow; use --chain embedded or --chain anvil"),
        (["demo", "--chain", "bogus"], "give embedded, anvil (each a fresh chain for this command) or the JSON-RPC URL"),
    ],
)  # fmt: skip
def test_chain_meansOneThing_andACommandThatCannotUseAKindSaysWhatToPass(
    runner: CliRunner, args: list[str], says: str, tmp_path: Path
) -> None:
    if args[0] == "node":
        args = [*args, "--contract", CONTRACT, "--task", "1", "--store", str(tmp_path / "s")]
        args += ["--workdir", str(tmp_path / "w"), "--data-key", new_key().hex()]
    if args[:2] == ["task", "create"]:
        args += ["--config", "c.toml", "--trainer", CONTRACT, "--judge", CONTRACT, "--data-key-out", "k"]
    res = runner.invoke(app, args, env={"VGAME_CHAIN": ""})
    assert isinstance(res.exception, ConfigError), (res.output, res.exception)
    assert says in str(res.exception)
    if "fresh chain that ends" in says:  # and the fix: a chain that outlives the command, by its URL
        assert "--chain http://127.0.0.1:8545" in str(res.exception)


def _node(role: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["node", role, "--chain", NOBODY, "--contract", CONTRACT, "--task", "1",
            "--store", str(tmp_path / "s"), "--workdir", str(tmp_path / "w"), "--data-key", new_key().hex(), *extra]  # fmt: skip


ROLE_TAKES = {
    "trainer": "a trainer node takes --config, --rehearse, --min-payment, --max-bond, --min-clock, "
    "--max-challenge-window, --commit-margin, --max-chunk-bytes and --allow-client-judge",
    "auditor": "an auditor node takes --config, --strategy, --seed, --save-every, --max-log-pieces and --evidence-dir",
    "judge": "a judge node takes --evidence-dir",
}


@pytest.mark.parametrize(
    ("role", "extra", "owner"),
    [
        ("trainer", ["--strategy", "lying"], "auditor"),
        ("trainer", ["--seed", "3"], "auditor"),
        ("trainer", ["--save-every", "5"], "auditor"),
        ("trainer", ["--evidence-dir", "e"], "auditor and the judge"),
        ("auditor", ["--rehearse", "poison@2"], "trainer"),
        ("judge", ["--strategy", "honest"], "auditor"),  # the default, given: it still does nothing here
        ("judge", ["--seed", "0"], "auditor"),
        ("judge", ["--save-every", "300"], "auditor"),
        ("judge", ["--config", "c.toml"], "trainer and the auditor"),
        ("judge", ["--rehearse", "steer@1"], "trainer"),
        ("auditor", ["--min-payment", "1ether"], "trainer"),
        ("judge", ["--max-bond", "5"], "trainer"),
        ("auditor", ["--min-clock", "60"], "trainer"),
        ("judge", ["--max-challenge-window", "3600"], "trainer"),
        ("judge", ["--commit-margin", "3"], "trainer"),
        ("auditor", ["--max-chunk-bytes", "4096"], "trainer"),
        ("auditor", ["--allow-client-judge"], "trainer"),
        ("trainer", ["--max-log-pieces", "600"], "auditor"),
        ("judge", ["--max-log-pieces", "600"], "auditor"),
    ],
)
def test_node_anOptionThatDoesNothingForTheRole_isRefused_namingWhatTheRoleTakes(
    runner: CliRunner, tmp_path: Path, role: str, extra: list[str], owner: str
) -> None:
    res = runner.invoke(app, _node(role, tmp_path, *extra))
    assert isinstance(res.exception, ConfigError), (res.output, res.exception)
    said = str(res.exception)
    article = "an" if role == "auditor" else "a"
    assert said.startswith(f"{extra[0]} does nothing for {article} {role} node: it is the {owner} node's.")
    assert said.endswith(f"Besides the options every node takes, {ROLE_TAKES[role]}")


def test_node_theOptionsARoleTakes_passTheCheck_andReachTheChain(runner: CliRunner, tmp_path: Path) -> None:
    """Each role's own options get past the check (to the chain, where nothing answers)."""
    config = tmp_path / "task.toml"
    config.write_text('preset = "mlp-digits"\nsteps = 4\n')
    for role, extra in (
        ("trainer", ["--config", str(config), "--rehearse", "wrong-lr@4"]),
        (
            "trainer",
            [
                "--config",
                str(config),
                "--min-payment",
                "0.001ether",
                "--max-bond",
                "5gwei",
                "--min-clock",
                "60",
                "--max-challenge-window",
                "3600",
                "--commit-margin",
                "3",
                "--max-chunk-bytes",
                "4096",
                "--allow-client-judge",
            ],
        ),
        (
            "auditor",
            [
                "--config",
                str(config),
                "--strategy",
                "lying",
                "--seed",
                "3",
                "--save-every",
                "5",
                "--max-log-pieces",
                "2048",
                "--evidence-dir",
                "e",
            ],
        ),
        ("judge", ["--evidence-dir", "e"]),
    ):
        res = runner.invoke(app, _node(role, tmp_path, *extra))
        assert "does not answer" in str(res.exception), (role, res.exception)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["node", "auditor", "--seed", "3"], "--seed does nothing for --strategy honest, which draws nothing at random"),
        (["node", "auditor", "--strategy", "silent-after-challenge", "--seed", "3"], "it is for --strategy lying"),
        (["demo", "--seed", "3"], "--seed does nothing in scenario 'poison'"),
        (["demo", "-s", "honest", "--seed", "3"], "it seeds the lying auditor of false-alarm"),
        (["demo", "--key", "0x" + "ab" * 32], "--key does nothing with --chain embedded, which funds its own accounts"),
        (["demo", "--chain", "anvil", "--key", "0x" + "ab" * 32], "--key does nothing with --chain anvil"),
        (["demo", "-s", "honest", "--judge-profile", "cpu-2t"], "--judge-profile does nothing in scenario 'honest'"),
        (["demo", "-s", "trainer-timeout", "--judge-profile", "cpu-2t"], "no judge re-runs a step: it is for poison,"),
        (["audit", "--transcript", "t", "--profile", "cpu-1t", "--save-every", "3"], "--save-every does nothing without --keep-progress"),
    ],
)  # fmt: skip
def test_anOptionThatWouldDoNothingHere_isRefused(
    runner: CliRunner, tmp_path: Path, args: list[str], says: str
) -> None:
    if args[0] == "node":
        args = _node(args[1], tmp_path, *args[2:])
    res = runner.invoke(app, args)
    assert isinstance(res.exception, ConfigError), (res.output, res.exception)
    assert says in str(res.exception)


def test_contractErrors_forPeople_startWithWhatTheyMean_andKeepTheRawFormLast() -> None:
    """``TaskNotFound(task_id=99): ...`` was the error line; now the meaning comes first."""
    from game.chain import errors as E

    classes = [*E.ERROR_CLASSES.values(), E.RevertedWithReason, E.ContractPanic, E.EmptyRevert]
    for cls in classes:
        exc = cls(*[0] * len(cls.params))
        line = error_line(exc)
        assert not line.startswith(cls.__name__) and line.endswith(f"[{exc.raw}]"), line
        assert str(exc).startswith(f"{cls.__name__}(")  # scripts and logs keep the raw form first
    assert error_line(E.TaskNotFound(99)) == (
        "there is no task 99 in this game contract (is this the contract it was posted to?) "
        "[TaskNotFound(task_id=99)]"
    )
    unknown = E.decode_revert(b"\xde\xad\xbe\xef")
    assert error_line(unknown).startswith("unknown error selector 0xdeadbeef")
    assert error_line(NotADirectoryError(20, "Not a directory", "a-file/d")) == "a-file/d: Not a directory"


@pytest.mark.anvil
def test_errorLines_ofTheTaskCommands_startWithWords_notAPythonRepr(anvil_chain: Any, tmp_path: Path) -> None:
    from game.chain.deploy import deploy

    address = deploy(anvil_chain, anvil_chain.account(0))
    key = "0x" + bytes(anvil_chain.account(0).key).hex()
    common = ["--chain", anvil_chain.url, "--contract", address]
    for args in (
        ["task", "show", "99", *common],
        ["task", "cancel", "99", *common, "--key", key],
        ["task", "finalize", "99", *common, "--key", key],
        ["task", "model", "99", *common, "--store", str(tmp_path / "s"), "--out", str(tmp_path / "m.pt"),
         "--data-key", new_key().hex()],
    ):  # fmt: skip
        r = subprocess.run(
            [sys.executable, "-m", "game.cli", *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2, r.stderr
        line = " ".join(r.stderr.split())
        assert line == (
            "error: there is no task 99 in this game contract (is this the contract it was posted to?) "
            "[TaskNotFound(task_id=99)]"
        ), (args, r.stderr)


def test_psTrain_aModeOrAnOutItCannotUse_isOneLine_beforeRayStarts(runner: CliRunner, tmp_path: Path) -> None:
    """Ray's start-up takes seconds and prints its own notices: a run that cannot be says so first."""
    ray = pytest.importorskip("ray")
    from game.errors import TranscriptError
    from game.training.engine.train import train
    from game.training.task.config import TaskConfig

    task = ["--preset", "mlp-digits", "--model", "hidden=16", "--steps", "2"]
    bad = runner.invoke(app, ["ps", "train", "--mode", "asink", *task, "--out", str(tmp_path / "a")])
    assert isinstance(bad.exception, ConfigError), bad.output
    assert str(bad.exception).startswith(
        "parameter-server mode 'asink' is not one of sync, async, sync-chain"
    )
    bad = runner.invoke(app, ["ps", "train", "--mode", "async", *task, "--out", str(tmp_path / "b")])
    assert "mode 'async': the task is synchronous (max_staleness 0)" in str(bad.exception)
    done = tmp_path / "done"
    train(TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, steps=2), "cpu-1t", done)
    bad = runner.invoke(app, ["ps", "train", *task, "--out", str(done)])
    assert isinstance(bad.exception, TranscriptError) and "already holds a finished transcript" in str(
        bad.exception
    )
    assert not ray.is_initialized()


def test_aNameTheUserChose_isPrintedAsItIs_notAsAnEmoji() -> None:
    """``trained tasks:llama: 3 steps`` printed a llama: rich turns ``:name:`` into an emoji."""
    from game.cli.app import console, err_console

    for out in (console, err_console):
        with out.capture() as captured:
            out.print("trained hf_tasks.tasks:llama: 3 steps, :cat: and :smile:")
        assert "tasks:llama: 3 steps, :cat: and :smile:" in captured.get()
