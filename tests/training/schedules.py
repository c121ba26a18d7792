"""Asynchronous schedules without Ray: a :class:`~game.training.ps.pool.WorkPool` driven by simulated
workers whose micro-batches take random times, and failovers at chosen points.

The pool is the driver's own bookkeeping, so these are the schedules a parameter server makes,
made in milliseconds and the same for the same seed: what the one-process trainer
(:func:`~game.training.engine.scheduled.train_scheduled`) and the audit tests run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import random
from collections.abc import Sequence
from pathlib import Path

from game.training.log.schedule import Applied, LostUpdate, MicroBatchId, ScheduleEntry
from game.training.ps.pool import WorkPool
from game.training.task.config import TaskConfig


def fake_leaf(version: int, generation: int) -> bytes:
    return hashlib.sha256(f"{version}/{generation}".encode()).digest()


def simulated_schedule(
    steps: int,
    accumulate: int,
    max_staleness: int,
    *,
    workers: int = 3,
    seed: int = 0,
    failovers: Sequence[tuple[int, int]] = (),
) -> tuple[list[ScheduleEntry], WorkPool, list[LostUpdate]]:
    """The schedule of a simulated run: ``workers`` workers, each micro-batch taking an exponential
    time, each update a fixed one; ``failovers``: (after this many updates applied in all, back
    this many states) failovers, each to a state of the lineage. Returns the entries, the pool and
    every update the failovers lost."""
    rng = random.Random(seed)
    pool = WorkPool(steps, accumulate, max_staleness)
    generation = 0
    pool.start(fake_leaf(0, generation))
    now, seq, applied = 0.0, 0, 0
    heap: list[tuple[float, int, str, object]] = []
    idle = list(range(workers))
    applying = False
    pending = sorted(failovers)
    lost: list[LostUpdate] = []
    while not pool.done:
        if not applying and (taken := pool.take()) is not None:  # first: it hands back stale work
            applying = True
            seq += 1
            heapq.heappush(heap, (now + 0.2, seq, "apply", taken[0]))
        while idle and (micro := pool.next_micro()) is not None:
            idle.pop()
            pool.hand_out(micro)
            seq += 1
            heapq.heappush(heap, (now + rng.expovariate(1.0), seq, "grad", micro))
        if pending and applied >= pending[0][0] and not applying:
            _, back = pending.pop(0)
            generation += 1
            version = max(0, pool.latest - back)
            lost += pool.rewind(version, pool.leaves[version])
            continue
        now, _, kind, what = heapq.heappop(heap)
        if kind == "grad":
            pool.returned(what, None)  # type: ignore[arg-type]
            idle.append(0)
        else:
            assert isinstance(what, ScheduleEntry)
            pool.confirm(fake_leaf(what.update, generation))
            applying = False
            applied += 1
    return [pool.applied[u] for u in range(1, steps + 1)], pool, lost


def repeating_schedule(
    entries: Sequence[ScheduleEntry], update: int
) -> tuple[list[ScheduleEntry], MicroBatchId, int]:
    """``entries`` with update ``update`` applying, in place of its last micro-batch, the first
    micro-batch of the earliest update that has one ``update`` does not apply (same version): what a
    trainer that trains on some data twice and skips other data commits. Every entry still keeps
    the rules it can break on its own. Returns the entries, the repeated micro-batch and the
    update that applied it first."""
    entry = entries[update - 1]
    own = {a.micro for a in entry.applied}
    w, micro = next(
        (e.update, a.micro) for e in entries[: update - 1] for a in e.applied if a.micro not in own
    )
    *keep, last = entry.applied
    applied = tuple(sorted([*keep, Applied(micro, last.version)], key=lambda a: a.micro))
    out = list(entries)
    out[update - 1] = dataclasses.replace(entry, applied=applied)
    return out, micro, w


def write_unchecked(cfg: TaskConfig, profile: str, out: Path, entries: Sequence[ScheduleEntry]) -> None:
    """Train by ``entries`` into ``out`` without checking the schedule: a dishonest trainer."""
    from game.training.engine.scheduled import write_scheduled
    from game.training.engine.step import engine_for
    from game.training.transcript.manifest import make_transcript_dir

    make_transcript_dir(out)
    write_scheduled(engine_for(cfg, profile), profile, out, entries)
