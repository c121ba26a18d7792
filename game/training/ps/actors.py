"""The parameter server's processes on Ray: the workers, the server (restarting from its own
checkpoint, or one link of a replication chain) and the stateless server's update task.

Each computes under vgame's rounding, recording its part of an update's log
(:mod:`game.training.engine.update`): a worker one micro-batch's gradients and log segment on the
state it was handed; the server the fold and the update, which it joins to the workers' segments
into the update's chunk (with the schedule entry in it for an asynchronous task) and returns with
the new state's canonical bytes and leaf. The server's state is always one of the lineage's: it
keeps a checkpoint, or replicates down its chain, only when the driver tells it to, after the
driver has the update; so whatever state a server comes back with is one the transcript holds.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from torch import Tensor

from game.errors import TrainingError
from game.fsio import atomic_write
from game.training.engine.microbatch import Segment, merge_logs
from game.training.engine.states import decode_state
from game.training.engine.step import engine_for
from game.training.engine.update import MicroWork, UpdateEngine, Weights, weights_from_bytes
from game.training.log.formats import decode_chunk
from game.training.log.schedule import Applied, MicroBatchId, ScheduledLog, ScheduleEntry
from game.training.state.canonical import encode_state
from game.training.state.leafhash import leaf_of
from game.training.state.schedstate import step_loss
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: The name of a server's checkpoint files in its home directory.
CHECKPOINT_GLOB = "server-state-*.bin"


@dataclass
class MicroOut:
    """A worker's result for one micro-batch (what travels to the server)."""

    micro: MicroBatchId
    version: int
    grads: list[Tensor | None]
    buffers: dict[str, Tensor]
    segment: bytes  # the log segment, encoded as the chunk of step 0
    ops: int  # tensors the segment logged
    loss: float


@dataclass(frozen=True)
class UpdateMeta:
    """What the driver writes of an update: its chunk and leaf (the state's bytes travel apart)."""

    update: int
    leaf: bytes
    chunk: bytes
    loss: float


class ServerBehind(TrainingError):
    """An update was handed to a server that holds another state: it died and came back since."""


def _engine(
    config: dict[str, Any], profile: str, poison_steps: tuple[int, ...] = (), search: Sequence[str] = ()
) -> UpdateEngine:
    """The engine of an assignment; ``search``: the directories a user's task is found in (its
    config file's), which an actor's process, started by Ray elsewhere, knows only from here."""
    cfg = TaskConfig.from_dict(config, search=tuple(Path(d) for d in search))
    engine = engine_for(cfg, profile)
    poison = {s: engine.runtime.poison(engine.batch(s), s) for s in poison_steps}
    return UpdateEngine(engine, poison)


def apply_outs(
    ue: UpdateEngine, state: TrainState, entry: ScheduleEntry, outs: tuple[MicroOut, ...]
) -> tuple[UpdateMeta, bytes]:
    """The server's part of update ``entry.update`` on ``state`` (state ``update - 1``): the fold of
    the workers' gradients, the update, the chunk, and the new state's bytes."""
    cfg, u = ue.cfg, entry.update
    if state.step != u - 1:
        raise ServerBehind(f"update {u} handed to a server at state {state.step}")
    if [(o.micro, o.version) for o in outs] != [(a.micro, a.version) for a in entry.applied]:
        raise RuntimeError(f"update {u}: the gradients handed over are not the entry's")
    spec = cfg.spec_hash()
    results = [
        MicroWork(Applied(o.micro, o.version), o.grads, o.buffers, torch.tensor(o.loss, dtype=torch.float64))
        for o in outs
    ]
    segments = [Segment(decode_chunk(o.segment, spec, 0), o.ops) for o in outs]
    segments.append(ue.record_apply(state, results))
    step_log = merge_logs(cfg.log_format, u, segments)
    chunk = ScheduledLog(entry, step_log).encode(u, spec) if cfg.scheduled else step_log.encode(u, spec)
    data = encode_state(state)
    loss = step_loss([o.loss for o in outs])
    return UpdateMeta(u, leaf_of(data), chunk, loss), data


class Worker:
    """Computes one micro-batch's gradients and log segment on the state it is handed.

    What it works for (the task, the profile, the data steps it poisons) is its *assignment*, a
    file it reads when it starts (:func:`assign`): Ray restarts a killed actor with the arguments
    it was first made with, so a worker kept for several runs reads the current run's there."""

    def __init__(self, assignment: str) -> None:
        self.assignment = Path(assignment)
        self.ue: UpdateEngine | None = None
        self._key: str | None = None
        self._cached: tuple[bytes, Weights] | None = None  # the last version's leaf and weights
        try:
            self._take()
        except Exception:  # raised again by reset(), to the driver: Ray restarts an actor whose
            self.ue = None  # constructor raises without end, and the driver would wait in vain

    def _take(self) -> UpdateEngine:
        """The assigned engine (built again only when the assignment changed)."""
        text = self.assignment.read_text("utf-8") if self.assignment.is_file() else None
        if text is None:
            raise TrainingError(f"no assignment at {self.assignment}")
        if text != self._key or self.ue is None:
            doc = json.loads(text)
            self.ue = _engine(
                doc["config"], doc["profile"], tuple(doc.get("poison", ())), doc.get("search", ())
            )
            self._key, self._cached = text, None
        return self.ue

    def reset(self) -> int:
        """Take the assignment written for a new run; returns the pid."""
        self._take()
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def warm(self, state: bytes) -> int:
        """Run one micro-batch on ``state`` and drop it: the first one builds the scratch model and
        loads the kernels, which a run's clock should not count. Returns the pid."""
        self._take().record_micro(Applied(MicroBatchId(1, 0), 0), weights_from_bytes(bytes(state)))
        return os.getpid()

    def compute(
        self, micro: MicroBatchId, version: int, leaf: bytes, state: bytes
    ) -> tuple[MicroBatchId, MicroOut]:
        """Micro-batch ``micro`` on state ``version`` (``leaf``, ``state``: its bytes): its id, to
        tell the driver it is done, and its gradients, for the server."""
        ue = self._take() if self.ue is None else self.ue
        if self._cached is None or self._cached[0] != leaf:
            self._cached = (leaf, weights_from_bytes(bytes(state)))
        result, seg = ue.record_micro(Applied(micro, version), self._cached[1])
        assert seg.log is not None  # recorded
        data = seg.log.encode(0, ue.cfg.spec_hash())
        return micro, MicroOut(
            micro, version, result.grads, result.buffers, data, seg.logged, result.loss_value
        )


class Server:
    """A parameter server: holds the state, applies updates; keeps a checkpoint in ``home`` when
    told to (and starts from the newest one there: a restart), or replicates its state down a
    chain of servers when told to."""

    def __init__(self, assignment: str) -> None:
        self.assignment = Path(assignment)
        self._key: str | None = None
        try:
            self.reset()
        except Exception:  # raised again by reset() when the driver asks (as a Worker's)
            self._key = None

    def reset(self) -> int:
        """Take the assignment (:func:`assign`: the task, the profile, its home) and the state it
        starts from: the newest checkpoint in its home, else the task's step 0. Returns the pid."""
        text = self.assignment.read_text("utf-8")
        doc = json.loads(text)
        if text != self._key:
            self.ue = _engine(doc["config"], doc["profile"], search=doc.get("search", ()))
            self._key = text
        self.home = Path(doc["home"])
        self.home.mkdir(parents=True, exist_ok=True)
        self.state = self._newest() or self.ue.engine.init_state()
        log.info("server %d up at state %d", os.getpid(), self.state.step)
        return os.getpid()

    def _newest(self) -> TrainState | None:
        for path in sorted(self.home.glob(CHECKPOINT_GLOB), reverse=True):
            try:
                return decode_state(path.read_bytes(), self.ue.cfg)
            except Exception as exc:  # a file cut by the kill: the one before it
                log.warning("server checkpoint %s unusable: %s", path.name, exc)
        return None

    def pid(self) -> int:
        return os.getpid()

    def warm(self) -> int:
        """Build what the first update needs (the engine's kernels), outside a run's clock."""
        self.ue.record_micro(Applied(MicroBatchId(1, 0), 0), weights_from_bytes(self.state_bytes()))
        return os.getpid()

    def hello(self) -> tuple[int, bytes]:
        """The state this server holds: its index and leaf."""
        return self.state.step, leaf_of(encode_state(self.state))

    def state_bytes(self) -> bytes:
        return encode_state(self.state)

    def apply(self, entry: ScheduleEntry, *outs: MicroOut) -> tuple[UpdateMeta, bytes]:
        return apply_outs(self.ue, self.state, entry, outs)

    def checkpoint(self, version: int) -> None:
        """Keep the state (which must be ``version``) as this server's checkpoint; older ones go."""
        if self.state.step != version:
            raise RuntimeError(f"asked to keep state {version}, holding {self.state.step}")
        seed_server(self.home, version, encode_state(self.state))
        for path in sorted(self.home.glob(CHECKPOINT_GLOB))[:-1]:
            path.unlink()

    def replicate_down(self, version: int, chain: list[Any]) -> None:
        """Send the state (``version``) to the next server of ``chain`` and wait for its answer only
        (the seed's relaxed chain replication: it passes the state on down the rest by itself)."""
        if self.state.step != version:
            raise RuntimeError(f"asked to replicate state {version}, holding {self.state.step}")
        if chain:
            ray.get(chain[0].receive.remote(version, ray.put(encode_state(self.state)), chain[1:]))

    def receive(self, version: int, data: bytes, rest: list[Any]) -> None:
        """A replica of state ``version`` from the server before this one in the chain."""
        self.state = decode_state(bytes(data), self.ue.cfg)
        if rest:
            rest[0].receive.remote(version, ray.put(bytes(data)), rest[1:])  # no wait: relaxed


def seed_server(home: Path, version: int, data: bytes) -> None:
    """Leave state ``version`` (its canonical bytes) in a server's ``home`` as its checkpoint, so
    that it starts there: a run whose driver died goes on from its newest state."""
    home.mkdir(parents=True, exist_ok=True)
    atomic_write(home / f"server-state-{version:09d}.bin", data)


def assign(path: Path, config: dict[str, Any], profile: str, **more: Any) -> None:
    """Write an actor's assignment (read when it starts or is reset)."""
    atomic_write(path, json.dumps({"config": config, "profile": profile, **more}, sort_keys=True).encode())


def stateless_apply(
    config: dict[str, Any],
    profile: str,
    search: Sequence[str],
    pid_file: str,
    entry: ScheduleEntry | None,
    state: bytes,
    *outs: MicroOut,
) -> tuple[UpdateMeta | None, bytes]:
    """The stateless server: one update as a task, from the state's bytes in the object store to
    the new state's bytes there (a task killed midway is run again by Ray, from the same inputs).
    ``entry`` None warms a process up (its engine built, its kernels loaded) ahead of a run's clock:
    Ray runs the next task of the same function there."""
    ue = _cached_engine(config, profile, search)
    if entry is None:
        ue.record_micro(Applied(MicroBatchId(1, 0), 0), weights_from_bytes(bytes(state)))
        return None, b""
    atomic_write(Path(pid_file), f"{os.getpid()} {entry.update}".encode())
    return apply_outs(ue, decode_state(bytes(state), ue.cfg), entry, outs)


def _cached_engine(config: dict[str, Any], profile: str, search: Sequence[str] = ()) -> UpdateEngine:
    ue = _CACHE.get(profile) if _CACHE.get("config") == config else None
    if ue is None:
        ue = _engine(config, profile, search=search)
        _CACHE.clear()
        _CACHE.update({"config": config, profile: ue})
    return ue


#: The stateless task's engine, kept by the process that runs it (Ray reuses its workers).
_CACHE: dict[str, Any] = {}


__all__ = [
    "MicroOut",
    "Server",
    "ServerBehind",
    "UpdateMeta",
    "Worker",
    "apply_outs",
    "assign",
    "seed_server",
    "stateless_apply",
]
