"""The replication matrix: train on every profile, audit on every other one, with and without the log.

Why: it is the acceptance check of the training core ("for every preset and every pair of distinct
profiles, the audit matches bit-exactly at every step") as a command a user can run at any size,
next to the control that shows the log is what makes it work (without it, pairs diverge).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from game.training.engine.audit import audit
from game.training.engine.train import train
from game.training.task.config import TaskConfig


@dataclass(frozen=True)
class PairResult:
    """One auditor profile replaying one trainer profile's transcript."""

    trainer: str
    auditor: str
    use_log: bool
    match: bool
    first_divergent_step: int | None
    corrections: int
    seconds: float


@dataclass(frozen=True)
class ReplicationReport:
    preset: str
    steps: int
    profiles: tuple[str, ...]
    pairs: tuple[PairResult, ...]

    @property
    def all_match_with_log(self) -> bool:
        return all(p.match for p in self.pairs if p.use_log)

    def to_dict(self) -> dict[str, Any]:
        with_log = [p for p in self.pairs if p.use_log]
        without = [p for p in self.pairs if not p.use_log]
        return {
            "preset": self.preset,
            "steps": self.steps,
            "profiles": list(self.profiles),
            "pairs_with_log": len(with_log),
            "matches_with_log": sum(p.match for p in with_log),
            "pairs_without_log": len(without),
            "matches_without_log": sum(p.match for p in without),
            "corrections_total": sum(p.corrections for p in with_log),
            "all_match_with_log": self.all_match_with_log,
            "pairs": [asdict(p) for p in self.pairs],
        }


def replication_matrix(
    cfg: TaskConfig,
    profiles: Sequence[str],
    workdir: Path,
    *,
    without_log: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ReplicationReport:
    """Train ``cfg`` once per profile, then audit every ordered pair of distinct profiles."""
    transcripts: dict[str, Path] = {}
    for a in profiles:
        if progress:
            progress(f"training on {a}")
        transcripts[a] = Path(workdir) / f"trainer-{a}"
        train(cfg, a, transcripts[a])
    pairs: list[PairResult] = []
    modes = (True, False) if without_log else (True,)
    for (a, b), use_log in itertools.product(itertools.permutations(profiles, 2), modes):
        if progress:
            progress(f"auditing {a} on {b} {'with' if use_log else 'without'} the log")
        t0 = time.perf_counter()
        r = audit(transcripts[a], b, use_log=use_log)
        pairs.append(
            PairResult(
                a, b, use_log, r.match, r.first_divergent_step, r.corrections, time.perf_counter() - t0
            )
        )
    return ReplicationReport(cfg.preset, cfg.steps, tuple(profiles), tuple(pairs))
