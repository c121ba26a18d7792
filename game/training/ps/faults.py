"""Failures injected into a parameter-server run: which process is killed with SIGKILL, when.

A :class:`Kill` fires once the run has applied ``after`` updates in all (lost ones count: the count
never goes back), ``delay_s`` later, so that it lands in the middle of whatever the target is doing
then. :func:`plan_kills` draws them from a seed (the same plan for the same seed; where each lands
depends on the machine's speed, so the driver logs the moment, the pid and the update in flight).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from game.errors import ConfigError

Target = Literal["server", "worker"]
TARGETS: tuple[str, ...] = ("server", "worker")


@dataclass(frozen=True)
class Kill:
    """SIGKILL ``target`` (the serving server, or worker ``worker``) ``delay_s`` after the run's
    ``after``-th update."""

    after: int
    target: Target = "server"
    delay_s: float = 0.0
    worker: int = 0

    def describe(self) -> str:
        who = "the server" if self.target == "server" else f"worker {self.worker}"
        return f"{who} after update {self.after} (+{self.delay_s * 1000:.0f} ms)"


def plan_kills(
    seed: int,
    count: int,
    steps: int,
    *,
    target: Target = "server",
    workers: int = 1,
    max_delay_s: float = 0.05,
) -> list[Kill]:
    """``count`` kills at distinct updates drawn from ``1 .. steps - 2`` (in order), each at a
    random delay up to ``max_delay_s``; a worker kill picks a random worker. A kill still pending
    when the run reaches its last update fires then (the driver's rule), so each lands in the run."""
    if target not in TARGETS:
        raise ConfigError(f"kill target {target!r} is not one of {', '.join(TARGETS)}")
    points = range(2, max(steps - 1, 3))
    if count > len(points):
        raise ConfigError(
            f"{count} kills do not fit a run of {steps} steps (kills land in updates 2..{steps - 2})"
        )
    rng = random.Random(seed)
    afters = sorted(rng.sample(points, count))
    return [
        Kill(
            a,
            target,
            round(rng.uniform(0.0, max_delay_s), 4),
            rng.randrange(workers) if target == "worker" else 0,
        )
        for a in afters
    ]


def parse_kill(text: str, workers: int) -> Kill:
    """``N`` / ``server@N`` / ``worker@N`` / ``worker2@N``, with an optional ``+MS`` delay:
    ``server@5+20`` kills the server 20 ms after update 5."""
    who, _, rest = text.rpartition("@")
    when, _, delay = rest.partition("+")
    try:
        after = int(when)
        delay_s = float(delay) / 1000 if delay else 0.0
    except ValueError:
        raise ConfigError(f"--kill-at {text!r}: expected [server|workerK@]N[+MS]") from None
    who = who or "server"
    if who == "server":
        return Kill(after, "server", delay_s)
    if who.startswith("worker"):
        index = int(who[len("worker") :] or 0) if who[len("worker") :].isdigit() or who == "worker" else -1
        if not 0 <= index < workers:
            raise ConfigError(f"--kill-at {text!r}: there are workers 0..{workers - 1}")
        return Kill(after, "worker", delay_s, index)
    raise ConfigError(f"--kill-at {text!r}: the target is server or workerK")


__all__ = ["TARGETS", "Kill", "Target", "parse_kill", "plan_kills"]
