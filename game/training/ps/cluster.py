"""The processes of the parameter-server runs: a local Ray instance, and the actors kept for
several runs.

Starting an actor costs seconds (a process that imports torch, and builds its task's model under
the init mode, which loads torch's compiler stack): more than a small task's whole run. A
:class:`PsCluster` starts its workers and servers once and hands them to each run
(:func:`~.driver.train_ps`), which assigns them its task (:func:`~.actors.assign`, a file each reads
when it starts or is reset: Ray restarts a killed actor with the arguments it was first made with,
so the current assignment cannot travel in them). A run given no cluster makes one of its own and
ends it with the run.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import ray._private.worker as ray_worker

from game.errors import TrainingError, VGameError
from game.training.ps.actors import Server, Worker, assign

log = logging.getLogger(__name__)


@contextmanager
def ray_session(num_cpus: int | None = None) -> Iterator[None]:
    """A local Ray instance for this process (none started when one is up already), its workers
    importing this very checkout of vgame (and the current directory, where a task's module may be)."""
    if ray.is_initialized():
        yield
        return
    root = str(Path(__file__).resolve().parents[3])
    paths = [root, os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}},
    )
    # Ray prints each worker's death on stdout from a thread of its own; the driver reports the
    # kills and failovers itself, so those lines go to the log (a --json stays one document)
    printer = ray_worker.print_to_stdstream
    ray_worker.print_to_stdstream = _to_log
    try:
        yield
    finally:
        ray.shutdown()
        ray_worker.print_to_stdstream = printer


def _to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    for line in data.get("lines", []):
        log.info("ray (%s): %s", data.get("pid", "?"), line)


@contextmanager
def own_errors() -> Iterator[None]:
    """vgame's error raised in an actor (a task that does not load there, a model that carries
    state from one micro-batch to the next) raised as itself, not as Ray's wrapping of it."""
    try:
        yield
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, VGameError):
            raise exc.cause from None
        raise


def _reset(actor: Any) -> int:
    with own_errors():
        return int(ray.get(actor.reset.remote()))


class PsCluster:
    """Worker and server actors (each restarted by Ray when killed), assigned a run at a time."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="vgame-ps-"))
        self.workers: list[Any] = []
        self.servers: list[Any] = []
        self._worker = ray.remote(Worker).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        self._server = ray.remote(Server).options(num_cpus=0, max_restarts=-1, max_task_retries=0)

    def assign(
        self,
        config: dict[str, Any],
        profile: str,
        *,
        workers: int,
        homes: list[Path],
        poison: tuple[int, ...] = (),
        search: Sequence[Path] = (),
    ) -> tuple[list[Any], list[Any]]:
        """``workers`` workers and a server for each of ``homes``, assigned ``config`` on
        ``profile`` (servers start from their home's newest checkpoint, else step 0), each reset
        and answering; ``search``: where a user's task is found (its config file's directory).
        More actors are started when a run needs more than there are."""
        where = [str(Path(d).resolve()) for d in search]
        for i in range(workers):
            assign(self.home / f"worker-{i}.json", config, profile, poison=list(poison), search=where)
        for i, home in enumerate(homes):
            assign(self.home / f"server-{i}.json", config, profile, home=str(home), search=where)
        while len(self.workers) < workers:
            self.workers.append(self._worker.remote(str(self.home / f"worker-{len(self.workers)}.json")))
        while len(self.servers) < len(homes):
            self.servers.append(self._server.remote(str(self.home / f"server-{len(self.servers)}.json")))
        chosen_workers, chosen_servers = self.workers[:workers], self.servers[: len(homes)]
        for actor in [*chosen_workers, *chosen_servers]:  # one killed in the last run may be restarting
            until_up(functools.partial(_reset, actor))
        return chosen_workers, chosen_servers

    def close(self) -> None:
        for handle in [*self.workers, *self.servers]:
            ray.kill(handle)
        self.workers, self.servers = [], []
        shutil.rmtree(self.home, ignore_errors=True)


#: What a call to an actor raises while it is dead or being restarted.
DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


def until_up(call: Callable[[], Any], timeout_s: float = 180.0) -> Any:
    """``call()`` again until the actor it asks answers (Ray restarts a killed one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except DIED:
            if time.monotonic() > deadline:
                raise TrainingError(f"no answer from a restarted actor in {timeout_s:.0f} s") from None
            time.sleep(0.05)


__all__ = ["DIED", "PsCluster", "own_errors", "ray_session", "until_up"]
