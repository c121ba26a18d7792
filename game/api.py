"""vgame's public Python API: define a task of your own, train it verifiably, audit it.

A task is a build function that returns a :class:`Task` (model factory, dataset, loss, optimizer,
...), declared with :func:`task`; see :mod:`game.training.task.define` for every field. A config
names it (``task = "mypkg.tasks:build"``), and :func:`fit` / `vgame train` trains it, :func:`audit`
/ `vgame audit` replays it on other hardware, and the nodes play the verification game over it::

    from game.api import fit, audit
    run = fit("examples/own_task/task.toml", "runs/own", profile="cpu-1t")
    assert audit("runs/own", "noisy").match
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from game.judgeupdate import judged_step
from game.training.engine.audit import AuditResult
from game.training.engine.audit import audit as _audit
from game.training.engine.replay import ReplayResult
from game.training.engine.train import TrainResult
from game.training.engine.train import train as _train
from game.training.task.config import TaskConfig, load_config
from game.training.task.datasets import TensorData, TokenWindows, load_arrays
from game.training.task.define import Task, TaskFactory, task
from game.training.task.inputs import InputsMismatch


def config(task_or_path: str | Path | TaskConfig, **overrides: Any) -> TaskConfig:
    """A task config from a TOML file (a path ending in ``.toml``), a task's name (a preset,
    ``module:attribute`` or an entry point) or a config, with ``overrides`` (``steps=``,
    ``lr=``, ``model={"width": 64}``, ...)."""
    if isinstance(task_or_path, TaskConfig):
        cfg = task_or_path
    elif str(task_or_path).endswith(".toml"):
        cfg = load_config(task_or_path)
    else:
        cfg = TaskConfig.for_task(str(task_or_path))
    return cfg.replace(**overrides) if overrides else cfg


def fit(
    task_or_path: str | Path | TaskConfig,
    out: str | Path,
    *,
    profile: str = "cpu-1t",
    workers: int = 1,
    **overrides: Any,
) -> TrainResult:
    """Train the task as the trainer, writing its transcript to ``out`` (resumed if partial);
    ``workers`` > 1: that many local processes share each step's micro-batches (torchrun), and
    the transcript is the one of one process."""
    cfg = config(task_or_path, **overrides)
    if workers == 1:
        return _train(cfg, profile, out)
    from game.training.parallel.launch import launch

    toml = not isinstance(task_or_path, TaskConfig) and str(task_or_path).endswith(".toml")
    search = (Path(str(task_or_path)).parent,) if toml else ()
    return launch(cfg, profile, out, workers, search=search).result


def audit(transcript: str | Path, profile: str, *, use_log: bool = True) -> AuditResult:
    """Replay a transcript as the auditor on ``profile``; ``.match`` says whether it reproduced."""
    return _audit(Path(transcript), profile, use_log=use_log)


def replay_step(transcript: str | Path, step: int, profile: str) -> ReplayResult:
    """Re-run one step of a transcript as the judge does, from the state before it and its log:
    ``.state_hash`` is what the judge would post (for a chunk it rules against, the rejected-log
    hash, with ``.rejected`` saying why)."""
    return judged_step(transcript, step, profile)


__all__ = [
    "AuditResult",
    "InputsMismatch",
    "ReplayResult",
    "Task",
    "TaskConfig",
    "TaskFactory",
    "TensorData",
    "TokenWindows",
    "TrainResult",
    "audit",
    "config",
    "fit",
    "load_arrays",
    "load_config",
    "replay_step",
    "task",
]
