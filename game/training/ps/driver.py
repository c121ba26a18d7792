"""The parameter-server run: Ray actors for the workers and the server, the work they are handed,
the transcript written as updates come back, and the failures injected and recovered from.

Five modes (the seed's figures 4-5): ``sync`` and ``async`` with a server that restarts from its
own checkpoint; ``sync-chain`` and ``async-chain``, where a backup takes over with the state last
replicated down the chain; ``stateless``, where each update is a Ray task from the state's bytes in
the object store to the next state's (a killed one is run again by Ray), and the workers go on
computing on the newest state meanwhile. The driver (this process) decides everything through a
:class:`~.pool.WorkPool` and writes the transcript; the lineage's states live in the object store,
owned by the driver, so no server's death takes one with it. While a stateful server is down the
workers wait (as in the seed); after it is back at state ``v`` the transcript is cut back to leaf
``v``, and an asynchronous task's next update lists the updates lost (a synchronous task's are
computed again, to the same leaves). Every process records its part under vgame's rounding, so the
transcript is what one process records by the same schedule (:func:`~game.training.engine.scheduled.
train_scheduled`), and the one-process audit replays it bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from game.errors import TrainingError
from game.training.engine.scheduled import next_checkpoint
from game.training.engine.states import check_reloads
from game.training.engine.step import engine_for
from game.training.log.chunks import EncodedChunk
from game.training.log.formats import new_step_log
from game.training.log.schedule import LostUpdate, ScheduleEntry
from game.training.ps.actors import ServerBehind, seed_server, stateless_apply
from game.training.ps.cluster import DIED, PsCluster, own_errors, until_up
from game.training.ps.faults import Kill
from game.training.ps.options import MODES, PsEvent, PsOptions, PsResult, check_run
from game.training.ps.pool import WorkPool
from game.training.ps.resume import drop_pending, keep_pending, resume
from game.training.state.canonical import encode_state
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.manifest import is_checkpoint_step, make_transcript_dir
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

log = logging.getLogger(__name__)


def train_ps(
    cfg: TaskConfig,
    profile: str,
    out_dir: Path | str,
    opts: PsOptions,
    *,
    cluster: PsCluster | None = None,
    progress: Callable[[int, int], None] | None = None,
    search: Sequence[Path] = (),
) -> PsResult:
    """Train ``cfg`` with a parameter server on Ray (``opts.mode``) into a transcript at ``out_dir``
    (a new one, or one a run whose driver died left unfinished: :mod:`.resume`); Ray must be up
    (:func:`~.cluster.ray_session`). ``cluster``: actors kept for several runs
    (:class:`~.cluster.PsCluster`); None starts them for this run alone. ``progress(update, steps)``
    after each update (and back to the state a failover returns to). ``search``: the directories
    a user's task is found in (its config file's), for the actors' processes."""
    out = Path(out_dir)
    check_run(cfg, opts, out)
    make_transcript_dir(out)
    own = cluster is None
    cluster = cluster or PsCluster()
    where = tuple(str(Path(d).resolve()) for d in search)
    try:
        with own_errors():
            return _Run(cfg, profile, out, opts, progress, where).go(cluster)
    finally:
        if own:
            cluster.close()


class _Run:
    """One run's state (see the module docstring)."""

    def __init__(
        self,
        cfg: TaskConfig,
        profile: str,
        out: Path,
        opts: PsOptions,
        progress: Callable[[int, int], None] | None,
        search: tuple[str, ...] = (),
    ) -> None:
        self.cfg, self.profile, self.out, self.opts = cfg, profile, out, opts
        self.search = search
        self.progress = progress or (lambda done, total: None)
        self.asynchronous, self.recovery = MODES[opts.mode]
        self.every = opts.every or cfg.checkpoint_interval
        self.home = out.parent / f"{out.name}.ps"
        self.pool = WorkPool(cfg.steps, cfg.accumulate, cfg.max_staleness if self.asynchronous else 0)
        self.pool.ahead = opts.workers  # one micro-batch a worker beyond the next update's
        self.versions: dict[int, Any] = {}  # lineage state -> ObjectRef of its canonical bytes
        self.inflight: dict[Any, tuple[str, Any]] = {}
        self.idle: list[int] = list(range(opts.workers))
        self.pids: dict[int, int | None] = {}
        self.events: list[PsEvent] = []
        self.lost: list[LostUpdate] = []
        self.kept: list[tuple[float, int, bytes]] = []
        self.kills = list(opts.kills)
        self.fire_at: float | None = None
        self.applied_total = 0
        self.reloads_checked = False  # the state after this run's first update, against its bytes
        self.resumed_from: int | None = None
        self.applying = False
        self.down = False  # the serving server was killed and has not recovered yet
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, kind: str, update: int, detail: str = "", loss: float | None = None) -> None:
        self.events.append(PsEvent(round(self.now(), 4), kind, update, detail, loss))
        if kind != "update":
            log.info("ps %s: %s at update %d: %s", self.opts.mode, kind, update, detail)

    # ---- start ---------------------------------------------------------------------------------

    def _open(self) -> tuple[int, bytes]:
        """The transcript, new or gone on with (:mod:`.resume`), and the lineage so far; returns
        the newest state's index and bytes."""
        cfg = self.cfg
        engine = engine_for(cfg, self.profile)
        if (self.out / MANIFEST_NAME).exists():
            self.writer, back = resume(self.out, cfg, self.profile, self.home, engine)
            if back.step >= 0:
                self.pool.restore(back.leaves, back.entries, back.lost)
                self.resumed_from = self.applied_total = back.step
                gone = [k for k in self.kills if k.after <= back.step]  # the run that died had them
                if gone:
                    log.info(
                        "ps: going on from update %d, kills planned before it dropped: %d",
                        back.step,
                        len(gone),
                    )
                self.kills = [k for k in self.kills if k.after > back.step]
                return back.step, back.state
        else:
            self.writer = TranscriptWriter.create(self.out, cfg, self.profile)
        data0 = encode_state(engine.init_state())
        self.writer.append_step(0, leaf_of(data0), new_step_log(cfg.log_format, 0), data0)
        self.pool.start(leaf_of(data0))
        return 0, data0

    def go(self, cluster: PsCluster) -> PsResult:
        cfg, opts = self.cfg, self.opts
        top, top_data = self._open()
        top_leaf = leaf_of(top_data)
        self.versions[top] = ray.put(top_data)
        config = cfg.to_dict()
        shutil.rmtree(self.home, ignore_errors=True)  # a run cut short before left its servers' files
        self.home.mkdir(parents=True)
        homes = {
            "checkpoint": [self.home / "server"],
            "chain": [self.home / f"chain-{i}" for i in range(opts.chain)],
        }
        if self.pool.lost:  # a failover's lost updates still to be listed: kept over another death
            keep_pending(self.home, top, self.pool.lost)
        for home in homes.get(self.recovery, []) if top else []:
            seed_server(home, top, top_data)  # the servers start from the lineage's newest state
        self.workers, self.chain = cluster.assign(
            config,
            self.profile,
            workers=opts.workers,
            homes=homes.get(self.recovery, []),
            poison=opts.poison_steps,
            search=[Path(d) for d in self.search],
        )
        if self.recovery == "stateless":
            self.apply_task: Any = ray.remote(stateless_apply).options(
                num_cpus=0, max_retries=8, num_returns=2
            )
            self.pid_file = self.home / "stateless-apply.pid"
        for s in self.chain:
            if tuple(ray.get(s.hello.remote())) != (top, top_leaf):
                raise TrainingError(f"a server started at another state than the run's state {top}")
        self.config = config
        # every process up and warm before the clock starts
        pids = ray.get([w.warm.remote(self.versions[top]) for w in self.workers])
        self.pids = dict(enumerate(pids))
        if self.chain:
            self.pids[-1] = ray.get([s.warm.remote() for s in self.chain])[0]
        else:
            # two processes warm, at once: a killed update is run again in the other, not in a new one
            warm = [
                self.apply_task.remote(config, self.profile, self.search, "", None, self.versions[top])[0]
                for _ in range(2)
            ]
            ray.get(warm)
        self.t0 = time.monotonic()
        self.progress(top, cfg.steps)
        try:
            with self.writer:
                while not self.pool.done:
                    self._submit_update()  # first: taking an update hands back gradients too stale
                    self._fill()
                    self._maybe_kill()
                    wait = 0.002 if self._kill_due() else 0.5
                    if not self.inflight:
                        if not self._kill_due():
                            raise TrainingError(f"the run stalled at update {self.pool.update} (a bug)")
                        time.sleep(wait)
                        continue
                    ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=wait)
                    for ref in ready:
                        self._handle(ref)
                self.writer.finish()
        finally:
            self.inflight.clear()
        for k in self.kills:
            log.warning("ps %s: kill of %s never fired (the run ended first)", opts.mode, k.describe())
        drop_pending(self.home)
        return PsResult(
            Transcript(self.out),
            opts.mode,
            opts.workers,
            self.now(),
            self.events,
            self.lost,
            self.kept,
            resumed_from=self.resumed_from,
        )

    # ---- handing out and applying ---------------------------------------------------------------

    def _fill(self) -> None:
        while self.idle:
            micro = self.pool.next_micro()
            if micro is None:
                return
            w = self.idle.pop(0)
            version = self.pool.hand_out(micro)
            tag, result = (
                self.workers[w]
                .compute.options(num_returns=2)
                .remote(micro, version, self.pool.leaves[version], self.versions[version])
            )
            self.inflight[tag] = ("grad", (w, micro, result))

    def _revive(self, w: int) -> None:
        """Ask dead worker ``w`` its pid: it takes work again once Ray has restarted it."""
        self.inflight[self.workers[w].pid.remote()] = ("revive", w)

    def _submit_update(self) -> None:
        if self.applying:
            return
        if (
            self.kills
            and self.pool.update == self.cfg.steps
            and self.recovery != "stateless"
            and not self.down
        ):
            self._maybe_kill(now=True)  # a kill still planned lands before the last update
            if self.down:
                return
        taken = self.pool.take()
        if taken is None:
            return
        entry, results = taken
        u = entry.update
        if self.recovery == "stateless":
            meta, data = self.apply_task.remote(
                self.config,
                self.profile,
                self.search,
                str(self.pid_file),
                entry,
                self.versions[u - 1],
                *results,
            )
        else:
            meta, data = self.chain[0].apply.options(num_returns=2).remote(entry, *results)
        self.inflight[meta] = ("apply", (entry, data))
        self.applying = True

    def _handle(self, ref: Any) -> None:
        kind, info = self.inflight.pop(ref)
        if kind == "grad":
            w, micro, result = info
            try:
                ray.get(ref)
            except DIED:
                self.event("worker-lost", self.pool.update, f"worker {w} died computing {micro}")
                self.pids[w] = None
                self.pool.give_back(micro)
                self._revive(w)
                return
            self.pool.returned(micro, result)
            self.idle.append(w)
            return
        if kind == "revive":  # a dead worker's restart, asked after until it answers
            try:
                self.pids[info] = ray.get(ref)
            except DIED:
                time.sleep(0.05)
                self._revive(info)
                return
            self.idle.append(info)
            return
        if kind == "done":
            with contextlib.suppress(*DIED):  # the server died after the update: its next call fails over
                ray.get(ref)
            return
        entry, data = info
        self.applying = False
        try:
            meta = ray.get(ref)
        except (*DIED, ServerBehind):  # died in the update, or before it and came back behind
            self._failover(entry.update)
            return
        self._applied(entry, meta, data)

    def _applied(self, entry: ScheduleEntry, meta: Any, data: Any) -> None:
        u, cfg, writer = entry.update, self.cfg, self.writer
        if self.recovery == "stateless" and self.down:
            self.down = False  # the killed update ran again, from the same inputs, in a warm spare:
            self.pool.ahead = self.opts.workers
            spare = self.apply_task.remote(
                self.config, self.profile, self.search, "", None, self.versions[u - 1]
            )[0]
            self.inflight[spare] = ("done", None)  # warm another in its place, meanwhile
        self.pool.confirm(meta.leaf)
        if not self.reloads_checked:  # the optimizer's state exists now
            check_reloads(ray.get(data), cfg)
            self.reloads_checked = True
        self.applied_total += 1
        self.versions[u] = data
        for v in entry.versions:  # a state a later update computes on across a checkpoint
            if not is_checkpoint_step(v, cfg.checkpoint_interval, cfg.steps) and next_checkpoint(v, cfg) < u:
                writer.add_checkpoint(v, ray.get(self.versions[v]))
        checkpoint = ray.get(data) if writer.wants_checkpoint(u) else None
        writer.append_step(u, meta.leaf, EncodedChunk(u, meta.chunk, cfg.log_format), checkpoint)
        if entry.lost:  # the failover's lost updates are listed on disk now: nothing pending
            writer.flush()
            drop_pending(self.home)
        self.event("update", u, f"{len(entry.applied)} micro-batches on {list(entry.versions)}", meta.loss)
        self.progress(u, cfg.steps)
        if self.opts.keep_every and u % self.opts.keep_every == 0:
            self.kept.append((self.now(), u, ray.get(data)))
        window = u - 1 - cfg.max_staleness
        for v in [v for v in self.versions if v < window]:
            del self.versions[v]
        if self.chain and u % self.every == 0 and u < cfg.steps:
            call = (
                self.chain[0].checkpoint.remote(u)
                if self.recovery == "checkpoint"
                else self.chain[0].replicate_down.remote(u, self.chain[1:])
            )
            self.inflight[call] = ("done", None)

    # ---- failures ------------------------------------------------------------------------------

    def _failover(self, update: int) -> None:
        """The serving server died during update ``update``: the next one serves (the same actor,
        restarted by Ray from its checkpoint, or the next in the chain), from its state."""
        start = self.now()
        self.pool.abandon()
        if self.recovery == "chain":
            self.chain.append(self.chain.pop(0))  # it comes back empty, at the tail
        server = self.chain[0]
        version, leaf = until_up(lambda: ray.get(server.hello.remote()))
        self.pids.pop(-1, None)
        lost = self.pool.rewind(version, leaf)
        self.lost += lost
        keep_pending(self.home, version, self.pool.lost)  # before the cut: a death in between keeps them
        self.writer.close()
        self.writer = TranscriptWriter.resume(self.out, self.cfg, keep=version + 1)
        for v in [v for v in self.versions if v > version]:
            del self.versions[v]
        if version not in self.versions:
            self.versions[version] = server.state_bytes.remote()
        if self.opts.keep_every:  # the model went back to this state now: a curve shows the drop
            self.kept.append((self.now(), version, ray.get(self.versions[version])))
        self.down = False
        self.progress(version, self.cfg.steps)
        how = (
            "restarted from its checkpoint"
            if self.recovery == "checkpoint"
            else "the next in the chain took over"
        )
        self.event(
            "failover",
            version + 1,
            f"server died in update {update}; {how} at state {version} after {self.now() - start:.2f} s; "
            f"{len(lost)} update(s) lost",
        )

    def _kill_due(self) -> bool:
        if not self.kills or (self.down and self.kills[0].target == "server"):
            return False  # a server kill waits for the last one's recovery
        return self.applied_total >= self.kills[0].after or self.pool.update == self.cfg.steps

    def _maybe_kill(self, *, now: bool = False) -> None:
        """Fire the next planned kill when it is due: ``delay_s`` after its update, or at once when
        the run is at its last update (``now``), so that every planned kill lands in the run."""
        if not self._kill_due():
            return
        kill = self.kills[0]
        if self.fire_at is None:
            self.fire_at = time.monotonic() + kill.delay_s
        if time.monotonic() < self.fire_at and not now and self.pool.update < self.cfg.steps:
            return
        pid, what = self._victim(kill)
        if pid is None:
            return  # nothing to kill yet (the stateless server runs no update now): next round
        os.kill(pid, signal.SIGKILL)
        self.kills.pop(0)
        self.fire_at = None
        if kill.target == "server":
            self.down = True  # until the failover (or, stateless, the update run again) is done
            self.pids[-1] = None
            if self.recovery == "stateless":
                self.pool.ahead = None  # the workers go on, as far as the task's window allows
        else:
            self.pids[kill.worker] = None  # its next pid is the restarted process's
        self.event("kill", self.pool.update, f"SIGKILL {what} (pid {pid}), planned {kill.describe()}")

    def _victim(self, kill: Kill) -> tuple[int | None, str]:
        if kill.target == "worker":
            w = kill.worker
            if self.pids.get(w) is None:
                self.pids[w] = until_up(lambda: ray.get(self.workers[w].pid.remote()))
            return self.pids[w], f"worker {w}"
        if self.recovery == "stateless":
            if not self.applying or not self.pid_file.is_file():
                return None, ""
            pid, update = self.pid_file.read_text().split()
            return (
                (int(pid), f"the stateless server's update {update}")
                if int(update) == self.pool.update
                else (None, "")
            )
        if self.pids.get(-1) is None:
            self.pids[-1] = until_up(lambda: ray.get(self.chain[0].pid.remote()))
        return self.pids[-1], "the server"


__all__ = ["MODES", "PsEvent", "PsOptions", "PsResult", "train_ps"]
