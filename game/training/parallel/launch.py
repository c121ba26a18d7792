"""`vgame train --workers W`: W local processes launched by torchrun, watched until they finish.

The launcher writes the job (the task config, the directories a user's task is found in, the
profile, the transcript directory) to a file, runs ``python -m torch.distributed.run --standalone
--nproc-per-node W -m game.training.parallel.worker JOB`` (torchrun's own Python entry: its
rendezvous, its watch over the ranks, and a whole group stopped when one rank fails), shows the
steps as they land in the transcript, and reads back rank 0's report, or the error a rank wrote
(:mod:`.worker`). A run whose workers stopped (a rank killed, a full disk, Ctrl-C) leaves the usual
resumable transcript: the same command goes on from its last complete step.

torchrun's own output goes to ``torchrun.log`` in the job's directory (a temporary one unless the
caller names it), whose last lines an error quotes when no rank could say why it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from game import errors
from game.errors import TrainingError, VGameError
from game.fsio import atomic_write
from game.training.engine.train import TrainResult
from game.training.parallel.dataparallel import check_workers
from game.training.task.config import TaskConfig
from game.training.transcript.manifest import read_manifest
from game.training.transcript.reader import steps_on_disk

log = logging.getLogger(__name__)

JOB_NAME = "job.json"
RESULT_NAME = "result.json"  # rank 0's report
LOG_NAME = "torchrun.log"
#: How often the launcher looks at the transcript for progress, in seconds.
POLL_S = 0.2


def error_name(rank: int) -> str:
    return f"error-{rank}.json"


def pid_name(rank: int) -> str:
    return f"rank-{rank}.pid"


def done_name(rank: int) -> str:
    return f"done-{rank}"


#: rank 0's warnings (a disk too small for the checkpoints to come, ...), one a line, which the
#: launcher logs again as they come
MESSAGES_NAME = "messages-0.log"


@dataclass(frozen=True)
class Job:
    """What every rank is told: the task, where a user's task is found, the profile, the transcript."""

    config: dict[str, Any]
    spec_hash: str
    search: tuple[str, ...]
    profile: str
    out: str
    eval_every: int = 0

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def read(cls, path: Path) -> Job:
        doc = json.loads(path.read_text())
        return cls(**{**doc, "search": tuple(doc["search"])})

    def task_config(self) -> TaskConfig:
        """The config, rebuilt and held to the launcher's spec hash."""
        cfg = TaskConfig.from_dict(self.config, search=tuple(Path(p) for p in self.search))
        if cfg.spec_hash().hex() != self.spec_hash:
            raise TrainingError(
                f"the worker's task hashes to {cfg.spec_hash().hex()[:16]}..., the launcher's to "
                f"{self.spec_hash[:16]}...: the task's code or data differ between them"
            )
        return cfg


@dataclass(frozen=True)
class Launched:
    """A finished data-parallel run: rank 0's result and what else it reported."""

    result: TrainResult
    workers: int
    evals: list[dict[str, float]]
    step_ends: list[float]  # rank 0's clock (perf_counter) at each step it queued


def launch(
    cfg: TaskConfig,
    profile: str,
    out: Path | str,
    workers: int,
    *,
    search: Sequence[Path | str] = (),
    eval_every: int = 0,
    progress: Callable[[int, int], None] | None = None,
    job_dir: Path | str | None = None,
) -> Launched:
    """Train ``cfg`` on ``workers`` local processes (torchrun) into the transcript ``out``.

    ``search``: directories a user's task is found in (its config file's). ``job_dir``: where the
    job, the ranks' pid files and torchrun's log go (a temporary directory, removed after, when
    None). Raises the error a rank raised (a :class:`~game.errors.VGameError` of the same class
    where it has one), or :class:`~game.errors.TrainingError` saying which rank stopped."""
    check_workers(cfg, workers)
    out = Path(out).resolve()
    own_dir = job_dir is None
    where = Path(tempfile.mkdtemp(prefix="vgame-workers-")) if job_dir is None else Path(job_dir)
    where.mkdir(parents=True, exist_ok=True)
    for stale in (
        RESULT_NAME,
        *(error_name(r) for r in range(workers)),
        *(pid_name(r) for r in range(workers)),
    ):
        (where / stale).unlink(missing_ok=True)
    job = Job(
        config=cfg.to_dict(),
        spec_hash=cfg.spec_hash().hex(),
        search=tuple(str(Path(p).resolve()) for p in (*search, Path.cwd())),
        profile=profile,
        out=str(out),
        eval_every=eval_every,
    )
    atomic_write(where / JOB_NAME, job.to_json())
    try:
        code = _run_torchrun(where, workers, cfg.steps, out, progress)
        return _outcome(where, workers, code, cfg, out)
    finally:
        if own_dir:
            shutil.rmtree(where, ignore_errors=True)


def _run_torchrun(
    where: Path, workers: int, steps: int, out: Path, progress: Callable[[int, int], None] | None
) -> int:
    """torchrun with ``workers`` ranks on the job; its exit code. Ctrl-C (or the CLI's SIGTERM)
    stops the ranks first (rank 0 writes the steps it finished), then goes on."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={workers}", "--max-restarts=0", "--monitor-interval=0.1",
        "-m", "game.training.parallel.worker", str(where / JOB_NAME),
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # each rank sets its profile's threads; torchrun's banner off
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*sys.path, env.get("PYTHONPATH", "")) if p)
    relay = _Relay(where / MESSAGES_NAME)
    with (where / LOG_NAME).open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                if progress is not None:
                    progress(max(steps_on_disk(out) - 1, 0), steps)
                relay.poll()
                time.sleep(POLL_S)
            relay.poll()
        except BaseException:  # Ctrl-C, SIGTERM through the CLI: stop the ranks, then go on
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if progress is not None:
        progress(max(steps_on_disk(out) - 1, 0), steps)
    return proc.returncode


def _outcome(where: Path, workers: int, code: int, cfg: TaskConfig, out: Path) -> Launched:
    """Rank 0's report, or the error that stopped the run."""
    result = where / RESULT_NAME
    if code == 0 and result.exists():
        doc = json.loads(result.read_text())
        return Launched(TrainResult.from_dict(doc["result"]), workers, doc["evals"], doc["step_ends"])
    state = _on_disk(out, cfg)
    found = [json.loads(p.read_text()) for r in range(workers) if (p := where / error_name(r)).exists()]
    # A rank's own error first; then a rank that died without a word (killed: the others' errors
    # only say it went away); then those.
    found.sort(key=lambda e: (not e["vgame"], e["rank"]))
    silent = [
        r
        for r in range(workers)
        if (where / pid_name(r)).exists()
        and not any((where / n(r)).exists() for n in (error_name, done_name))
    ]
    if silent and not (found and found[0]["vgame"]):
        raise TrainingError(
            f"rank {silent[0]} of {workers} died without a word (killed by a signal, or out of memory)"
            + (f"; {state}" if state else "")
        )
    if found:
        first = found[0]
        cls = getattr(errors, first["type"], None)
        message = f"{first['message']} (rank {first['rank']} of {workers}{'; ' + state if state else ''})"
        again: Exception = TrainingError(f"{first['type']}: {message}")
        if isinstance(cls, type) and issubclass(cls, VGameError):
            with contextlib.suppress(TypeError):  # an error class that takes more than a message
                again = cls(message)
        raise again
    tail = _tail(where / LOG_NAME)
    said = f"; {state}" if state else ""
    raise TrainingError(
        f"the {workers} workers stopped (torchrun exit code {code}){said}. torchrun said:\n{tail}"
    )


class _Relay:
    """Rank 0's warnings, logged here as they land in their file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at = 0

    def poll(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.at)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only
        self.at += end
        for line in data[:end].decode(errors="replace").splitlines():
            log.warning("%s", line)


def _on_disk(out: Path, cfg: TaskConfig) -> str:
    """What a stopped run left of this task's transcript in ``out`` ("" when there is none)."""
    try:
        if read_manifest(out).spec_hash != cfg.spec_hash().hex():
            return ""
    except (VGameError, OSError):
        return ""
    done = max(steps_on_disk(out) - 1, 0)
    if not done:
        return f"no step is complete in {out}"
    return f"{done} of {cfg.steps} steps are complete in {out}; run the same command to go on from there"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join(text[-lines:]) or "(no output)"


__all__ = ["JOB_NAME", "MESSAGES_NAME", "Job", "Launched", "done_name", "error_name", "launch", "pid_name"]
