"""One rank of `vgame train --workers W`: ``python -m game.training.parallel.worker JOB``, as
torchrun starts it (:mod:`.launch`).

It writes its pid (``rank-R.pid``, for tests that kill a rank), runs its part
(:func:`~.dataparallel.run_rank`), and leaves in the job's directory rank 0's report
(``result.json``; its warnings in ``messages-0.log``) and ``done-R``, or the error that stopped it (``error-R.json``: class, message,
whether it is one of vgame's own), for the launcher to show; a rank that left neither was killed. SIGTERM (torchrun stopping the group when another rank
failed, or the launcher on Ctrl-C) unwinds like Ctrl-C, so rank 0's transcript writer still writes
the steps it was handed. A rank that finished leaves without the interpreter's teardown (:func:`_leave`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from game.errors import VGameError
from game.fsio import atomic_write
from game.training.parallel.dataparallel import run_rank
from game.training.parallel.launch import MESSAGES_NAME, RESULT_NAME, Job, done_name, error_name, pid_name

log = logging.getLogger(__name__)


def _stop(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second one must not cut the clean-up short
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m game.training.parallel.worker JOB.json (started by torchrun)", file=sys.stderr
        )
        return 2
    path = Path(args[0])
    where = path.parent
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank}: %(levelname)s %(name)s: %(message)s")
    if rank == 0:  # its warnings, for the launcher to log again
        relay = logging.FileHandler(where / MESSAGES_NAME)
        relay.setLevel(logging.WARNING)
        relay.addFilter(lambda record: record.exc_info is None)  # a traceback stays in torchrun's log
        logging.getLogger().addHandler(relay)
    signal.signal(signal.SIGTERM, _stop)
    atomic_write(where / pid_name(rank), f"{os.getpid()}\n".encode())
    try:
        job = Job.read(path)
        report = run_rank(job.task_config(), job.profile, Path(job.out), eval_every=job.eval_every)
        if report is not None:
            atomic_write(where / RESULT_NAME, json.dumps(report.to_dict()).encode())
        atomic_write(where / done_name(rank), b"")
        return 0
    except BaseException as exc:
        doc = {
            "rank": rank,
            "type": type(exc).__name__,
            "message": str(exc),
            "vgame": isinstance(exc, VGameError),
        }
        atomic_write(where / error_name(rank), json.dumps(doc).encode())
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if not isinstance(exc, VGameError):
            log.exception("stopped")
        return 2


def _leave(code: int) -> None:
    """Exit with ``code``. A rank whose work is done (its ``done-R`` written, every file synced)
    leaves without the interpreter's teardown: a crash there (a communication library's threads
    going down, a task's own exit handler) would end the rank with another code after the fact, and
    torchrun would stop the ranks still finishing, rank 0 among them, and fail a complete run."""
    if code != 0:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    _leave(main())
