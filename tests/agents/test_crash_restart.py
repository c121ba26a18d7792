"""Crash safety: an agent killed at any point and recreated from its files ends the game the same way.

A kill is simulated by raising out of the agent at a chosen moment (right after its k-th action, so a
transaction was sent but nothing after it was saved; or in the middle of training or replay) and
then discarding the object and building a new one with the same arguments and workdir.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from game.agents import AgentAction, AgentError, next_due_time
from game.chain.types import TaskStatus
from game.training.engine.auditprogress import DEFAULT_EVERY_S
from tests.agents.conftest import Agents, PoisonBatch, games, reward, small_config, withdrawn

POISON_STEP = 5


class Killed(Exception):
    """The simulated kill (deliberately not a VGameError: nothing may catch it on the way out)."""


def _play(
    make_agents: Any,
    client: Any,
    task_id: int,
    cfg: Any,
    base: Path,
    *,
    kill_at: int | None = None,
    kill_progress: tuple[str, int] | None = None,
    kill_tx: tuple[dict[str, Any], int] | None = None,
    auditor_save_every_s: float = DEFAULT_EVERY_S,
) -> tuple[list[AgentAction], int]:
    """Run the poison game; kill the agent that acts ``kill_at``-th (or at a progress point). Returns
    the actions and how many kills happened. ``kill_tx=(roles, k)`` kills the agent whose
    transaction is the k-th mined, as soon as it is mined (before the agent sees the receipt)."""
    actions: list[AgentAction] = []
    count = 0
    kills = 0
    armed = True
    txs = 0
    if kill_tx is not None:
        roles, k_tx = kill_tx
        for name in ("trainer", "auditor", "judge"):
            sender = roles[name].sender
            real = sender.send

            def send(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                nonlocal txs, armed
                sent = _real(*args, **kwargs)
                txs += 1
                if armed and txs == k_tx:
                    armed = False
                    raise Killed(_name)
                return sent

            sender.send = send

    def sink(a: AgentAction) -> None:
        nonlocal count, armed
        count += 1
        if armed and kill_at is not None and count == kill_at:
            armed = False
            raise Killed(a.actor)

    def progress(label: str, done: int, total: int) -> None:
        nonlocal armed
        if armed and kill_progress is not None and (label, done) == kill_progress:
            armed = False
            raise Killed("trainer" if label == "train" else "auditor")

    def build() -> Agents:
        return make_agents(
            task_id,
            cfg,
            deviation=PoisonBatch(cfg, POISON_STEP),
            on_action=sink,
            progress=progress,
            actions=actions,
            base=base,
            auditor_save_every_s=auditor_save_every_s,
        )

    agents = build()
    for _ in range(300):
        if all(a.done for a in agents.all()):
            return actions, kills
        try:
            did = [a for agent in agents.all() if not agent.done for a in agent.step()]
        except Killed as k:
            kills += 1
            fresh = build()  # everything is rebuilt from files; only the killed one lost its memory
            setattr(agents, str(k.args[0]), getattr(fresh, str(k.args[0])))
            continue
        if not did:
            due = next_due_time(client, [task_id])
            if due is None:
                raise AgentError("stuck")
            client.chain.time_travel(max(1, due - client.chain.now()))
    raise AssertionError("the game did not end")


def _outcome(roles: dict[str, Any], task_id: int) -> dict[str, Any]:
    client = roles["client"]
    (g,) = games(client, task_id)
    task = client.task(task_id)
    return {
        "status": task.status,
        "outcome": g.outcome,
        "reason": g.reason,
        "pinned": g.pinned_step,
        "withdrawn": {r: withdrawn(client, roles[r].me) for r in ("trainer", "auditor", "judge")},
        "credit": {r: client.credit(roles[r].me) for r in roles},
    }


def _txs(actions: list[AgentAction]) -> list[tuple[str, str, int | None, int | None]]:
    return [(a.actor, a.what, a.game_id, a.leaf_index) for a in actions if a.tx_hash is not None]


def test_killed_agents_end_the_game_the_same_way(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tmp_path: Path
) -> None:
    client = roles["client"]
    chain = client.chain
    cfg = small_config()
    task_id = post_task(cfg)
    snap = chain.snapshot()

    ref_actions, _ = _play(make_agents, client, task_id, cfg, tmp_path / "ref")
    reference = _outcome(roles, task_id)
    assert reference["status"] == TaskStatus.FINALIZED and reference["pinned"] == POISON_STEP
    n = len(ref_actions)
    assert n >= 12, [a.what for a in ref_actions]

    n_tx = len(_txs(ref_actions))
    rng = random.Random(20261122)
    points = sorted(rng.sample(range(1, n + 1), 4))
    for k in points:
        chain.revert(snap)
        snap = chain.snapshot()
        actions, kills = _play(make_agents, client, task_id, cfg, tmp_path / f"kill-{k}", kill_at=k)
        assert kills == 1, k
        print(f"killed {ref_actions[k - 1].actor} after its {ref_actions[k - 1].what} (action {k} of {n})")
        assert _outcome(roles, task_id) == reference, f"killed after action {k} ({ref_actions[k - 1]})"
        assert _txs(actions) == _txs(ref_actions), f"killed after action {k}: transactions differ"
    # killed the moment a transaction is mined, before the agent saw it went through
    for k in sorted(rng.sample(range(1, n_tx + 1), 3)):
        chain.revert(snap)
        snap = chain.snapshot()
        actions, kills = _play(make_agents, client, task_id, cfg, tmp_path / f"tx-{k}", kill_tx=(roles, k))
        assert kills == 1, k
        print(f"killed {_txs(ref_actions)[k - 1]} as it was mined (tx {k} of {n_tx})")
        assert _outcome(roles, task_id) == reference, f"killed at transaction {k}"
        ref = _txs(ref_actions)
        assert _txs(actions) == ref[: k - 1] + ref[k:], "a transaction was sent twice or not at all"


@pytest.mark.parametrize("where", [("train", 3), ("replay", 6)])
def test_kill_during_training_or_replay(
    roles: dict[str, Any], post_task: Any, make_agents: Any, tmp_path: Path, where: tuple[str, int]
) -> None:
    client = roles["client"]
    cfg = small_config()
    task_id = post_task(cfg)
    actions, kills = _play(
        make_agents, client, task_id, cfg, tmp_path / "run", kill_progress=where, auditor_save_every_s=0.0
    )
    assert kills == 1
    if where[0] == "replay":  # the restarted auditor went on from its last save, not from step 0
        (replay,) = [a for a in actions if a.what == "replay"]
        assert f"went on from step {where[1]}" in replay.detail, replay.detail
        assert not any((tmp_path / "run" / "auditor" / f"task-{task_id}" / "replay-progress").iterdir())
    out = _outcome(roles, task_id)
    assert out["pinned"] == POISON_STEP and out["status"] == TaskStatus.FINALIZED
    task = client.task(task_id)
    assert out["withdrawn"]["auditor"] == task.auditor_bond + reward(task)
    assert [a.what for a in actions].count("commit") == 1


def _toml(cfg: Any) -> str:
    """A TOML task file for ``cfg`` (scalars, then the [model] table)."""

    def value(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    d = cfg.to_dict()
    lines = [f"{k} = {value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    lines.append("[model]")
    lines += [f"{k} = {value(v)}" for k, v in d["model"].items()]
    return "\n".join(lines) + "\n"


@pytest.mark.anvil
def test_node_processes_survive_sigkill(anvil_chain: Any, tmp_path: Path) -> None:
    """`vgame node` processes on anvil: the trainer is SIGKILLed after publishing and restarted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from game.chain.client import VerificationGameClient
    from game.chain.deploy import deploy
    from game.store.keys import key_hash, new_key

    chain = anvil_chain
    address = deploy(chain, chain.account(0))
    client, trainer, judge, auditor = (chain.account(i) for i in range(4))
    c = VerificationGameClient(chain, address, client)
    cfg = small_config()
    window = 600
    data_key = new_key()
    rec = c.create_task(
        cfg.spec_hash(),
        trainer.address,
        judge.address,
        key_hash=key_hash(data_key),
        num_leaves=cfg.num_leaves,
        payment=10**18,
        trainer_bond=3 * 10**17,
        auditor_bond=2 * 10**17,
        clock_allowance=600,
        challenge_window=window,
        judge_window=600,
        commit_window=600,
    )
    task_id = int(rec.result or 0)
    cfg_file = tmp_path / "task.toml"
    cfg_file.write_text(_toml(cfg))
    key = tmp_path / "data.key"  # the key's file, as `task keygen --out` writes it, not the key in argv
    key.write_text(data_key.hex() + "\n")
    key.chmod(0o600)

    def start(
        role: str, account: Any, profile: str, *extra: str, json_lines: bool = True
    ) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "game.cli", "node", role, "--chain", chain.url, "--contract", address]
        args += [
            "--task",
            str(task_id),
            "--store",
            str(tmp_path / "store"),
            "--workdir",
            str(tmp_path / role),
        ]
        args += [
            "--key",
            account.key.hex(),
            "--data-key",
            str(key),
            "--profile",
            profile,
            "--poll",
            "0.2",
            *(["--json"] if json_lines else []),
        ]
        log = open(tmp_path / f"{role}.log", "ab")  # noqa: SIM115 - the child owns it
        return subprocess.Popen([*args, *extra], stdout=log, stderr=subprocess.STDOUT, env={**os.environ})

    def wait(pred: Any, what: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.2)
        raise AssertionError(
            f"timed out waiting for {what}: " + (tmp_path / "trainer.log").read_text()[-2000:]
        )

    state = tmp_path / "trainer" / f"task-{task_id}" / "trainer.json"
    tr = start("trainer", trainer, "cpu-1t", "--config", str(cfg_file))
    try:
        wait(lambda: state.is_file() and "transcript_id" in state.read_text(), "the trainer to publish")
        tr.send_signal(signal.SIGKILL)
        tr.wait(10)
        tr = start("trainer", trainer, "cpu-1t", "--config", str(cfg_file))
        wait(lambda: c.task(task_id).status == TaskStatus.COMMITTED, "the commit")
        au = start("auditor", auditor, "noisy", json_lines=False)  # as a person runs it
        assert au.wait(120) == 0, (tmp_path / "auditor.log").read_text()[-2000:]
        # Its one action, the replay, is printed once: not also as a log record.
        assert (tmp_path / "auditor.log").read_text().count("match on noisy") == 1
        chain.time_travel(window + 1)
        assert tr.wait(120) == 0, (tmp_path / "trainer.log").read_text()[-2000:]
    finally:
        for p in (tr, *([au] if "au" in locals() else [])):
            if p.poll() is None:
                p.kill()
    t = c.task(task_id)
    assert t.status == TaskStatus.FINALIZED
    assert withdrawn(c, trainer.address) == t.payment + t.trainer_bond
    assert c.get_events("Challenged", 0) == []
    # Exactly one commitment on-chain, whichever process sent it: the kill may land after the
    # commit transaction is mined but before the first process could log it.
    assert len(c.get_events("Committed", 0)) == 1
    from tests.keycheck import assert_key_absent

    for role in ("trainer", "auditor"):  # JSON lines and the people's lines: the key in neither
        assert_key_absent((tmp_path / f"{role}.log").read_bytes(), bytes.fromhex(key.read_text()), role)


def test_stateOfAnotherChain_isRefused_notTrusted(tmp_path: Path) -> None:
    """A local chain started again from genesis deploys the game at the same address and posts task
    1 again: an agent restarted on the old workdir must not act on the old chain's state (an auditor
    that trusted its old "match" verdict would not challenge)."""
    import time
    from types import SimpleNamespace

    from game.agents import AgentError, StateFile
    from game.chain.backends import connect

    address = "0x" + "ab" * 20
    path = tmp_path / "task-1" / "auditor.json"
    with connect("embedded") as first:
        time.sleep(1.1)  # an embedded chain's genesis holds its start time, to the second
        restarted = connect("embedded")
        assert first.w3.eth.get_block(0)["hash"] != restarted.w3.eth.get_block(0)["hash"]
        state = StateFile(path)
        state.bind(SimpleNamespace(chain=first, address=address), path.parent)  # type: ignore[arg-type]
        state.update(verdict="match")
        again = StateFile(path)  # the same chain, a new process: its files are its own
        again.bind(SimpleNamespace(chain=first, address=address), path.parent)  # type: ignore[arg-type]
        for chain, contract in ((restarted, address), (first, "0x" + "cd" * 20)):
            fresh = StateFile(path)
            with pytest.raises(AgentError, match="holds the files of a game contract on another chain"):
                fresh.bind(SimpleNamespace(chain=chain, address=contract), path.parent)  # type: ignore[arg-type]
        restarted.close()
    assert StateFile(path).get("verdict") == "match"  # refused, not overwritten


def test_demo_onAWorkdirOfAnEarlierRun_isRefused(tmp_path: Path) -> None:
    """Seen by hand: `vgame demo --scenario poison --workdir wd` after an honest demo there reused the
    honest transcript and verdict, and reported the trainer the winner with no dispute."""
    from game.demo import run_scenario
    from game.errors import ConfigError

    first = run_scenario("honest", preset="mlp-digits", steps=3, workdir=tmp_path)
    assert first.winner == "trainer"
    with pytest.raises(ConfigError, match="is not empty"):
        run_scenario("poison", preset="mlp-digits", steps=3, workdir=tmp_path)
