"""``vgame demo`` from the command line: the --json document, the people's view, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from game.cli import _register
from game.cli.app import app
from game.scenarios import SCENARIO_NAMES
from tests.keycheck import assert_key_absent
from tests.procs import default_signals

JSON_KEYS = {
    "scenario",
    "disputed_step",
    "winner",
    "trainer_paid",
    "moves",
    "transactions",
    "gas_total",
    "balances_ok",
    "trainer_profile",
    "auditor_profile",
}
TINY = ["--preset", "mlp-digits", "--steps", "4"]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def test_json_document_has_the_promised_shape(runner: CliRunner) -> None:
    res = runner.invoke(app, ["demo", "--scenario", "poison", *TINY, "--poison-step", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) >= JSON_KEYS
    assert doc["scenario"] == "poison"
    assert (doc["disputed_step"], doc["winner"], doc["trainer_paid"]) == (3, "auditor", False)
    assert doc["balances_ok"] is True
    assert doc["trainer_profile"] != doc["auditor_profile"]
    assert doc["moves"] >= 2 and doc["transactions"] > doc["moves"]
    tx_gas = [a["gas_used"] for a in doc["actions"] if a["tx_hash"]]
    assert doc["gas_total"] == sum(tx_gas) and len(tx_gas) == doc["transactions"]


def test_profiles_are_chosen_on_the_command_line(runner: CliRunner) -> None:
    args = ["demo", "-s", "honest", *TINY, "--trainer-profile", "splitk-64", "--auditor-profile", "cpu-1t"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["trainer_profile"], doc["auditor_profile"], doc["winner"]) == (
        "splitk-64",
        "cpu-1t",
        "trainer",
    )


def test_people_see_the_moves_and_a_verdict(runner: CliRunner) -> None:
    res = runner.invoke(app, ["demo", "--scenario", "wrong-lr", *TINY])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in ("moves", "challenge", "reveal", "respond", "rule", "verdict: wrong-lr", "balances add up"):
        assert text in out, text


@pytest.mark.parametrize("as_json", [False, True])
def test_theDemo_printsItsDataKeyNowhere(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    """The demo makes a data key of its own for its task: it stays inside the process."""
    import game.store.keys

    key = game.store.keys.new_key()  # the one the demo will make
    monkeypatch.setattr(game.store.keys, "new_key", lambda: key)
    res = runner.invoke(app, ["demo", "--scenario", "poison", *TINY, *(["--json"] if as_json else [])])
    assert res.exit_code == 0, res.output
    assert_key_absent(res.output + res.stderr, key)


def _vgame(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "game.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_unknown_scenario_is_a_clear_error() -> None:
    res = _vgame("demo", "--scenario", "nope")
    assert res.returncode == 2
    assert "unknown scenario 'nope'" in res.stderr
    for name in SCENARIO_NAMES:
        assert name in res.stderr
    assert res.stdout == ""


def test_help_lists_every_scenario() -> None:
    res = _vgame("demo", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for name in SCENARIO_NAMES:
        assert name in text


def test_same_profile_for_both_sides_is_refused() -> None:
    res = _vgame("demo", "-s", "honest", *TINY, "--trainer-profile", "noisy", "--auditor-profile", "noisy")
    assert res.returncode == 2
    assert "different profiles" in res.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--steps", "0"], "steps: 0 is outside"),
        (["--poison-step", "99"], "must be in 1..4"),
        (["--judge-profile", "nope"], "unknown profile 'nope'"),
        (["--chain", "http://127.0.0.1:9"], "the JSON-RPC node at http://127.0.0.1:9 does not answer"),
    ],
)
def test_badArguments_areOneLineBeforeTheLiveTableIsDrawn(extra: list[str], said: str) -> None:
    # the steps and the poison step used to be checked inside the run, under an empty table of moves
    res = _vgame("demo", *TINY, *extra)
    assert res.returncode == 2 and said in " ".join(res.stderr.split()), res.stderr
    assert res.stdout == ""


def test_aProfileThisMachineCannotRun_isRefusedBeforeTraining() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine runs cuda")
    res = _vgame("demo", *TINY, "--auditor-profile", "cuda")  # it trained first and failed at the replay
    assert res.returncode == 2 and "profile 'cuda' is not available on this machine" in res.stderr
    assert res.stdout == ""


def test_interruptedIntoAFile_theTableEndsItsLine_beforeTheInterruptedLine(tmp_path: Path) -> None:
    """Output sent to a file or a pipe: the live table is drawn once, when it stops, and an
    interrupted run's "interrupted:" line went on the table's last line."""
    import signal
    import time

    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [sys.executable, "-m", "game.cli", "demo", "--preset", "mlp-digits", "--steps", "20000",
         "--workdir", str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_signals,
    )  # fmt: skip
    end = time.monotonic() + 120
    while not any(workdir.rglob("leaves*")) and time.monotonic() < end:  # training: the table is live
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "└" in out  # the table was drawn
    assert "\ninterrupted: vgame demo" in out, out[-300:]
