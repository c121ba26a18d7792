"""What a parameter-server run is asked (:class:`PsOptions`, the :data:`MODES`) and what it gives
back (:class:`PsResult`, its :class:`PsEvent` s): apart from the driver, so that the benchmark and
the command line read them without the driver's Ray calls in the way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from game.errors import ConfigError, TranscriptError
from game.training.log.schedule import LostUpdate
from game.training.ps.faults import Kill
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.manifest import read_manifest
from game.training.transcript.reader import Transcript

#: mode -> (asynchronous, recovery)
MODES: dict[str, tuple[bool, str]] = {
    "sync": (False, "checkpoint"),
    "async": (True, "checkpoint"),
    "sync-chain": (False, "chain"),
    "async-chain": (True, "chain"),
    "stateless": (True, "stateless"),
}


@dataclass(frozen=True)
class PsOptions:
    """How a parameter-server run is laid out and what is done to it."""

    mode: str = "sync"
    workers: int = 2
    kills: tuple[Kill, ...] = ()
    every: int = 0  # the server keeps a checkpoint / replicates every this many updates (0: the task's k)
    chain: int = 3  # servers in a replication chain
    keep_every: int = 0  # keep every k-th update's state bytes in the result (curves); 0: none
    poison_steps: tuple[int, ...] = ()  # data steps the workers poison (a dishonest trainer: tests)


@dataclass(frozen=True)
class PsEvent:
    """Something that happened in a run, ``t`` seconds after it started."""

    t: float
    kind: str  # update, kill, failover, worker-lost
    update: int  # the update index it concerns (the lineage's next, for a failover)
    detail: str = ""
    loss: float | None = None


@dataclass
class PsResult:
    """A finished run: the transcript, and what happened on the way."""

    transcript: Transcript
    mode: str
    workers: int
    wall_s: float
    events: list[PsEvent] = field(default_factory=list)
    lost: list[LostUpdate] = field(default_factory=list)
    kept: list[tuple[float, int, bytes]] = field(default_factory=list)  # (t, update, state bytes)
    resumed_from: int | None = None  # the update a run whose driver died had reached; None: a new run

    def to_dict(self) -> dict[str, Any]:
        m = self.transcript.manifest
        return {
            "out_dir": str(self.transcript.directory),
            "mode": self.mode,
            "workers": self.workers,
            "steps": m.steps,
            "state_root": m.state_root,
            "log_root": m.log_root,
            "wall_s": round(self.wall_s, 3),
            "resumed_from": self.resumed_from,
            "kills": [e.__dict__ for e in self.events if e.kind == "kill"],
            "failovers": [e.__dict__ for e in self.events if e.kind == "failover"],
            "lost_updates": [{"update": x.update, "leaf": x.leaf.hex()} for x in self.lost],
        }


def check_run(cfg: TaskConfig, opts: PsOptions, out: Path) -> None:
    """Refuse a run that cannot be (a mode that is none, an asynchronous mode on a synchronous task,
    a finished transcript at ``out``): one line, before any process is started."""
    if opts.mode not in MODES:
        raise ConfigError(f"parameter-server mode {opts.mode!r} is not one of {', '.join(MODES)}")
    if MODES[opts.mode][0] and not cfg.scheduled:
        raise ConfigError(
            f"parameter-server mode {opts.mode!r}: the task is synchronous (max_staleness 0); an asynchronous "
            "server needs a task that allows stale gradients: set max_staleness (e.g. --max-staleness 4)"
        )
    if opts.workers < 1 or (opts.mode.endswith("chain") and opts.chain < 2):
        raise ConfigError("a run needs a worker at least, and a chain two servers")
    if (out / MANIFEST_NAME).is_file() and read_manifest(out).complete:
        raise TranscriptError(f"{out} already holds a finished transcript; choose another --out")


__all__ = ["MODES", "PsEvent", "PsOptions", "PsResult", "check_run"]
