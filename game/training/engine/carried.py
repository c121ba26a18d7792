"""What a task's model, optimizer or loss carries from one step to the next outside the committed state.

Why: a step is committed as the state before it (parameters, persistent buffers, the optimizer's and
the scheduler's state) and its log chunk. A judge, or an auditor that starts from a checkpoint,
re-runs step ``k`` in a model and an optimizer built afresh with that state loaded. A model that
keeps a Python value across steps (``self.calls += 1`` in its forward, a KL weight annealed by a
counter in the loss's closure, a cache tensor made in the first forward and kept as a plain
attribute), or an optimizer of the task's own that does (Lookahead's slow weights and its count
of steps kept as attributes, not in ``self.state``), computes step ``k``
with it on the trainer and without it on the judge: an audit run from step 1 in one process agrees,
but a dispute over any later step is ruled against the honest trainer, and a dishonest auditor could
open one on purpose. So the engine compares what a step starts with to what the model's first step
started with (:class:`Watch`): a function's data that changed is refused at once (a model built
afresh in this process would share it); a module's attribute that changed may not reach the step's
work (a value kept for a plot), so the trainer runs that step again in a model built afresh, as a
judge would, and is stopped only where that gives another leaf. It learns it at step 2, before it
commits the run's roots. A value shown harmless so is judged again: a plain number (a counter) at
every step where it changed, since it may switch a branch on after a warm-up or every k steps;
anything else at each power of two and at the last step.

What is compared (:func:`carried`): the own attributes of every module of the task's own classes
(torch's bookkeeping aside: hooks, submodules, the ``training`` flag, which the engine sets each
step); those of the optimizer when its class is the task's own (torch's bookkeeping aside:
``state``, which a step commits, ``defaults``, hooks), and of an optimizer of the task's own that
it holds (a wrapper's); the entries of every optimizer's param groups (an adaptive optimizer's
estimate kept there, Prodigy's ``d``), but those the scheduler writes, since a judge's scheduler
is fast-forwarded to the step (``TrainState.scheduled``); and the data a task's functions hold:
their closures, the object a bound method is of, a partial's arguments, and the globals of their
modules. Plain values are compared by value,
containers of them to two levels, tensors and arrays by shape, dtype and (a tensor's) in-place
version (one of the model's parameters or buffers held again, as an RNN's ``_flat_weights``, by
shape and dtype: the engine writes those in place); any other object by its type alone (not walked:
a model's config object is its construction's). The modules of libraries (torch's, vgame's, those
the task declares, whose versions the spec binds) are trusted to keep nothing a step needs from the
one before: they set flags a fresh model sets again on its first call (transformers marks hooks it
installs), which is no difference to a judge. Persistent buffers are the state. A non-persistent
buffer (every module's, libraries' too) is outside it, so it is compared as an attribute is: by the
tensor it is and that tensor's in-place version, which a running mean kept in one (``ema.mul_(0.9)``)
or a new tensor put in its place (``self.ema = ...``) moves, with no read of its values (no host sync
on a GPU); a rewrite that leaves it as it was shows the same leaf when run afresh, and is let be.
"""

from __future__ import annotations

import functools
import logging
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from game.errors import CarriedStateError, TrainingError
from game.training.engine.carriedfix import ABSENT, NON_PERSISTENT, OPTIMIZER, in_model, refusal
from game.training.state import schedstate
from game.training.state.canonical import encode_state

if TYPE_CHECKING:
    from game.training.engine.runtime import TaskRuntime
    from game.training.state.tensors import TrainState

log = logging.getLogger(__name__)

#: torch's own bookkeeping in a module's ``__dict__``: hooks, parameter and submodule tables, the
#: ``training`` flag (set by the engine before every step).
_TORCH_OWN = frozenset(vars(nn.Module()))
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_DEPTH = 2  # container levels walked
_WIDTH = 64  # items a container may have to be walked
_GROUPS = "optimizer.param_groups"  # the prefix of a param group's entry's key
#: The key a step is judged under for a scheduler of the task's own class (Watch._own_schedule).
SCHEDULE = "(the scheduler's learning rates)"


def _scheduled(keys: set[str], scheduled: set[str]) -> frozenset[str]:
    """The param-group entries among ``keys`` whose name the scheduler writes (``scheduled``)."""
    return frozenset(k for k in keys if k.startswith(_GROUPS) and k.rpartition(".")[2] in scheduled)


@functools.cache
def _optimizer_own() -> frozenset[str]:
    """torch's own attributes of an optimizer (its state, groups, defaults, hooks and what a
    scheduler marks on it), as a plain SGD under a scheduler has them after a step: the rest of an
    optimizer's ``__dict__`` is its class's."""
    p = torch.zeros(1, requires_grad=True)
    sgd = torch.optim.SGD([p], lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0)
    p.grad = torch.ones(1)
    sgd.step()
    schedule.step()
    return frozenset(vars(sgd)) | {"state", "param_groups", "defaults"}


def _value(v: Any, owned: frozenset[int] = frozenset(), depth: int = 0) -> Any:
    """A comparable stand-in for ``v``; a tensor of ``owned`` (the ids of the model's parameters
    and buffers, held again in a list such as an RNN's ``_flat_weights``) stands for itself: those
    are the state, or compared as buffers."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, Tensor):
        if id(v) in owned:
            return ("the model's", tuple(v.shape), str(v.dtype))
        return ("tensor", tuple(v.shape), str(v.dtype), v._version)
    if isinstance(v, np.ndarray):
        return ("array", v.shape, str(v.dtype))
    if depth < _DEPTH and isinstance(v, list | tuple | set | frozenset | dict) and len(v) <= _WIDTH:
        if isinstance(v, dict):
            return ("dict", tuple((repr(k), _value(x, owned, depth + 1)) for k, x in v.items()))
        items = (
            sorted(map(repr, v))
            if isinstance(v, set | frozenset)
            else [_value(x, owned, depth + 1) for x in v]
        )
        return (type(v).__name__, tuple(items))
    return ("object", type(v).__qualname__)


class _Buffer(NamedTuple):
    """A non-persistent buffer as compared: which tensor object it is and its in-place version."""

    shape: tuple[int, ...]
    dtype: str
    tensor: int  # id() of the tensor object
    version: int

    @classmethod
    def of(cls, b: Tensor) -> _Buffer:
        return cls(tuple(b.shape), str(b.dtype).removeprefix("torch."), id(b), b._version)

    def __repr__(self) -> str:
        return f"tensor{list(self.shape)} {self.dtype} @{self.tensor:x} version {self.version}"


def _data(namespace: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """A namespace's data: not its modules, functions, classes or dunder names (Python's own, such
    as a module's ``__warningregistry__``, which the first warning of a step fills)."""
    for name, v in namespace.items():
        if name.startswith("__") or isinstance(v, types.ModuleType | types.FunctionType | type):
            continue
        if isinstance(v, types.BuiltinFunctionType | functools.partial | nn.Module):
            continue
        yield name, v


def _function(f: Callable[..., Any], where: str) -> Iterator[tuple[str, Any]]:
    """The data a task's function holds (its closure, its object, a partial's arguments) and its
    module's globals."""
    if isinstance(f, functools.partial):
        yield from ((f"{where}.args[{i}]", a) for i, a in enumerate(f.args))
        yield from ((f"{where}.{k}", a) for k, a in f.keywords.items())
        yield from _function(f.func, where)
        return
    owner = getattr(f, "__self__", None)
    if (
        owner is not None
        and not isinstance(owner, nn.Module | types.ModuleType)
        and hasattr(owner, "__dict__")
    ):
        yield from ((f"{where}.{k}", v) for k, v in _data(vars(owner)))
    code = getattr(f, "__code__", None)
    cells = getattr(f, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            try:
                v = cell.cell_contents
            except ValueError:  # not yet bound
                continue
            if not isinstance(v, types.ModuleType | types.FunctionType | type | nn.Module):
                yield f"{where} (its closure's {name})", v
    module = getattr(f, "__module__", None) or "?"
    namespace = getattr(f, "__globals__", None)
    if isinstance(namespace, dict):
        yield from ((f"{module}.{k}", v) for k, v in _data(namespace))


def _library(obj: Any, libraries: frozenset[str]) -> bool:
    """Whether ``obj``'s class comes from one of ``libraries`` (top-level import names)."""
    return type(obj).__module__.partition(".")[0] in libraries


def _holds_own_code(scheduler: Any, libraries: frozenset[str]) -> bool:
    """Whether a library's ``scheduler`` (or one it chains) holds a function of the task's own
    code, whose rates a judge's fast-forward may not give again (:meth:`Watch.check_rates`)."""
    for v in vars(scheduler).values():
        for x in v if isinstance(v, list | tuple) else (v,):
            if hasattr(x, "step") and hasattr(x, "optimizer") and _holds_own_code(x, libraries):
                return True  # SequentialLR's and ChainedScheduler's schedulers
            fn = getattr(x, "func", x)  # a partial's function
            if isinstance(fn, types.FunctionType | types.MethodType):
                where = getattr(fn, "__module__", None)
            elif callable(fn) and not isinstance(fn, type | types.BuiltinFunctionType | weakref.ref):
                where = type(fn).__module__  # a callable object (a warm-up schedule of one's own class)
            else:
                continue
            if str(where or "").partition(".")[0] not in libraries:
                return True
    return False


def _optimizer(
    optimizer: torch.optim.Optimizer,
    at: str,
    owned: frozenset[int],
    libraries: frozenset[str],
    found: dict[str, Any],
) -> None:
    """An optimizer's own attributes into ``found`` under ``at``, where its class is not a
    library's; an optimizer of the task's own it holds (a wrapper's inner one), the same way."""
    if _library(optimizer, libraries):
        return
    own = _optimizer_own()
    for name, v in vars(optimizer).items():
        if name in own:
            continue
        if isinstance(v, torch.optim.Optimizer):
            _optimizer(v, f"{at}{name}.", owned, libraries, found)
        found[at + name] = _value(v, owned)


def carried(
    model: nn.Module,
    functions: dict[str, Callable[..., Any] | None],
    libraries: frozenset[str] = frozenset(),
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """What ``model``, ``optimizer`` and the task's ``functions`` (by role: ``loss``, ``collate``)
    hold that a step could leave for the next, by where it lives (the module docstring). A module
    or an optimizer of a class from ``libraries`` (top-level import names: torch's, vgame's, those
    the task declares) is not walked itself, only a module's children."""
    found: dict[str, Any] = {}
    committed = [] if optimizer is None else [v for s in optimizer.state.values() for v in s.values()]
    modules = list(model.named_modules())  # one walk (parameters() and buffers() walk it again each)
    owned = frozenset(
        [id(t) for _, m in modules for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
        + [id(t) for t in committed]
    )
    for prefix, module in modules:
        for name in module._non_persistent_buffers_set:
            b = module._buffers.get(name)
            where = f"model.{prefix}.{name}" if prefix else f"model.{name}"
            found[where + NON_PERSISTENT] = None if b is None else _Buffer.of(b)
        if _library(module, libraries):
            continue
        at = f"model.{prefix}." if prefix else "model."
        for name, v in vars(module).items():
            if name not in _TORCH_OWN and not isinstance(v, nn.Module):
                found[at + name] = _value(v, owned)
    if optimizer is not None:
        _optimizer(optimizer, OPTIMIZER, owned, libraries, found)
        for i, group in enumerate(optimizer.param_groups):
            for name, v in group.items():
                if name != "params":
                    found[f"{_GROUPS}[{i}].{name}"] = _value(v, owned)
    for role, f in functions.items():
        if f is not None:
            for where, v in _function(f, role):
                found.setdefault(where, _value(v, owned))
    return found


def changed(first: dict[str, Any], now: dict[str, Any], ignored: frozenset[str] = frozenset()) -> list[str]:
    """Where ``now`` differs from ``first`` (a value changed, came or went), ``ignored`` aside."""
    if now == first:
        return []
    keys = (now.keys() | first.keys()) - ignored
    return sorted(k for k in keys if now.get(k, ABSENT) != first.get(k, ABSENT))


_AFRESH = ": in a model and an optimizer built afresh from the state before it, as a judge's are,"


@dataclass
class _First:
    """What a model carried at its first step on an engine."""

    model: weakref.ref[nn.Module]
    step: int
    values: dict[str, Any]
    ignored: frozenset[str] = frozenset()  # shown not to reach a step's work (run afresh)
    numbers: dict[str, Any] = field(default_factory=dict)  # plain values so shown, as last judged


class Watch:
    """One step engine's watch over what its task's model and functions carry from step to step."""

    def __init__(self, runtime: TaskRuntime) -> None:
        self.runtime = runtime
        self._first: _First | None = None
        self._pending: tuple[list[str], dict[str, Any]] = ([], {})  # changed keys, their values
        self._scheduler = ""  # the class of the scheduler judged (SCHEDULE)

    def before(self, state: TrainState, step: int) -> bytes | None:
        """:meth:`look` at ``state``'s model before a recorded step ``step``; where something is to
        be judged, the state's bytes before the step, for :meth:`judge` (by way of a re-run
        afresh) once the step has run."""
        looked = self.look(state.model, step, state.optimizer, state.scheduled, state.scheduler)
        self.check_rates(state, step)
        return encode_state(state) if looked else None

    def look(
        self,
        model: nn.Module,
        step: int,
        optimizer: torch.optim.Optimizer | None = None,
        scheduled: set[str] | frozenset[str] = frozenset(),
        scheduler: Any = None,
    ) -> bool:
        """What ``model`` holds as recorded step ``step`` starts against what it held at its first
        step here. A function's data that changed is refused at once (a model built afresh in this
        process would share it). A module's attribute that changed is to be judged: True, and
        :meth:`judge` is to be called once the step has run. Only a recording is watched: an audit
        or a judge's replay computes as the trainer did, whatever the model carries."""
        task = self.runtime.task
        now = carried(model, {"loss": task.loss, "collate": task.collate}, self.runtime.libraries, optimizer)
        first = self._first
        if first is None or first.model() is not model:
            self._first = _First(weakref.ref(model), step, now)
            return False
        ignored = _scheduled(first.values.keys() | now.keys(), set(scheduled))
        keys = changed(first.values, now, ignored | (frozenset() if self._rejudges(step) else first.ignored))
        keys += sorted(k for k, v in first.numbers.items() if k not in keys and now.get(k, ABSENT) != v)
        if not keys and self._own_schedule(scheduler) and self._rejudges(step):
            keys = [SCHEDULE]  # whether a fresh scheduler stepped to here gives its learning rates
            self._scheduler = type(scheduler).__name__
        if not keys:
            return False
        outside = [k for k in keys if not in_model(k) and k != SCHEDULE]
        if outside:
            raise refusal(first.values, now, outside, first.step, step)
        self._pending = (keys, now)
        return True

    def _schedule_refusal(self, step: int, what: str) -> CarriedStateError:
        return CarriedStateError(
            f"step {step}: the task's scheduler, {self._scheduler}, is not a schedule of the step alone: "
            f"in a model, an optimizer and a scheduler built afresh, the scheduler stepped to the step as "
            f"a judge's is, {what}. A judge re-running a step from its committed state, or an auditor "
            "starting from a checkpoint, steps a fresh scheduler so, and would rule an honest step wrong: "
            "compute the learning rate from the count of steps alone (self.last_epoch, or the step "
            "number a LambdaLR's function is given), or take the loss "
            "in its step (step(self, metrics), as ReduceLROnPlateau does: its state is then committed)"
        )

    def _own_schedule(self, scheduler: Any) -> bool:
        """Whether ``scheduler`` is of the task's own class and a schedule of the step (a judge
        fast-forwards it): its learning rates are then judged at the steps :meth:`_rejudges` names,
        a step run afresh there as a judge runs it. A schedule that reads more than its count of
        steps (the parameters' norms, a loss kept aside) gives another rate there."""
        return (
            scheduler is not None
            and not _library(scheduler, self.runtime.libraries)
            and not schedstate.takes_metric(scheduler)
        )

    def check_rates(self, state: TrainState, step: int) -> None:
        """Before recorded step ``step``, at the steps :meth:`_rejudges` names: where torch's
        scheduler holds a function of the task's own (``LambdaLR``'s and ``MultiplicativeLR``'s
        lambdas, ``CyclicLR``'s ``scale_fn``), the rates a judge's fresh scheduler gives, fast-
        forwarded on the state decoded from this one's bytes, against this run's.

        Why: torch's schedule is a function of the step only if that function is; one that keeps
        a history (``MultiplicativeLR`` by the parameters' norm, a lambda averaging what it saw)
        trained and audited from step 1, and a judge starting from a checkpoint ruled every later
        step against the honest trainer. Only the optimizer's rates are compared (no step runs
        again): the decode costs a model's construction, log2(steps) + 1 times a run."""
        scheduler = state.scheduler
        if (
            step < 2
            or not self._rejudges(step)
            or scheduler is None
            or self._own_schedule(scheduler)  # of the task's own class: the whole step is judged
            or not _holds_own_code(scheduler, self.runtime.libraries)
        ):
            return
        from game.training.engine.states import decode_state  # states builds on the runtime, as this does

        fresh = decode_state(encode_state(state), self.runtime.cfg)
        for i, (mine, theirs) in enumerate(
            zip(state.optimizer.param_groups, fresh.optimizer.param_groups, strict=True)
        ):
            for key in sorted(state.scheduled):
                if mine.get(key) != theirs.get(key):
                    self._scheduler = type(scheduler).__name__
                    raise self._schedule_refusal(
                        step,
                        f"gives param group {i}'s {key} as {theirs.get(key)!r} where this run's is {mine.get(key)!r}",
                    )

    def _rejudges(self, step: int) -> bool:
        """Whether attributes shown harmless before are judged again at ``step``: at each power of
        two and at the run's last step. A value may reach a step's work only later (a tensor kept
        that a later branch reads): judged again so, a switch that stays on is found by the last
        step at the latest, for log2(steps) + 1 steps run twice. A plain number (a counter, which
        may switch a branch on after a warm-up or every k steps) is judged at every step where it
        changed again (:attr:`_First.numbers`), with a warning that this costs a step each."""
        return step & (step - 1) == 0 or step == self.runtime.cfg.steps

    def judge(self, step: int, leaf: bytes, afresh: Callable[[], bytes]) -> None:
        """The step's ``leaf`` against ``afresh()``, its leaf as a judge computes it in a model
        built afresh: another leaf (or a log that does not fit there) means the changed
        attributes reach the step's work, and the step is refused naming them; the same leaf
        means they do not, and they are judged again only at the steps :meth:`_rejudges` names."""
        first, (keys, now) = self._first, self._pending
        assert first is not None
        try:
            again = afresh()
        except TrainingError as exc:
            if keys == [SCHEDULE]:
                raise self._schedule_refusal(step, f"the step does not fit its own log ({exc})") from exc
            why = f"{_AFRESH} the step does not fit its own log ({exc})"
            raise refusal(first.values, now, keys, first.step, step, why) from exc
        if again != leaf:
            if keys == [SCHEDULE]:
                raise self._schedule_refusal(step, "the step computes another state")
            raise refusal(
                first.values, now, keys, first.step, step, f"{_AFRESH} the step computes another state"
            )
        first.ignored |= frozenset(keys) - {SCHEDULE}
        numbers = {k: now[k] for k in keys if k in now and isinstance(now[k], _PLAIN)}
        fresh = sorted(numbers.keys() - first.numbers.keys())
        if fresh:
            log.warning(
                "step %d: %s change%s from step to step outside the state a step commits; each step "
                "where %s again is run a second time, afresh, to show %s not reach the step's work: "
                "keep such a value in a persistent buffer to save that time",
                step,
                ", ".join(fresh),
                "s" if len(fresh) == 1 else "",
                "it changes" if len(fresh) == 1 else "they change",
                "it does" if len(fresh) == 1 else "they do",
            )
        first.numbers.update(numbers)


__all__ = ["Watch", "carried", "changed"]
