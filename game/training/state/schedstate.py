"""The state of a scheduler stepped with the step's loss (``ReduceLROnPlateau``), committed with the rest.

Why: a schedule of the step alone (``StepLR``, ``OneCycleLR``, ``LambdaLR``) stands at step ``k``
wherever a fresh one stepped ``k`` times stands, so a judge or an auditor starting from a
checkpoint rebuilds it and nothing of it is committed. A scheduler whose ``step`` takes a metric
depends on every loss before step ``k``, which no one re-running step ``k`` alone has: its best
loss, its count of bad steps, its cooldown and the learning rates it has cut to. So where the task
has one, they are part of the state a leaf commits to, as the optimizer's moments are. The engine
steps it once a step with the step's loss (:func:`step_loss`: the mean of the losses of the
micro-batches the update applies, each a value on the grid, the same on every machine; an
asynchronous update's are those it applies, computed on the states they were computed on), after
the update, on every path: one process, data-parallel rank 0, a parameter server.

Bytes: one ``sched/<key>`` tensor of numbers (:mod:`.numbers`) for every entry of the scheduler's
``state_dict()`` that is a number or a list of numbers, and ``sched/param_groups.lr`` for the param
groups' learning rates. Entries of any other kind (``mode``, a string) are the construction's. Only the ``lr`` of the param groups is committed:
a scheduler stepped with the loss that writes another entry is refused after its first step
(:func:`check_writes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from game.errors import CheckpointError, ConfigError
from game.training.state import numbers
from game.training.task.optimizers import required_arguments

PREFIX = "sched/"
#: The committed tensor of the param groups' learning rates.
LR = PREFIX + "param_groups.lr"
#: The param-group entries a scheduler stepped with the loss may write (those committed).
WRITABLE = frozenset({"lr"})


def takes_metric(scheduler: Any) -> bool:
    """Whether ``scheduler``'s ``step`` takes one argument (a metric: the engine gives it the step's
    loss), so that its state is committed."""
    step = getattr(type(scheduler), "step", None) if scheduler is not None else None
    return callable(step) and len(required_arguments(step)) == 1


def step_loss(losses: Sequence[float | Tensor]) -> float:
    """The step's loss: the mean of its micro-batches' losses, in micro-batch order (what a
    scheduler stepped with the loss is given; the same sum on one process and on many)."""
    return sum(float(v) for v in losses) / len(losses)


def _entries(scheduler: Any, optimizer: torch.optim.Optimizer) -> dict[str, numbers.Rows]:
    out: dict[str, numbers.Rows] = {}
    for key, value in scheduler.state_dict().items():
        rows = numbers.rows(value)
        if rows is not None:
            out[PREFIX + key] = rows
    lrs = numbers.rows([g["lr"] for g in optimizer.param_groups])
    if lrs is None:
        raise ConfigError(
            "Task.scheduler: a scheduler stepped with the loss needs every param group's lr a number"
        )
    out[LR] = lrs
    return out


def scheduler_tensors(
    scheduler: Any, optimizer: torch.optim.Optimizer, kept: dict[str, Tensor]
) -> dict[str, Tensor]:
    """The ``sched/...`` tensors of a state's ``scheduler`` over ``optimizer`` (none without a
    scheduler stepped with the loss), as it stands now, kept in ``kept`` (:func:`.numbers.kept`)."""
    if not takes_metric(scheduler):
        return {}
    return {name: numbers.kept(kept, name, rows) for name, rows in _entries(scheduler, optimizer).items()}


def load(scheduler: Any, optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor]) -> None:
    """Put the committed ``sched/...`` tensors into a fresh state's scheduler and param groups;
    CheckpointError where they do not fit the task's scheduler."""
    expected = set(_entries(scheduler, optimizer)) if takes_metric(scheduler) else set()
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise CheckpointError(
            f"state bytes do not fit the task's scheduler: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    if not expected:
        return
    decoded = {n: numbers.values(t) for n, t in tensors.items()}
    sd = scheduler.state_dict()
    for key, was in sd.items():
        values = decoded.get(PREFIX + key)
        if values is not None:
            sd[key] = type(was)(values) if isinstance(was, (list, tuple)) else values[0]
    scheduler.load_state_dict(sd)
    groups = optimizer.param_groups
    if len(decoded[LR]) != len(groups):
        raise CheckpointError(
            f"{LR}: {len(decoded[LR])} learning rates, the optimizer has {len(groups)} groups"
        )
    for group, lr in zip(groups, decoded[LR], strict=True):
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def check_writes(scheduler: Any, written: set[str]) -> None:
    """Refuse a scheduler stepped with the loss that wrote a param-group entry other than ``lr``
    (``written``): that entry is not committed, so a judge would run the next step without it."""
    extra = sorted(written - WRITABLE)
    if extra:
        raise ConfigError(
            f"Task.scheduler: {type(scheduler).__name__}, stepped with the loss, wrote the param groups' "
            f"{', '.join(extra)}: only their lr is committed with its state (use a schedule of the step)"
        )


__all__ = ["LR", "PREFIX", "check_writes", "load", "scheduler_tensors", "step_loss", "takes_metric"]
