"""The training state in memory: :class:`TrainState`, its tensors by canonical name, and what is done
to them in place (the grid check, moving them to a device, a snapshot to go back to).

State = parameters + persistent buffers (BatchNorm running stats) + optimizer state + the state of a
scheduler stepped with the loss (:mod:`.schedstate`) + the step number (docs/architecture.md,
"Training state and leaves"). Floating tensors are float64 in memory and lie
on the ``bits`` grid after every step. How they are written (:mod:`.canonical`) and read back
(:mod:`.checkpoint`) lives beside this module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from game.errors import TrainingError
from game.training.numerics import rounding
from game.training.state import optstate, schedstate

Precision = Literal["fp64", "fp32"]


class OffGridError(TrainingError, ValueError):
    """A float64 state tensor is not on the rounding grid, so it has no canonical bytes."""


@dataclass
class TrainState:
    """The whole training state; ``step`` is the number of steps run (0 = initialisation)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: int
    #: the task's LR scheduler, stepped after each update (not state: a function of ``step``, but
    #: for one stepped with the loss, whose state is committed: :mod:`.schedstate`)
    scheduler: Any = field(default=None, compare=False)
    #: The keys of the optimizer's param groups the scheduler has written (its ``lr``; a cyclic
    #: one's ``momentum`` or ``betas``): a judge's scheduler, fast-forwarded, writes them again, so
    #: a change there is not state the optimizer carries (:func:`step_scheduler`).
    scheduled: set[str] = field(default_factory=set, repr=False, compare=False)
    #: What :func:`~game.training.state.canonical.state_buffer` worked out from the tensors last time
    #: (its ``_BufferPlan``, checked before each use; only that module reads or sets it).
    buffer_plan: object | None = field(default=None, init=False, repr=False, compare=False)
    #: The committed tensors of the Python numbers in the state (an optimizer's step count, a
    #: scheduler's best loss) by canonical name, written in place (:func:`.numbers.kept`).
    numbers: dict[str, Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)

    def parameters(self) -> dict[str, Tensor]:
        """Parameters by model name (for distances between two parties' weights)."""
        return {name: p for name, p in self.model.named_parameters()}

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return next(self.model.parameters()).device


def step_scheduler(state: TrainState, loss: float | None = None) -> None:
    """Step ``state``'s scheduler (if any) once, noting the param-group keys it wrote in
    :attr:`TrainState.scheduled`: an entry set anew (an lr of equal value set again is written) or
    a tensor filled in place. The objects held before are kept while it steps, so that no new one
    takes an old one's ``id``. A scheduler stepped with a metric is given ``loss``, the step's
    (:func:`.schedstate.step_loss`), which every path that steps one hands on."""
    if state.scheduler is None:
        return
    groups = state.optimizer.param_groups
    before = [{k: (v, _version(v)) for k, v in g.items() if k != "params"} for g in groups]
    metric = schedstate.takes_metric(state.scheduler)
    if metric and loss is None:
        raise TrainingError(f"step {state.step + 1}: {type(state.scheduler).__name__} needs the step's loss")
    if metric:
        state.scheduler.step(loss)
    else:
        state.scheduler.step()
    for was, group in zip(before, groups, strict=False):
        for k, v in group.items():
            old = was.get(k)
            if k != "params" and (old is None or old[0] is not v or old[1] != _version(v)):
                state.scheduled.add(k)
    if metric:
        schedstate.check_writes(state.scheduler, state.scheduled)


def _version(v: Any) -> int:
    return v._version if isinstance(v, Tensor) else 0


# --------------------------------------------------------------------------------------------------
# Tensors by canonical name
# --------------------------------------------------------------------------------------------------


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def persistent_buffers(model: nn.Module) -> dict[str, Tensor]:
    """Buffers that are part of ``state_dict`` (non-persistent ones are constants, not state), in
    ``named_buffers`` order, read from each module's own table (building ``state_dict`` costs a
    walk of every module and a dict per module, on every state hash)."""
    out: dict[str, Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):  # as state_dict walks
        skip = module._non_persistent_buffers_set
        for name, t in module._buffers.items():
            if t is not None and name not in skip:
                out[f"{prefix}.{name}" if prefix else name] = t
    return out


def optimizer_state_tensors(state: TrainState) -> dict[str, Tensor]:
    """``optim/<param name>/<key>`` for every entry of the optimizer's per-parameter state: a
    tensor, a Python number, a list of tensors (:mod:`.optstate`)."""
    return _optimizer_tensors(state, _param_names(state.model))


def _optimizer_tensors(state: TrainState, names: dict[int, str]) -> dict[str, Tensor]:
    """:func:`optimizer_state_tensors` with the parameters' names (by ``id``) already known."""
    out: dict[str, Tensor] = {}
    owner = type(state.optimizer).__name__
    for p, entries in state.optimizer.state.items():
        pname = names.get(id(p))
        if pname is None:
            raise TrainingError("optimizer holds state for a tensor that is not a model parameter")
        out.update(optstate.encode(owner, pname, entries, state.numbers))
    return out


def _module_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``named_parameters()`` and :func:`persistent_buffers` in one walk of the modules, with no
    generator a level and no Python ``Tensor.__hash__`` a parameter (``named_parameters`` spends
    85 us a gpt-shakespeare step on those). The walk is ``named_modules(remove_duplicate=False)``'s:
    depth first, children in order, a shared module under each of its names (its buffers so, as
    ``state_dict`` has them); a parameter is named where first met, as ``named_parameters`` does
    (it skips a module met before, whose parameters were all met with it)."""
    params: dict[str, Tensor] = {}
    buffers: dict[str, Tensor] = {}
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        dot = f"{prefix}." if prefix else ""
        for name, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params[dot + name] = p
        skip = module._non_persistent_buffers_set
        for name, b in module._buffers.items():
            if b is not None and name not in skip:
                buffers[dot + name] = b
        stack.extend(reversed([(dot + name, m) for name, m in module._modules.items() if m is not None]))
    return params, buffers


def state_tensors(state: TrainState) -> dict[str, Tensor]:
    """Every tensor of the state by canonical name, sorted."""
    out: dict[str, Tensor] = {}
    names: dict[int, str] = {}
    params, buffers = _module_tensors(state.model)
    for name, p in params.items():
        out[f"param/{name}"] = p
        names[id(p)] = name
    for name, b in buffers.items():
        out[f"buffer/{name}"] = b
    out.update(_optimizer_tensors(state, names))
    out.update(schedstate.scheduler_tensors(state.scheduler, state.optimizer, state.numbers))
    return dict(sorted(out.items()))


def float_state_tensors(state: TrainState) -> dict[str, Tensor]:
    """The float64 tensors of the state (those that must lie on the grid)."""
    return {n: t for n, t in state_tensors(state).items() if t.dtype == torch.float64}


def check_on_grid(state: TrainState, bits: int) -> None:
    """Raise OffGridError naming the first float64 state tensor that is not on the ``bits`` grid."""
    for name, t in float_state_tensors(state).items():
        if not rounding.is_on_grid(t.detach(), bits):
            raise OffGridError(f"state tensor {name} (step {state.step}) is not on the {bits}-bit grid")


def move_state(state: TrainState, device: str | torch.device) -> None:
    """Move model and optimizer state to ``device`` in place (0-dim float32 step counters stay put;
    the tensors of a list there, L-BFGS's curvature pairs, go too)."""
    dev = torch.device(device)
    state.model.to(dev)

    def moved(value: Any) -> Any:
        if isinstance(value, Tensor) and not (value.dim() == 0 and value.dtype == torch.float32):
            return value.to(dev)
        if isinstance(value, list):
            return [moved(v) for v in value]
        return value

    for entries in state.optimizer.state.values():
        for key, value in entries.items():
            entries[key] = moved(value)


def copies(tensors: list[Tensor]) -> list[Tensor]:
    """Copies of ``tensors`` where they live, made by one foreach copy per device and dtype rather
    than a clone each: on a GPU a clone is a launch and some microseconds of host work, and a state
    is hundreds of tensors (the parameters, the optimizer's moments)."""
    out, groups = _empty_copies(tensors)
    _copy_into(groups, tensors)
    return out


#: A foreach copy's destinations, and the positions of its sources among the tensors copied.
_Group = tuple[list[Tensor], list[int]]


def _empty_copies(tensors: list[Tensor]) -> tuple[list[Tensor], list[_Group]]:
    """Uninitialised tensors like ``tensors``, and their groups by device and dtype."""
    out = [torch.empty_like(t) for t in tensors]
    groups: dict[tuple[torch.device, torch.dtype], _Group] = {}
    for i, (dst, src) in enumerate(zip(out, tensors, strict=True)):
        group = groups.setdefault((src.device, src.dtype), ([], []))
        group[0].append(dst)
        group[1].append(i)
    return out, list(groups.values())


def _copy_into(groups: list[_Group], tensors: list[Tensor]) -> None:
    """``tensors`` into their groups' destinations, one foreach copy a group."""
    with torch.no_grad():
        for dsts, at in groups:
            torch._foreach_copy_(dsts, [tensors[i] for i in at])


class StateCopies:
    """The copies a deferring engine takes of its state before each step (:func:`snapshot`), kept
    from one step to the next and written again in place while the state's tensors keep their
    shapes, dtypes and devices: a step then allocates none.

    Why: a state is hundreds of tensors (a GPT-2-small one some 600 with Adam's moments and
    counters), and a fresh copy of each is an allocation and some microseconds of the step's host
    work, on a GPU through the caching allocator (issue 46). A restore hands the copies to the
    optimizer as its state; the next snapshot then makes new ones (:meth:`handed_over`).
    """

    def __init__(self) -> None:
        self._copies: list[Tensor] = []
        self._groups: list[_Group] = []

    def of(self, tensors: list[Tensor]) -> list[Tensor]:
        """Copies of ``tensors``, as :func:`copies` makes them, in the last call's tensors where
        each still fits its source."""
        if not self._fit(tensors):
            self._copies, self._groups = _empty_copies(tensors)
        _copy_into(self._groups, tensors)
        return self._copies

    def _fit(self, tensors: list[Tensor]) -> bool:
        """Whether the kept copies match ``tensors`` one for one: shape, dtype and device."""
        return len(tensors) == len(self._copies) and all(
            c.shape == t.shape and c.dtype == t.dtype and c.get_device() == t.get_device()
            for c, t in zip(self._copies, tensors, strict=True)
        )

    def handed_over(self) -> None:
        """The copies now belong to the state (a restore put them there): keep none."""
        self._copies, self._groups = [], []


def snapshot(state: TrainState, kept: StateCopies | None = None) -> Callable[[], None]:
    """Copy the state's tensors where they live; the returned function puts the copy back.

    For a step that must run again from where it started (a CUDA step whose deferred checks failed,
    :class:`game.training.engine.step.StepEngine`): parameters and buffers are written back in place (the
    model keeps its tensors), the optimizer's state is replaced (a first step creates it).
    ``kept``: where the copies of the step before are written again (:class:`StateCopies`); the
    returned function must then run, if at all, before its next snapshot.
    """
    live = [*state.model.parameters(), *state.model.buffers()]
    optimizer = state.optimizer
    entries = [(p, k, v) for p, s in optimizer.state.items() for k, v in s.items()]
    tensors = live + [v for _, _, v in entries if isinstance(v, Tensor)]
    saved = kept.of(tensors) if kept is not None else copies(tensors)
    moments = iter(saved[len(live) :])
    state_then: dict[Any, dict[str, Any]] = {p: {} for p in optimizer.state}
    for p, k, v in entries:
        state_then[p][k] = next(moments) if isinstance(v, Tensor) else copy.deepcopy(v)
    saved = saved[: len(live)]

    def restore() -> None:
        with torch.no_grad():
            for t, s in zip(live, saved, strict=True):
                t.copy_(s)
        optimizer.state.clear()
        optimizer.state.update(state_then)
        if kept is not None:
            kept.handed_over()

    return restore


class StepBuffers:
    """The model's buffers (BatchNorm's running statistics, every other buffer) as a step started,
    to put back before each micro-batch's forward: each micro-batch then starts from the step's
    buffers, whichever worker runs it, and the step ends with those the last one left
    (docs/architecture.md, "Tasks and their spec"). Data movement only: a copy each way."""

    def __init__(self, model: nn.Module) -> None:
        self.live = list(model.buffers())
        self.saved = copies(self.live)

    def restore(self) -> None:
        """Write the step's values back into the model's own buffers (the model keeps its tensors),
        through ``.data``: their in-place versions stay the model's own writes, which the
        carried-state watch reads (engine/carried.py), not this bookkeeping."""
        with torch.no_grad():
            for t, s in zip(self.live, self.saved, strict=True):
                t.data.copy_(s)


__all__ = [
    "OffGridError",
    "Precision",
    "StateCopies",
    "StepBuffers",
    "TrainState",
    "check_on_grid",
    "copies",
    "float_state_tensors",
    "move_state",
    "optimizer_state_tensors",
    "persistent_buffers",
    "snapshot",
    "state_tensors",
    "step_scheduler",
]
