"""`vgame bench scale`: steps a second of one task on 1, 2, 4 (8) workers, side by side in one run,
and whether every run committed the same roots.

Why: a trainer with many workers must commit what one process commits (docs/architecture.md,
"Many workers"); this measures what the workers buy, and checks the roots while it does. Each run
trains the same task afresh into a transcript of its own: W = 1 is the one-process trainer
(`vgame train`), W > 1 the data-parallel trainer (`vgame train --workers W`, torchrun). The clock
runs from the end of a run's first step (its warm-up: the front, the kernels, the process start
before it) to the end of its last, on the trainer's own clock (rank 0's), so the launch is not
counted; the launch's wall time is reported beside it. Repeats go round the worker counts in turn,
so a machine that slows down for a while slows each alike; a row is the median of its repeats.

A row is one way of training (``mode``) at one worker count; other modes (the parameter-server
modes of issue 45) add rows and columns of their own to the same report.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from game.errors import ConfigError
from game.training.engine.train import TrainResult, train
from game.training.parallel.dataparallel import check_workers
from game.training.parallel.launch import launch
from game.training.task.config import TaskConfig

#: The mode of the rows this module measures: one process (W = 1) or torch.distributed (W > 1).
SYNC = "sync data parallel"


@dataclass(frozen=True)
class ScaleRow:
    """One worker count, the median of its repeats."""

    mode: str
    workers: int
    steps_per_second: float
    speedup: float  # over the one-process row of the same run
    launch_seconds: float  # wall time of a whole run, start and warm-up included
    repeats: list[float] = field(default_factory=list)  # steps a second of each repeat


@dataclass(frozen=True)
class ScaleReport:
    task: str
    model: dict[str, Any]
    batch_size: int
    accumulate: int
    steps: int
    profile: str
    cpus: int
    rows: tuple[ScaleRow, ...]
    state_roots: tuple[str, ...]  # every run's, in order: all equal when the workers agree

    @property
    def same_roots(self) -> bool:
        return len(set(self.state_roots)) == 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "batch_size": self.batch_size,
            "accumulate": self.accumulate,
            "steps": self.steps,
            "profile": self.profile,
            "cpus": self.cpus,
            "same_roots": self.same_roots,
            "state_root": self.state_roots[0] if self.same_roots else None,
            "rows": [asdict(r) for r in self.rows],
        }


def default_workers(accumulate: int, cpus: int | None = None) -> list[int]:
    """1, 2 and 4, and 8 where the machine has eight cores: those that divide ``accumulate``."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    wanted = [1, 2, 4] + ([8] if cpus >= 8 else [])
    return [w for w in wanted if accumulate % w == 0]


def measure_scale(
    cfg: TaskConfig,
    workers: Sequence[int],
    workdir: Path,
    *,
    profile: str = "cpu-1t",
    repeats: int = 1,
    progress: Callable[[str], None] | None = None,
) -> ScaleReport:
    """Train ``cfg`` on each of ``workers`` (``repeats`` times round), each run afresh in
    ``workdir``; its steps a second and the roots. Needs at least two steps (the first is the
    warm-up)."""
    if cfg.steps < 2:
        raise ConfigError("steps: the bench times steps after the first, so it needs at least 2")
    if 1 not in workers:
        raise ConfigError("--workers: the list must hold 1 (the one-process run the others compare with)")
    for w in workers:
        check_workers(cfg, w)
    rates: dict[int, list[float]] = {w: [] for w in workers}
    walls: dict[int, list[float]] = {w: [] for w in workers}
    roots: list[str] = []
    for r in range(repeats):
        for w in workers:
            if progress is not None:
                progress(f"repeat {r + 1} of {repeats}: {w} worker{'s' if w > 1 else ''}")
            out = workdir / f"w{w}-r{r}"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            result, ends = _run(cfg, profile, out, w)
            walls[w].append(time.perf_counter() - start)
            rates[w].append((len(ends) - 1) / (ends[-1] - ends[0]))
            roots.append(result.state_root.hex())
            shutil.rmtree(out, ignore_errors=True)
    base = statistics.median(rates[1])
    rows = tuple(
        ScaleRow(
            mode="one process" if w == 1 else SYNC,
            workers=w,
            steps_per_second=statistics.median(rates[w]),
            speedup=statistics.median(rates[w]) / base,
            launch_seconds=statistics.median(walls[w]),
            repeats=rates[w],
        )
        for w in workers
    )
    return ScaleReport(
        task=cfg.task,
        model=cfg.to_dict()["model"],
        batch_size=cfg.batch_size,
        accumulate=cfg.accumulate,
        steps=cfg.steps,
        profile=profile,
        cpus=os.cpu_count() or 1,
        rows=rows,
        state_roots=tuple(roots),
    )


def _run(cfg: TaskConfig, profile: str, out: Path, workers: int) -> tuple[TrainResult, list[float]]:
    """One fresh run: its result and the trainer's clock at the end of each step."""
    if workers > 1:
        launched = launch(cfg, profile, out, workers)
        return launched.result, launched.step_ends
    ends: list[float] = []
    result = train(cfg, profile, out, observe=lambda step, loss, state: ends.append(time.perf_counter()))
    return result, ends


__all__ = ["SYNC", "ScaleReport", "ScaleRow", "default_workers", "measure_scale"]
