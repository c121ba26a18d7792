"""A rehearsed cheating trainer across processes (issue 44): three ``vgame node`` processes on one
anvil, the trainer run with ``--rehearse poison@2``; the auditor catches it at step 2, and the
trainer says at every turn that it is a rehearsal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from game.chain.client import VerificationGameClient
from game.chain.deploy import deploy
from game.chain.types import Outcome
from game.store.keys import key_hash, new_key
from game.training.task.config import load_config
from tests.procs import default_signals

TASK_TOML = """preset = "mlp-digits"
steps = 4
batch_size = 8
checkpoint_interval = 2

[model]
hidden = 16
"""


def _key(account: Any) -> str:
    return "0x" + bytes(account.key).hex()


@pytest.mark.anvil
def test_rehearsedPoison_acrossNodeProcesses_isCaughtAtItsStep_andSaysItIsARehearsal(tmp_path: Path) -> None:
    from game.chain.anvil import AnvilChain, find_anvil
    from game.errors import ConfigError

    try:
        find_anvil()
    except ConfigError as exc:
        pytest.skip(str(exc))
    config = tmp_path / "task.toml"
    config.write_text(TASK_TOML)
    cfg = load_config(config)
    key_file = tmp_path / "data.key"
    data_key = new_key()
    key_file.write_text(data_key.hex() + "\n")
    key_file.chmod(0o600)
    with AnvilChain(extra_args=["--block-time", "1"]) as chain:
        client_acct, trainer, judge, auditor = (chain.account(i) for i in range(4))
        address = deploy(chain, client_acct)
        client = VerificationGameClient(chain, address, client_acct)
        task_id = client.create_task(
            cfg.spec_hash(), trainer.address, judge.address, key_hash=key_hash(data_key),
            num_leaves=cfg.num_leaves, payment=10**15, trainer_bond=10**14, auditor_bond=10**13,
            clock_allowance=300, challenge_window=90, judge_window=300, commit_window=600,
        ).result  # fmt: skip
        common = ["--chain", chain.url, "--contract", address, "--task", str(task_id), "--store",
                  str(tmp_path / "store"), "--data-key", str(key_file), "--poll", "0.2"]  # fmt: skip
        roles = {
            "trainer": [*common, "--key", _key(trainer), "--config", str(config), "--rehearse", "poison@2"],
            "auditor": [*common, "--key", _key(auditor), "--profile", "noisy", "--evidence-dir", str(tmp_path / "ev")],
            "judge": [*common, "--key", _key(judge), "--profile", "splitk-16", "--evidence-dir", str(tmp_path / "ev")],
        }  # fmt: skip
        procs = {}
        for role, args in roles.items():
            argv = [sys.executable, "-m", "game.cli", "node", role, *args, "--workdir", str(tmp_path / role)]
            with (tmp_path / f"{role}.out").open("w") as out, (tmp_path / f"{role}.err").open("w") as err:
                procs[role] = subprocess.Popen(
                    [*argv, "--json"], stdout=out, stderr=err, preexec_fn=default_signals
                )
        try:
            for role, proc in procs.items():
                assert proc.wait(300) == 0, (role, (tmp_path / f"{role}.err").read_text())
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
        (challenged,) = client.get_events("Challenged", 0, task_id=task_id)
        game = client.game(int(challenged.game_id))
    assert game.outcome == Outcome.AUDITOR_WON and game.pinned_step == 2
    said = (tmp_path / "trainer.err").read_text().splitlines()
    assert said[0].startswith(f"REHEARSAL poison@2: this trainer cheats on task {task_id} on purpose"), said
    lines = [json.loads(line) for line in (tmp_path / "trainer.out").read_text().splitlines()]
    assert {"train", "commit"} <= {a["what"] for a in lines}
    assert all(a["rehearsal"] == "poison@2" for a in lines)
    state = json.loads((tmp_path / "trainer" / f"task-{task_id}" / "trainer.json").read_text())
    assert state["rehearsal"] == "poison@2"
    assert "REHEARSAL" not in (tmp_path / "auditor.err").read_text()  # only the one rehearsing says so
