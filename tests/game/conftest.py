"""Fixtures for the chain-client tests: a task created, and one committed with a synthetic tree."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from game.chunkleaf import chunk_leaf
from game.merkle import MerkleTree

ETHER = 10**18
PAYMENT = 1 * ETHER
TRAINER_BOND = ETHER // 10
AUDITOR_BOND = ETHER // 20
CLOCK = 3_600
WINDOW = 7_200
JUDGE_WINDOW = 1_800
COMMIT_WINDOW = 86_400
NUM_LEAVES = 33  # the open task's leaf count (committed_task's default tree)
DATA_KEY = hashlib.sha256(b"the fixtures' data key").digest()
KEY_HASH = hashlib.sha256(DATA_KEY).digest()


def log_chunks(n: int) -> list[bytes]:
    """A toy run's log chunks (their ``chunk_leaf`` values are the log tree's leaves)."""
    return [b"chunk %d " % i * (1 + i % 4) for i in range(n)]


def log_root(n: int) -> bytes:
    return MerkleTree([chunk_leaf(c) for c in log_chunks(n)]).root


def chain_leaves(n: int, deviate_at: int | None = None, salt: bytes = b"") -> list[bytes]:
    """A toy run's leaves: a hash chain; from ``deviate_at`` on, a different chain."""
    leaves = [hashlib.sha256(b"init" + salt).digest()]
    for s in range(1, n):
        bad = b"bad" if deviate_at is not None and s >= deviate_at else b""
        leaves.append(hashlib.sha256(leaves[-1] + s.to_bytes(8, "big") + bad).digest())
    return leaves


@dataclass
class Setup:
    """A task and the clients of its parties."""

    task_id: int
    client: Any
    trainer: Any
    judge: Any
    auditor: Any
    tree: MerkleTree | None = None

    def sized(self, n: int) -> Setup:
        """This setup with a task of ``n`` leaves: the open task when it has ``n`` (the contract
        refuses a commitment of any other size), else a new one with the same terms."""
        if self.client.task(self.task_id).num_leaves != n:
            self.task_id = post(self.client, self.trainer, self.judge, n)
        return self

    def accepted(self, n: int) -> Setup:
        """This setup with a task of ``n`` leaves that its trainer accepted (bonded): ready to commit."""
        from game.chain.types import TaskStatus

        self.sized(n)
        if self.client.task(self.task_id).status == TaskStatus.OPEN:
            self.trainer.accept(self.task_id)
        return self

    def commit(self, n: int) -> Setup:
        """Accept and commit an honest ``n``-leaf tree (its log tree over :func:`log_chunks`)."""
        self.tree = MerkleTree(chain_leaves(n))
        self.accepted(n).trainer.commit_tree(self.task_id, self.tree, log_root(n), b"\x02" * 32)
        return self


def post(client: Any, trainer: Any, judge: Any, n: int = NUM_LEAVES) -> int:
    """A task of ``n`` leaves with the fixtures' terms; returns its id."""
    rec = client.create_task(
        b"\x5a" * 32,
        trainer.me,
        judge.me,
        key_hash=KEY_HASH,
        num_leaves=n,
        payment=PAYMENT,
        trainer_bond=TRAINER_BOND,
        auditor_bond=AUDITOR_BOND,
        clock_allowance=CLOCK,
        challenge_window=WINDOW,
        judge_window=JUDGE_WINDOW,
        commit_window=COMMIT_WINDOW,
    )
    assert rec.result is not None
    return int(rec.result)


@pytest.fixture
def open_task(game_client: Callable[..., Any]) -> Setup:
    client = game_client("client")
    trainer, judge, auditor = game_client("trainer"), game_client("judge"), game_client("auditor")
    return Setup(post(client, trainer, judge), client, trainer, judge, auditor)


@pytest.fixture
def committed_task(open_task: Setup) -> Callable[[int], Setup]:
    """``committed_task(n)``: the open task committed with an honest ``n``-leaf tree."""

    def make(n: int = 33) -> Setup:
        return open_task.commit(n)

    return make
