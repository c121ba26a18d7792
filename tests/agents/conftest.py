"""Shared fixtures of the agent tests (and of the scenario tests built on the same agents).

* ``tiny_cfg``: a task small enough to train in about a second (mlp-digits, 8 steps).
* ``store`` / ``data_key`` / ``evidence_dir``: an encrypted blob store, its key and the judge's inbox.
* ``roles``: a client per role (``client``, ``trainer``, ``auditor``, ``judge``) on the deployed game.
* ``post_task``: ``post_task(cfg, **overrides) -> task_id`` posts ``cfg`` as the client.
* ``make_agents``: ``make_agents(task_id, cfg, ...) -> Agents`` builds trainer, auditor and judge with
  per-role workdirs under ``tmp_path``; call it again to "restart" any of them (same workdirs).
* :func:`run_game` steps agents until done, jumping the chain clock when all are idle.
* :class:`PoisonBatch`, :class:`TamperInit`: deviations (flipped labels at step S; weights at init).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from game.agents import AgentAction, drive
from game.store.blobs import BlobStore
from game.store.keys import key_hash, new_key
from game.training.engine.auditprogress import DEFAULT_EVERY_S
from game.training.engine.train import Deviation
from game.training.task.config import TaskConfig

TASK_DEFAULTS: dict[str, int] = {
    "payment": 10**18,
    "trainer_bond": 3 * 10**17,
    "auditor_bond": 2 * 10**17,
    "clock_allowance": 3600,
    "challenge_window": 7200,
    "judge_window": 3600,
    "commit_window": 86400,
}

TRAINER_PROFILE = "cpu-1t"
AUDITOR_PROFILE = "noisy"
JUDGE_PROFILE = "splitk-16"


def small_config(**overrides: Any) -> TaskConfig:
    """mlp-digits, 8 steps of 8 examples, checkpoints every 4 steps."""
    base: dict[str, Any] = {"model": {"hidden": 16}, "batch_size": 8, "steps": 8, "checkpoint_interval": 4}
    return TaskConfig.for_preset("mlp-digits", **{**base, **overrides})


class PoisonBatch(Deviation):
    """Trains on flipped labels at ``step`` (the poison scenario)."""

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        self.cfg = cfg
        self.step = step

    def batch(self, step: int) -> Any | None:
        if step != self.step:
            return None
        from game.training.engine.runtime import Batch, runtime_for

        honest = runtime_for(self.cfg).batch(step)
        flipped = (honest.targets + 1) % 10
        return Batch((honest.inputs, flipped), honest.example_ids)


class TamperInit(Deviation):
    """Zeroes the first parameter of the initial state (a dispute at step 0)."""

    def after_step(self, step: int, state: Any) -> None:
        if step == 0:
            next(iter(state.model.parameters())).data.zero_()


class ShortChunk(Deviation):
    """Computes every step honestly but publishes step ``step``'s sparse log chunk without its last
    record: a chunk that decodes and does not fit the step's computation, with the true state."""

    def __init__(self, step: int) -> None:
        self.step = step

    def tamper_log(self, step: int, step_log: Any) -> Any:
        from game.training.log.sparse import SparseStepLog

        if step == self.step:
            assert isinstance(step_log, SparseStepLog) and len(step_log) > 0
            step_log.pop()
        return step_log


def publish_without_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: int, how: str) -> None:
    """Have the trainer node publish its transcript with checkpoint ``step`` left out (``how`` is
    "missing") or altered: nothing on the chain checks the checkpoints a trainer publishes."""
    import shutil

    import trainer_node.agent as trainer_module
    from game.training.transcript.layout import checkpoint_relpath

    real = trainer_module.publish_directory

    def publish(st: Any, key: bytes, src: Path, *a: Any, **kw: Any) -> bytes:
        copy = tmp_path / "published"
        shutil.copytree(src, copy)
        ckpt = copy / checkpoint_relpath(step)
        if how == "missing":
            ckpt.unlink()
        else:
            ckpt.write_bytes(b"not the state")
        return real(st, key, copy, *a, **kw)

    monkeypatch.setattr(trainer_module, "publish_directory", publish)


def seal_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trainer nodes made from here on publish their transcripts under another key than the task's
    and skip their node's check that the blob opens: a trainer that means to withhold it (or a
    node of an older version)."""
    import trainer_node.agent as trainer_module

    real = trainer_module.publish_directory
    monkeypatch.setattr(
        trainer_module, "publish_directory", lambda st, _k, *a, **kw: real(st, new_key(), *a, **kw)
    )
    monkeypatch.setattr(trainer_module.TrainerAgent, "_check_opens", lambda *_a: None)


@pytest.fixture
def tiny_cfg() -> TaskConfig:
    return small_config()


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


@pytest.fixture
def data_key() -> bytes:
    return new_key()


@pytest.fixture
def evidence_dir(tmp_path: Path) -> Path:
    d = tmp_path / "evidence"
    d.mkdir()
    return d


@pytest.fixture
def roles(game_client: Callable[..., Any]) -> dict[str, Any]:
    """A VerificationGameClient per role, signing as that role's account."""
    return {name: game_client(name) for name in ("client", "trainer", "auditor", "judge")}


@pytest.fixture
def post_task(roles: dict[str, Any], data_key: bytes) -> Callable[..., int]:
    """``post_task(cfg, **overrides) -> task_id``: the task under the fixtures' data key (its hash
    on-chain; ``key_hash=`` posts another)."""

    def post(cfg: TaskConfig, **overrides: Any) -> int:
        params: dict[str, Any] = {**TASK_DEFAULTS, **overrides}
        params.setdefault("num_leaves", cfg.num_leaves)
        params.setdefault("key_hash", key_hash(data_key))
        rec = roles["client"].create_task(cfg.spec_hash(), roles["trainer"].me, roles["judge"].me, **params)
        assert rec.result is not None
        return int(rec.result)

    return post


@dataclass
class Agents:
    trainer: Any
    auditor: Any
    judge: Any
    actions: list[AgentAction]

    def all(self) -> list[Any]:
        return [self.trainer, self.auditor, self.judge]


@pytest.fixture
def make_agents(
    roles: dict[str, Any], store: BlobStore, data_key: bytes, evidence_dir: Path, tmp_path: Path
) -> Callable[..., Agents]:
    """Build (or rebuild, with the same workdirs) the three agents of a task."""

    def make(
        task_id: int,
        cfg: TaskConfig,
        *,
        deviation: Deviation | None = None,
        strategy: str = "honest",
        seed: int = 0,
        on_action: Callable[[AgentAction], None] | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        judge_store: BlobStore | None = None,
        use_evidence: bool = True,
        actions: list[AgentAction] | None = None,
        base: Path | None = None,
        auditor_save_every_s: float = DEFAULT_EVERY_S,
        auditor_config: bool = True,
        auditor_max_log_pieces: int | None = None,
    ) -> Agents:
        from auditor_node.agent import AuditorAgent
        from auditor_node.chainlog import MAX_PIECES
        from game.judge import Judge
        from game.strategies.auditors import auditor_strategy
        from trainer_node.agent import TrainerAgent

        log: list[AgentAction] = actions if actions is not None else []

        def sink(a: AgentAction) -> None:
            log.append(a)
            if on_action is not None:
                on_action(a)

        root = base if base is not None else tmp_path
        ev = (root / "evidence" if base is not None else evidence_dir) if use_evidence else None
        trainer = TrainerAgent(
            roles["trainer"],
            task_id,
            cfg,
            profile=TRAINER_PROFILE,
            workdir=root / "trainer",
            store=store,
            data_key=data_key,
            deviation=deviation,
            on_action=sink,
            progress=progress,
        )
        auditor = AuditorAgent(
            roles["auditor"],
            task_id,
            profile=AUDITOR_PROFILE,
            workdir=root / "auditor",
            store=store,
            data_key=data_key,
            strategy=auditor_strategy(strategy, seed),
            evidence_dir=ev,
            on_action=sink,
            progress=progress,
            save_every_s=auditor_save_every_s,
            config=cfg if auditor_config else None,
            max_log_pieces=MAX_PIECES if auditor_max_log_pieces is None else auditor_max_log_pieces,
        )
        judge = Judge(
            roles["judge"],
            profile=JUDGE_PROFILE,
            workdir=root / "judge",
            store=judge_store or store,
            data_key=data_key,
            evidence_dir=ev,
            on_action=sink,
            task_id=task_id,
        )
        return Agents(trainer, auditor, judge, log)

    return make


def commit(agents: Agents, client: Any, task_id: int) -> None:
    """Step the trainer until it has trained, published its transcript and committed."""
    from game.chain.types import TaskStatus

    for _ in range(10):
        agents.trainer.step()
        if client.task(task_id).status == TaskStatus.COMMITTED:
            return
    raise AssertionError(f"the trainer did not commit to task {task_id}")


def run_game(agents: Agents, client: Any, task_id: int, max_rounds: int = 200) -> list[AgentAction]:
    """Step all three agents until done (time jumps when idle); the actions taken."""
    return drive(agents.all(), client, [task_id], max_rounds=max_rounds)


def reward(task: Any) -> int:
    """What an auditor who won the task's only winning game is paid on top of its bond: its share of
    the trainer's forfeited bond (docs/contract.md "Money")."""
    from game.protocol.payouts import forfeit_split

    return forfeit_split(task.trainer_bond, task.auditor_bond, max(task.auditor_wins, 1)).share


def withdrawn(client: Any, address: str) -> int:
    """Total wei ``address`` withdrew from the game."""
    return sum(int(e.amount) for e in client.get_events("Withdrawn", 0, account=address))


def games(client: Any, task_id: int) -> list[Any]:
    """The games of a task, as read now."""
    return [client.game(int(e.game_id)) for e in client.get_events("Challenged", 0, task_id=task_id)]
