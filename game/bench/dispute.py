"""Whole disputes timed on a chain: transactions, gas per move, gas and wall time of the dispute.

Used by ``vgame bench game``. For each tree size ``N = 2^k`` it deploys the game, creates a task
and commits a synthetic tree (untimed set-up), then plays the same dispute ``repeats`` times from a
snapshot taken after the commit: the auditor challenges, trainer and auditor bisect down to the
pinned step, the judge rules (:func:`game.bench.gas.play_dispute`, the gas bench's own
driver). Each repeat's wall time runs from sending the challenge to the ruling's receipt (and one
read of the outcome), so it holds what a party of this project pays per transaction: the client's
pre-checks, the gas estimate, signing, sending, mining and the proof lookups in the trainer's tree.
It does not hold building the tree (reported apart: a trainer has its tree already).

Every repeat starts from the same state, so its gas must be the same; a difference is an error.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from game.bench.gas import (
    DISPUTE_GAS_TARGET,
    MOVE_GAS_TARGET,
    DisputePlay,
    MoveStats,
    accept_bench_task,
    bench_parties,
    check_bench_chain,
    claimed_step,
    commit_bench_tree,
    create_bench_task,
    move_stats,
    play_dispute,
    synthetic_leaves,
)
from game.chain.base import Chain
from game.chain.deploy import deploy_contract
from game.errors import ChainError, ConfigError
from game.merkle import MerkleTree

log = logging.getLogger(__name__)

#: the size the whole-dispute gas target is stated for (issue 5: "a 2^20 dispute")
DISPUTE_TARGET_LOG2_LEAVES = 20
#: ``progress(message)`` before every tree and every repeat
ProgressFn = Callable[[str], None]
#: log2 size -> (tree, seconds it took to build); shared across chains so a 2^20 tree is built once
TreeCache = dict[int, tuple[MerkleTree, float]]


class GameBenchError(ChainError):
    """A repeat of the bench's dispute did not behave like the others (different gas)."""


@dataclass(frozen=True)
class Spread:
    """Median, min and max of a few samples, with the samples themselves."""

    median: float
    min: float
    max: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        return cls(float(statistics.median(samples)), min(samples), max(samples), tuple(samples))


@dataclass(frozen=True)
class GameSizeResult:
    """One tree size on one chain: what the dispute cost and how long it took."""

    log2_leaves: int
    leaves: int
    pinned_step: int
    transactions: int  # challenge + bisection moves + ruling
    bisection_txs: int  # reveals + responds
    rounds: int  # reveals (one per halving of the interval)
    reveal: MoveStats
    respond: MoveStats
    dispute_gas: int  # gas of every transaction of the dispute
    wall_seconds: Spread  # whole dispute, one sample per repeat
    tree_seconds: float  # building the synthetic tree (not in the wall time)

    @property
    def rounds_expected(self) -> int:
        return math.ceil(math.log2(self.leaves - 1)) if self.leaves > 2 else 0

    @property
    def move_gas_max(self) -> int:
        return max(self.reveal.max, self.respond.max)

    def targets(
        self, move_target: int = MOVE_GAS_TARGET, dispute_target: int = DISPUTE_GAS_TARGET
    ) -> dict[str, dict[str, Any]]:
        """Each target with the measured value and whether it is reached."""
        return {
            "move_gas": {
                "value": self.move_gas_max,
                "target": move_target,
                "reached": self.move_gas_max <= move_target,
            },
            "dispute_gas": {
                "value": self.dispute_gas,
                "target": dispute_target,
                "reached": self.dispute_gas <= dispute_target,
            },
        }

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["rounds_expected"] = self.rounds_expected
        out["move_gas_max"] = self.move_gas_max
        out["targets"] = self.targets()
        return out


@dataclass(frozen=True)
class ChainGameReport:
    """Every size measured on one chain."""

    chain: str  # backend kind: embedded, anvil
    description: str
    repeats: int
    sizes: list[GameSizeResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "description": self.description,
            "repeats": self.repeats,
            "sizes": [s.to_json() for s in self.sizes],
        }


def bench_tree(log2_leaves: int, cache: TreeCache | None = None) -> tuple[MerkleTree, float]:
    """The synthetic tree of ``2^log2_leaves`` leaves and its build time, from ``cache`` if there."""
    if cache is not None and log2_leaves in cache:
        return cache[log2_leaves]
    t0 = time.perf_counter()
    built = MerkleTree(synthetic_leaves(2**log2_leaves)), time.perf_counter() - t0
    if cache is not None:
        cache[log2_leaves] = built
    return built


def _same_gas(plays: Sequence[DisputePlay]) -> bool:
    first = [(r.function, r.gas_used) for r in plays[0].receipts]
    return all([(r.function, r.gas_used) for r in p.receipts] == first for p in plays[1:])


def measure_game_size(
    chain: Chain,
    log2_leaves: int,
    repeats: int,
    *,
    trees: TreeCache | None = None,
    progress: ProgressFn | None = None,
) -> GameSizeResult:
    """Set up one task over ``2^log2_leaves`` leaves and play its dispute ``repeats`` times."""
    say = progress or (lambda _msg: None)
    check_bench_chain(chain)
    n = 2**log2_leaves
    say(f"{chain.kind}: tree of {n:,} leaves")
    tree, tree_s = bench_tree(log2_leaves, trees)

    p = bench_parties(chain, deploy_contract(chain, chain.account(0)).address)
    task_id = create_bench_task(p, tree.size).result
    assert task_id is not None
    accept_bench_task(p, task_id)
    commit_bench_tree(p, task_id, tree)
    pinned = claimed_step(n)

    plays: list[DisputePlay] = []
    seconds: list[float] = []
    for r in range(repeats):
        say(f"{chain.kind}: 2^{log2_leaves} leaves, dispute {r + 1}/{repeats}")
        snap = chain.snapshot()
        try:
            t0 = time.perf_counter()
            plays.append(play_dispute(p, task_id, tree, pinned))
            seconds.append(time.perf_counter() - t0)
        finally:
            chain.revert(snap)
    if not _same_gas(plays):
        raise GameBenchError(f"2^{log2_leaves} leaves on {chain.kind}: the repeats used different gas")

    play = plays[0]
    reveals = [r.gas_used for r in play.of("reveal")]
    result = GameSizeResult(
        log2_leaves=log2_leaves,
        leaves=n,
        pinned_step=pinned,
        transactions=len(play.receipts),
        bisection_txs=play.bisection_txs,
        rounds=len(reveals),
        reveal=move_stats(reveals),
        respond=move_stats([r.gas_used for r in play.of("respond")]),
        dispute_gas=play.gas,
        wall_seconds=Spread.of(seconds),
        tree_seconds=tree_s,
    )
    log.info(
        "game bench %s 2^%d: %d txs, %d gas, median %.3f s over %d repeats",
        chain.kind,
        log2_leaves,
        result.transactions,
        result.dispute_gas,
        result.wall_seconds.median,
        repeats,
    )
    return result


def measure_game(
    chain: Chain,
    log2_sizes: Sequence[int] = (10, 20),
    repeats: int = 3,
    *,
    trees: TreeCache | None = None,
    progress: ProgressFn | None = None,
) -> ChainGameReport:
    """One :class:`GameSizeResult` per size; each size runs inside a snapshot so sizes do not interact."""
    if repeats < 1:
        raise ConfigError("repeats must be >= 1")
    if not log2_sizes or any(k < 1 for k in log2_sizes):
        raise ConfigError("a dispute needs at least 2 leaves: give log2 sizes >= 1")
    check_bench_chain(chain)
    sizes = []
    for k in log2_sizes:
        snap = chain.snapshot()
        try:
            sizes.append(measure_game_size(chain, k, repeats, trees=trees, progress=progress))
        finally:
            chain.revert(snap)
    return ChainGameReport(chain=chain.kind, description=chain.describe(), repeats=repeats, sizes=sizes)


def bench_document(reports: Sequence[ChainGameReport]) -> dict[str, Any]:
    """The ``--json`` document of ``vgame bench game``: the targets, then every chain's sizes."""
    return {
        "targets": {
            "move_gas": MOVE_GAS_TARGET,
            "dispute_gas": DISPUTE_GAS_TARGET,
            "dispute_gas_stated_at_log2_leaves": DISPUTE_TARGET_LOG2_LEAVES,
        },
        "chains": [r.to_json() for r in reports],
        "all_targets_reached": all(
            t["reached"] for r in reports for s in r.sizes for t in s.targets().values()
        ),
    }
