"""Gas of every contract function and of a whole dispute, measured by playing them on a chain.

Used by ``vgame bench gas``. For each tree size ``N = 2^k`` it deploys the game, then plays:
a dispute (honest trainer, an auditor who claims the run diverged at a pinned step and bisects
down to it, the judge's ruling), a cancelled task, a game lost on time, and the settlement
(finalize, withdraw). Leaves are synthetic (hashes of their index): gas does not depend on what
the leaves mean, only on the tree's depth.
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from game.chain.backends import Chain
from game.chain.client import VerificationGameClient
from game.chain.deploy import deploy_contract
from game.chain.types import Outcome, Phase, TxReceipt
from game.merkle import MerkleTree

log = logging.getLogger(__name__)

#: targets the bench reports against (per bisection move, per whole 2^20 dispute)
MOVE_GAS_TARGET = 60_000
DISPUTE_GAS_TARGET = 3_000_000

ETHER = 10**18
CLOCK = 3_600
WINDOW = 86_400
JUDGE_WINDOW = 3_600


@dataclass(frozen=True)
class MoveStats:
    count: int
    max: int
    median: float
    min: int


@dataclass(frozen=True)
class SizeReport:
    """Everything measured for one tree size."""

    log2_leaves: int
    leaves: int
    pinned_step: int
    functions: dict[str, int]  # gas used by the first call of every function (deploy included)
    reveal: MoveStats
    respond: MoveStats
    bisection_txs: int  # reveals + responds
    dispute_txs: int  # challenge + bisection + ruling
    dispute_gas: int  # gas of challenge + every move + the ruling
    max_used_over_limit: float  # worst gas used / gas bought (headroom actually left)
    tree_seconds: float
    play_seconds: float

    @property
    def rounds_expected(self) -> int:
        return math.ceil(math.log2(self.leaves - 1)) if self.leaves > 2 else 0


@dataclass(frozen=True)
class GasReport:
    chain: str
    sizes: list[SizeReport] = field(default_factory=list)
    move_target: int = MOVE_GAS_TARGET
    dispute_target: int = DISPUTE_GAS_TARGET

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for s, size in zip(out["sizes"], self.sizes, strict=True):
            s["rounds_expected"] = size.rounds_expected
            s["targets_met"] = targets_met(size, self)
        return out


def targets_met(size: SizeReport, report: GasReport) -> dict[str, bool]:
    return {
        "move_gas": max(size.reveal.max, size.respond.max) <= report.move_target,
        "dispute_gas": size.dispute_gas <= report.dispute_target,
        "bisection_txs": size.bisection_txs <= 2 * size.rounds_expected,
    }


def synthetic_leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(n)]


def _stats(gas: Sequence[int]) -> MoveStats:
    if not gas:
        return MoveStats(0, 0, 0.0, 0)
    return MoveStats(len(gas), max(gas), float(statistics.median(gas)), min(gas))


def measure_size(chain: Chain, log2_leaves: int, progress: Callable[[str], None] | None = None) -> SizeReport:
    """Deploy and play every function once, and a whole dispute, over ``2^log2_leaves`` leaves."""
    say = progress or (lambda _msg: None)
    if not chain.supports_time_travel:
        raise ValueError("the gas bench needs a chain with time travel (embedded or anvil)")
    if len(chain.accounts) < 6:
        raise ValueError("the gas bench needs 6 funded accounts")
    n = 2**log2_leaves
    t0 = time.perf_counter()
    say(f"building a tree of {n:,} leaves")
    tree = MerkleTree(synthetic_leaves(n))
    tree_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    receipts: list[TxReceipt] = []
    functions: dict[str, int] = {}

    def record(rec: TxReceipt) -> TxReceipt:
        receipts.append(rec)
        functions.setdefault(rec.function, rec.gas_used)
        return rec

    deployment = deploy_contract(chain, chain.account(0))
    address = deployment.address
    functions["deploy"] = deployment.gas_used
    client_c, trainer_c, judge_c, auditor_c, auditor2_c = (
        VerificationGameClient(chain, address, chain.account(i)) for i in range(5)
    )

    def new_task() -> int:
        rec = record(
            client_c.create_task(
                hashlib.sha256(b"bench spec").digest(),
                trainer_c.me,
                judge_c.me,
                payment=ETHER,
                trainer_bond=ETHER // 10,
                auditor_bond=ETHER // 10,
                clock_allowance=CLOCK,
                challenge_window=WINDOW,
                judge_window=JUDGE_WINDOW,
            )
        )
        assert rec.result is not None
        return rec.result

    # the dispute: honest trainer, an auditor claiming a divergence at `pinned`
    say("playing the dispute")
    task_a = new_task()
    record(
        trainer_c.commit_tree(task_a, tree, hashlib.sha256(b"log").digest(), hashlib.sha256(b"t").digest())
    )
    pinned = n // 3 + 1
    challenge = record(auditor_c.challenge(task_a))
    gid = challenge.result
    assert gid is not None
    reveals: list[int] = []
    responds: list[int] = []
    dispute = [challenge]
    while True:
        g = auditor_c.game(gid)
        if g.phase is Phase.PINNED:
            break
        rec = record(trainer_c.reveal(gid, tree.leaf(g.mid), tree.proof(g.mid)))
        reveals.append(rec.gas_used)
        dispute.append(rec)
        rec = record(auditor_c.respond(gid, g.mid < pinned))
        responds.append(rec.gas_used)
        dispute.append(rec)
    ruling = record(judge_c.rule(gid, tree.leaf(pinned)))  # the judge re-ran the step: trainer was right
    dispute.append(ruling)
    if auditor_c.game(gid).outcome is not Outcome.TRAINER_WON:
        raise RuntimeError("the honest trainer lost the bench dispute: the contract or the bench is wrong")

    say("cancel, timeout, finalize, withdraw")
    record(client_c.cancel(new_task()))
    task_c = new_task()
    small = MerkleTree(synthetic_leaves(3))
    record(trainer_c.commit_tree(task_c, small, b"\x00" * 32, b"\x00" * 32))
    gid_c = auditor2_c.challenge(task_c).result
    assert gid_c is not None
    chain.time_travel(CLOCK + 1)
    record(client_c.timeout(gid_c))
    chain.time_travel(WINDOW + 1)
    record(client_c.finalize(task_a))
    record(trainer_c.withdraw())
    play_s = time.perf_counter() - t1

    return SizeReport(
        log2_leaves=log2_leaves,
        leaves=n,
        pinned_step=pinned,
        functions=functions,
        reveal=_stats(reveals),
        respond=_stats(responds),
        bisection_txs=len(reveals) + len(responds),
        dispute_txs=len(dispute),
        dispute_gas=sum(r.gas_used for r in dispute),
        max_used_over_limit=max(r.gas_used / r.gas_limit for r in receipts),
        tree_seconds=round(tree_s, 3),
        play_seconds=round(play_s, 3),
    )


def measure(
    chain: Chain, log2_sizes: Sequence[int] = (10, 20), progress: Callable[[str], None] | None = None
) -> GasReport:
    """One :class:`SizeReport` per size; each size starts from a snapshot so sizes do not interact."""
    reports = []
    for k in log2_sizes:
        if k < 1:
            raise ValueError("a dispute needs at least 2 leaves (log2 size >= 1)")
        snap = chain.snapshot()
        try:
            reports.append(measure_size(chain, k, progress))
        finally:
            chain.revert(snap)
    return GasReport(chain=chain.describe(), sizes=reports)
