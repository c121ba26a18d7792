"""Gas of every contract function and of a whole dispute, measured by playing them on a chain.

Used by ``vgame bench gas``. For each tree size ``N = 2^k`` it deploys the game, then plays:
a dispute (honest trainer, an auditor who claims the run diverged at a pinned step and bisects
down to it, the judge's ruling), a cancelled task, a game lost on time, an availability challenge
answered with a chunk of :data:`BENCH_CHUNK_BYTES` bytes, and the settlement (finalize, a loser's
reward claimed, withdraw). Leaves are synthetic (hashes of their index): gas does not depend on what
the leaves mean, only on the tree's depth. :func:`play_dispute` (challenge, bisection, ruling) is
shared with :mod:`game.bench.dispute`, which times whole disputes.
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

from game import chunkleaf
from game.chain.base import Chain
from game.chain.client import VerificationGameClient
from game.chain.deploy import deploy_contract
from game.chain.types import Outcome, Phase, TxReceipt
from game.merkle import MerkleTree
from game.protocol.solver import pinned_step

log = logging.getLogger(__name__)

#: targets the bench reports against (per bisection move, per whole 2^20 dispute)
MOVE_GAS_TARGET = 60_000
DISPUTE_GAS_TARGET = 3_000_000

ETHER = 10**18
CLOCK = 3_600
WINDOW = 86_400
JUDGE_WINDOW = 3_600
COMMIT_WINDOW = 86_400
#: The size of the log chunk the bench posts in answer to an availability challenge: about a sparse
#: gpt-shakespeare chunk (5,207 bytes, docs/benchmarks.md).
BENCH_CHUNK_BYTES = 5_120


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


def move_stats(gas: Sequence[int]) -> MoveStats:
    """Count, max, median and min of one kind of move's gas (zeros for none)."""
    if not gas:
        return MoveStats(0, 0, 0.0, 0)
    return MoveStats(len(gas), max(gas), float(statistics.median(gas)), min(gas))


def claimed_step(leaves: int) -> int:
    """The step the bench's auditor claims diverged: off-centre, so both answers occur in the bisection."""
    return leaves // 3 + 1


@dataclass(frozen=True)
class Parties:
    """Clients of the bench's roles on one deployed game (accounts 0-4)."""

    client: VerificationGameClient
    trainer: VerificationGameClient
    judge: VerificationGameClient
    auditor: VerificationGameClient
    auditor2: VerificationGameClient


def check_bench_chain(chain: Chain) -> None:
    """Refuse before deploying anything: the bench needs time travel, snapshots and 6 funded accounts."""
    if not chain.supports_time_travel:
        raise ValueError("the gas bench needs a chain with time travel (embedded or anvil)")
    if len(chain.accounts) < 6:
        raise ValueError("the gas bench needs 6 funded accounts")


def bench_parties(chain: Chain, address: str) -> Parties:
    """The five roles on ``address`` (accounts 0-4)."""
    check_bench_chain(chain)
    return Parties(*(VerificationGameClient(chain, address, chain.account(i)) for i in range(5)))


def create_bench_task(p: Parties, num_leaves: int) -> TxReceipt:
    """A task of ``num_leaves`` leaves with the bench's fixed bonds and windows; ``receipt.result``
    is its id."""
    rec = p.client.create_task(
        hashlib.sha256(b"bench spec").digest(),
        p.trainer.me,
        p.judge.me,
        key_hash=hashlib.sha256(b"bench key").digest(),
        num_leaves=num_leaves,
        payment=ETHER,
        trainer_bond=ETHER // 10,
        auditor_bond=ETHER // 10,
        clock_allowance=CLOCK,
        challenge_window=WINDOW,
        judge_window=JUDGE_WINDOW,
        commit_window=COMMIT_WINDOW,
    )
    assert rec.result is not None
    return rec


def accept_bench_task(p: Parties, task_id: int) -> TxReceipt:
    """The trainer accepts ``task_id`` (posting its bond) before it trains."""
    return p.trainer.accept(task_id)


def bench_chunks(n: int) -> list[bytes]:
    """``n`` synthetic log chunks of :data:`BENCH_CHUNK_BYTES` bytes each."""
    return [hashlib.sha256(b"chunk %d" % i).digest() * (BENCH_CHUNK_BYTES // 32) for i in range(n)]


def commit_bench_tree(p: Parties, task_id: int, tree: MerkleTree, log_root: bytes | None = None) -> TxReceipt:
    """The trainer commits ``tree`` (the log root and transcript id are dummies unless given)."""
    root = hashlib.sha256(b"log").digest() if log_root is None else log_root
    return p.trainer.commit_tree(task_id, tree, root, hashlib.sha256(b"t").digest())


@dataclass(frozen=True)
class DisputePlay:
    """The transactions of one whole dispute, in the order they were sent."""

    game_id: int
    receipts: tuple[TxReceipt, ...]  # challenge, reveal/respond pairs, ruling

    def of(self, function: str) -> list[TxReceipt]:
        return [r for r in self.receipts if r.function == function]

    @property
    def bisection_txs(self) -> int:
        return len(self.of("reveal")) + len(self.of("respond"))

    @property
    def gas(self) -> int:
        return sum(r.gas_used for r in self.receipts)


def play_dispute(p: Parties, task_id: int, tree: MerkleTree, pinned: int) -> DisputePlay:
    """Challenge ``task_id``'s committed ``tree``, bisect down to ``pinned``, and have the judge rule.

    The trainer is honest; the auditor claims the run diverged at ``pinned`` (it agrees with every
    leaf before it), so the game pins that step and the judge, re-running it, sides with the trainer.
    """
    challenge = p.auditor.challenge(task_id)
    gid = challenge.result
    assert gid is not None
    receipts = [challenge]
    while True:
        g = p.auditor.game(gid)
        if g.phase is Phase.PINNED:
            break
        receipts.append(p.trainer.reveal(gid, tree.leaf(g.mid), tree.proof(g.mid)))
        receipts.append(p.auditor.respond(gid, g.mid < pinned))
    # the judge re-ran the pinned step (the claimed one): the trainer was right
    receipts.append(p.judge.rule(gid, tree.leaf(pinned_step(g))))
    if p.auditor.game(gid).outcome is not Outcome.TRAINER_WON:
        raise RuntimeError("the honest trainer lost the bench dispute: the contract or the bench is wrong")
    return DisputePlay(gid, tuple(receipts))


def measure_size(chain: Chain, log2_leaves: int, progress: Callable[[str], None] | None = None) -> SizeReport:
    """Deploy and play every function once, and a whole dispute, over ``2^log2_leaves`` leaves."""
    say = progress or (lambda _msg: None)
    check_bench_chain(chain)
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
    functions["deploy"] = deployment.gas_used
    p = bench_parties(chain, deployment.address)

    def new_task(num_leaves: int, *, accept: bool = True) -> int:
        task_id = record(create_bench_task(p, num_leaves)).result
        assert task_id is not None
        if accept:
            record(accept_bench_task(p, task_id))
        return task_id

    # the dispute: honest trainer, an auditor claiming a divergence at `pinned`
    say("playing the dispute")
    task_a = new_task(n)
    record(commit_bench_tree(p, task_a, tree))
    pinned = claimed_step(n)
    play = play_dispute(p, task_a, tree, pinned)
    for rec in play.receipts:
        record(rec)

    say("cancel, availability, timeout, finalize, reward, withdraw")
    small = MerkleTree(synthetic_leaves(3))
    chunks = bench_chunks(small.size)
    log_tree = MerkleTree([chunkleaf.chunk_leaf(c) for c in chunks])
    record(p.client.cancel(new_task(small.size, accept=False)))
    task_c = new_task(small.size)
    record(commit_bench_tree(p, task_c, small, log_tree.root))
    gid_d = record(p.auditor.challenge_data(task_c, 1)).result
    assert gid_d is not None
    record(p.trainer.provide_data(gid_d, chunks[1], log_tree.proof(1)))
    gid_c = p.auditor2.challenge(task_c).result
    assert gid_c is not None
    chain.time_travel(CLOCK + 1)
    record(p.client.timeout(gid_c))
    chain.time_travel(WINDOW + 1)
    record(p.client.finalize(task_a))
    p.client.finalize(task_c)  # the lost task: its gas differs from the paid one's, not shown
    record(p.client.claim_reward(gid_c))
    record(p.trainer.withdraw())
    play_s = time.perf_counter() - t1

    return SizeReport(
        log2_leaves=log2_leaves,
        leaves=n,
        pinned_step=pinned,
        functions=functions,
        reveal=move_stats([r.gas_used for r in play.of("reveal")]),
        respond=move_stats([r.gas_used for r in play.of("respond")]),
        bisection_txs=play.bisection_txs,
        dispute_txs=len(play.receipts),
        dispute_gas=play.gas,
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
