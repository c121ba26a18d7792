"""The TorchDispatchMode that rounds (and logs or corrects) every op result of a training step.

The paper's code rounds at ``nn.Module`` boundaries and so misses functional ops, parameter gradients,
optimizer state and BatchNorm running stats. A dispatch mode sits below autograd and sees every ATen
op that forward, backward and ``optimizer.step()`` run, whatever Python code called it. Each op falls
in one class (docs/architecture.md, "What is rounded"):

* ``MOVE``: views, copies, indexing, factories: no arithmetic, passed through untouched;
* ``EXACT``: IEEE-exact elementwise ops (one correctly rounded operation per value): the float64
  result is the same on every machine, so it is rounded to the grid without a log entry;
* ``INEXACT``: everything else (reductions, matmul/conv, norms, softmax, transcendental and fused
  ops, and every op we do not know): each float64 output and each float64 argument the op mutates is
  rounded with the log. Unknown ops land here on purpose: logging too much is safe, too little is not.

The trainer *records* trits, the auditor *replays* them (``rev`` corrections); ``round`` rounds
without a log (to show divergence) and ``plain`` does not round at all (baselines). A hardware
profile's emulation (split-K order, noise) is applied to inexact ops before rounding in every mode.

On CPU, with a profile that emulates nothing, the C++ front (``native/front.cpp``) stands in for
``__torch_dispatch__``: ops that round nothing skip Python, the rest come to
:meth:`RoundingMode._front_op` (see :meth:`RoundingMode.__enter__`).
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from game.errors import ConfigError, TrainingError
from game.training import banding, native, rounding
from game.training.bands import MAX_EXP, Band, BandTable
from game.training.native import front
from game.training.roundlog import ChunkLog, ChunkMismatchError, RecordCursor, StepLog
from game.training.sparselog import SparseRecord, SparseStepLog
from game.training.task.profiles import NoiseSource, Profile

if TYPE_CHECKING:  # imported when a step defers its checks (Triton loads only for CUDA tensors)
    from game.training.cuda_kernels import Deferred

logger = logging.getLogger(__name__)

Mode = Literal["record", "replay", "round", "plain"]
MODES: tuple[str, ...] = ("record", "replay", "round", "plain")


#: Bands for an interceptor used without a task (tests of the interceptor alone): as wide as bands go,
#: so a packed log's corrections are never refused and a sparse log lists every value it could.
UNCHECKED_BANDS = BandTable(default=Band(MAX_EXP, MAX_EXP))


class DeferredChecksFailed(TrainingError):
    """A step's deferred CUDA checks found a tensor the kernels left to the torch path; the step
    engine runs the step again, from its saved state, without deferral (never seen by callers).
    ``calls``: the failed calls' ordinals in the step, which later steps do not defer."""

    def __init__(self, message: str, calls: frozenset[int] = frozenset()) -> None:
        super().__init__(message)
        self.calls = calls


class OpClass(enum.Enum):
    """What the rounding mode does with an op's results."""

    MOVE = "move"  # data movement: passed through
    EXACT = "exact"  # IEEE-exact elementwise: rounded, no log entry
    INEXACT = "inexact"  # may differ between machines: rounded with the log


# --------------------------------------------------------------------------------------------------
# Classification (by the op's base name: namespace, ``_foreach_`` prefix and in-place ``_`` removed)
# --------------------------------------------------------------------------------------------------

#: Ops that only move, select or create values: their float outputs are bit copies of their inputs
#: (or constants on every grid). Views are recognised from the schema and need not be listed.
MOVE_OPS: frozenset[str] = frozenset(
    {
        "clone", "contiguous", "copy", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy",
        "cat", "stack", "hstack", "vstack", "index", "_unsafe_index", "index_select", "gather", "take",
        "embedding", "masked_select", "masked_scatter", "flip", "roll", "repeat", "tile",
        "repeat_interleave", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
        "zeros", "zeros_like", "new_zeros", "zero", "ones", "ones_like", "new_ones",
        "_local_scalar_dense", "item", "resize", "set", "_unsafe_view", "_reshape_copy", "view_copy",
        "t_copy", "transpose_copy", "permute_copy", "expand_copy", "slice_copy", "select_copy",
        "unsqueeze_copy", "squeeze_copy", "detach_copy", "alias_copy", "split_copy", "unbind_copy",
        "split_with_sizes_copy", "narrow_copy", "im2col", "sort", "topk", "max_pool2d_with_indices",
        "max_pool3d_with_indices", "one_hot", "nonzero", "argmax", "argmin", "randperm",
        "is_same_size", "_pin_memory", "_nested_tensor_from_mask", "profiler",
    }
)  # fmt: skip

#: IEEE-exact elementwise ops (one correctly rounded result per value, the same on every device),
#: selections that may meet off-grid scalars (clamp bounds, fill values), and conversions.
EXACT_OPS: frozenset[str] = frozenset(
    {
        "mul", "neg", "abs", "sqrt", "relu", "threshold", "threshold_backward", "where", "maximum",
        "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max", "hardtanh", "sign", "sgn",
        "copysign", "max", "min", "amax", "amin", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
        "logical_or", "logical_not", "logical_xor", "isnan", "isinf", "isfinite", "floor", "ceil",
        "trunc", "fill", "full", "full_like", "new_full", "scalar_tensor", "masked_fill", "_to_copy",
        "constant_pad_nd", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "__and__", "__or__",
        "__xor__", "__lshift__", "__rshift__", "bitwise_left_shift", "bitwise_right_shift",
    }
)  # fmt: skip

#: Ops whose class depends on their arguments (see :func:`classify`).
CONDITIONAL_OPS: frozenset[str] = frozenset({"add", "sub", "rsub", "div", "index_put", "scatter", "round"})

#: Ops that mutate arguments their schema does not mark ``(a!)``: (positions, position of ``training``).
_HIDDEN_WRITES: dict[str, tuple[tuple[int, ...], int]] = {
    "native_batch_norm": ((3, 4), 5),
    "cudnn_batch_norm": ((3, 4), 5),
    "miopen_batch_norm": ((3, 4), 5),
}


@functools.cache
def base_name(func: Any) -> str:
    """``aten::_foreach_add_`` -> ``add``; ``aten::_softmax`` -> ``_softmax``; other namespaces keep theirs."""
    full: str = func._schema.name
    ns, _, name = full.partition("::")
    if ns == "profiler":
        return "profiler"
    if ns != "aten":
        return full
    if name.startswith("_foreach_"):
        name = name[len("_foreach_") :]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name


@functools.cache
def _static_class(func: Any) -> OpClass | None:
    """The class an op has whatever its arguments, or None when it depends on them."""
    schema = func._schema
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return OpClass.MOVE  # a view: computes nothing
    name = base_name(func)
    if name in MOVE_OPS:
        return OpClass.MOVE
    if name in EXACT_OPS:
        return OpClass.EXACT
    if name in CONDITIONAL_OPS:
        return None
    return OpClass.INEXACT


def _arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    i = _positions(func).get(name)
    return args[i] if i is not None and i < len(args) else default


_arg_positions: dict[int, tuple[Any, dict[str, int]]] = {}


def _positions(func: Any) -> dict[str, int]:
    """Positions of ``func``'s arguments that may be passed positionally (reading the schema's
    arguments costs microseconds, and add/sub/div ask on every call)."""
    entry = _arg_positions.get(id(func))
    if entry is None or entry[0] is not func:
        found = {a.name: i for i, a in enumerate(func._schema.arguments) if not a.kwarg_only}
        entry = _arg_positions[id(func)] = (func, found)
    return entry[1]


def _is_big_tensor(x: Any) -> bool:
    if isinstance(x, list | tuple):
        return all(_is_big_tensor(v) for v in x)
    return isinstance(x, Tensor) and x.dim() > 0


class _Plan(NamedTuple):
    """What the mode needs to know of an op whatever its arguments, worked out once per overload."""

    func: Any
    name: str  # str(func): the op name in the log and in coverage sets
    fixed: OpClass | None  # the op's class, or None when it depends on the arguments
    written: tuple[tuple[int, str, bool], ...]  # see _written_args
    hidden: tuple[tuple[int, ...], int] | None  # see _HIDDEN_WRITES


#: Plans by ``id(func)``: an int key, where a dict keyed by the OpOverload itself would call its
#: Python ``__hash__`` (some 600 ops a step, each looked up several times, made that milliseconds).
_plans: dict[int, _Plan] = {}


def _plan(func: Any) -> _Plan:
    plan = _plans.get(id(func))
    if plan is None or plan.func is not func:  # ids of overloads are stable (their packets keep them)
        plan = _Plan(
            func, op_name(func), _static_class(func), _written_args(func), _HIDDEN_WRITES.get(base_name(func))
        )
        _plans[id(func)] = plan
    return plan


def classify(func: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> OpClass:
    """The class of one call of ``func`` (an OpOverload) with these arguments."""
    fixed = _plan(func).fixed
    if fixed is not None:
        return fixed
    return _conditional_class(func, args, kwargs or {})


def _conditional_class(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpClass:
    """The class of a call of one of the ``CONDITIONAL_OPS``, from its arguments."""
    name = base_name(func)
    if name in ("add", "sub", "rsub"):
        # a + alpha*b is fused (FMA) for alpha != 1: not IEEE-exact.
        return OpClass.EXACT if _arg(func, args, kwargs, "alpha", 1) == 1 else OpClass.INEXACT
    if name == "div":
        # No rounding mode and a real tensor divisor: CUDA turns division by a scalar into a multiply
        # by its reciprocal, which is not correctly rounded.
        if _arg(func, args, kwargs, "rounding_mode", None) is not None or len(args) < 2:
            return OpClass.INEXACT
        return OpClass.EXACT if _is_big_tensor(args[1]) else OpClass.INEXACT
    if name == "index_put":
        return OpClass.INEXACT if _arg(func, args, kwargs, "accumulate", False) else OpClass.MOVE
    if name == "scatter":
        return OpClass.INEXACT if "reduce" in func._overloadname else OpClass.MOVE
    if name == "round":  # round to integer is exact; round(decimals=n) scales by 10**n
        return OpClass.EXACT if func._overloadname in ("default", "out") else OpClass.INEXACT
    return OpClass.INEXACT


# --------------------------------------------------------------------------------------------------
# Which tensors an op produced or changed
# --------------------------------------------------------------------------------------------------


def _tensors(x: Any) -> Iterator[Tensor]:
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, list | tuple):
        for v in x:
            yield from _tensors(v)


def _key(t: Tensor) -> tuple[Any, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


@functools.cache
def _written_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg-only) of the arguments the schema marks as written (``Tensor(a!)``)."""
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


@functools.cache
def op_name(func: Any) -> str:
    """``str(func)``, e.g. ``aten.addmm.default``: the op name in the log and in coverage sets."""
    return str(func)


def touched_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[Tensor]:
    """Arguments the op mutates (schema ``(a!)`` plus known hidden writes), then its fresh outputs."""
    return _touched(_plan(func), args, kwargs, out)


def _touched(plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[Tensor]:
    if not plan.written and plan.hidden is None:  # a functional op: only its fresh outputs
        return [out] if isinstance(out, Tensor) else list(_tensors(out))
    found: list[Tensor] = []
    for i, name, kwarg_only in plan.written:
        value = kwargs.get(name) if kwarg_only or name in kwargs else (args[i] if i < len(args) else None)
        found.extend(_tensors(value))
    hidden = plan.hidden
    if hidden is not None:
        positions, training_pos = hidden
        if len(args) > training_pos and args[training_pos]:
            found.extend(t for p in positions for t in _tensors(args[p]))
    if not found:  # a functional op: its outputs are fresh tensors, distinct from each other
        return list(_tensors(out))
    if isinstance(out, Tensor) and any(out is t for t in found):  # an in-place op returns its self
        return found
    seen = {_key(t) for t in found}
    for t in _tensors(out):
        k = _key(t)
        if k not in seen:
            seen.add(k)
            found.append(t)
    return found


# --------------------------------------------------------------------------------------------------
# The C++ front's table (native/front.cpp): each op's plan as the front needs it, worked out here
# --------------------------------------------------------------------------------------------------

#: Plans of the ops the front has met, by row id (the front keeps the id, not the plan).
_front_rows: list[_Plan] = []
#: Their names, by the same row id: the sparse log reads a row's name here (it only grows).
_front_names: list[str] = []
#: The kernels' bands of every row in ``_front_rows``, by (band table, grid k0, grid's largest finite
#: pattern): the front takes them at ``enter`` and asks Python only for a row met after.
_front_bands: dict[tuple[BandTable, int, int], Tensor] = {}
#: The last of them asked for, with its key (the table by identity).
_front_bands_last: tuple[BandTable, int, int, Tensor] | None = None
_FRONT_KINDS = {OpClass.MOVE: front.MOVE, OpClass.EXACT: front.EXACT, OpClass.INEXACT: front.INEXACT}
_FRONT_CLASSES = {front.MOVE: OpClass.MOVE, front.EXACT: OpClass.EXACT, front.INEXACT: OpClass.INEXACT}


def _front_row(schema_name: str, overload: str) -> tuple[int, int, int, list[int], list[int], int, str]:
    """An op's row for the front, the first time it meets the op: (id, kind, position of the
    argument a conditional kind reads or -1, written positions, hidden positions, position of their
    ``training`` flag or -1, the op's name in the log). The kinds and positions say what
    :func:`classify` and :func:`_touched` do, for the boxed arguments the front sees (all of them,
    in schema order)."""
    ns, _, name = schema_name.partition("::")
    func = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    plan = _plan(func)
    positions = {a.name: i for i, a in enumerate(func._schema.arguments)}
    arg = -1
    if plan.fixed is not None:
        kind = _FRONT_KINDS[plan.fixed]
    else:
        base = base_name(func)
        if base in ("add", "sub", "rsub"):
            kind, arg = front.ALPHA, positions.get("alpha", -1)
        elif base == "div":
            kind, arg = front.DIV, positions.get("rounding_mode", -1)
        elif base == "index_put" and "accumulate" in positions:
            kind, arg = front.ACCUMULATE, positions["accumulate"]
        else:  # the rest depend on the overload alone
            kind = _FRONT_KINDS[_conditional_class(func, (), {})]
    hidden, training = plan.hidden if plan.hidden is not None else ((), -1)
    _front_rows.append(plan)
    _front_names.append(plan.name)
    return len(_front_rows) - 1, kind, arg, [i for i, _, _ in plan.written], list(hidden), training, plan.name


# --------------------------------------------------------------------------------------------------
# The mode
# --------------------------------------------------------------------------------------------------


class RoundingMode(TorchDispatchMode):
    """Round every float64 result of the ops run inside it; record or replay the rounding log.

    One instance serves one training step: ``op_index`` counts the logged tensors of that step.
    """

    #: The kernels may round an op's output in its own storage (a subclass that still needs the
    #: unrounded values after ``_record``, like the log-rewriting deviations, sets it False).
    round_in_place: bool = True
    #: On CUDA the kernels may leave their checks to the end of the step (``defer``, see
    #: :class:`~game.training.cuda_kernels.Deferred`); a subclass that reads a tensor's log record
    #: right after ``_record`` sets it False.
    defer_checks: bool = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No: torch otherwise wraps ``__torch_dispatch__`` (of this class and of every subclass) in a
        "dynamo disabled" guard that costs microseconds per op, some 400 times a step. Nothing here
        runs ``torch.compile``, which is what the guard is for."""
        return False

    def __init__(
        self,
        *,
        bits: int,
        tau: float,
        mode: Mode,
        profile: Profile,
        step: int,
        log: ChunkLog | None = None,
        bands: BandTable | None = None,
        log_format: str | None = None,
        count_free: bool = False,
        defer: bool = False,
        immediate: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        if mode in ("record", "replay") and log is None:
            raise ConfigError(f"mode {mode!r} needs a StepLog")
        if mode == "replay" and log is not None and log_format is not None and log.format != log_format:
            raise ChunkMismatchError(
                f"step {step}: the chunk is a {log.format} log, the task's log format is {log_format}"
            )
        rounding.recheck_conversion()  # one probe per step and device: a flush-to-zero mode is seen
        self.bits = bits
        self.tau = tau
        self.mode: Mode = mode
        self.profile = profile
        self.step = step
        self.log = log
        self.bands = bands if bands is not None else UNCHECKED_BANDS
        self._cursor: RecordCursor[Any] | None = (
            log.cursor() if mode == "replay" and log is not None else None
        )
        self._noise: NoiseSource | None = profile.noise_generator()
        self.op_index = 0  # logged tensors so far in this step
        self.corrections = 0  # rev moves applied (replay)
        self.count_free = count_free  # replay of a sparse log: count the values a trainer could choose
        self.free = 0  # off-grid values within 16 bands of a midpoint (sparse replay, when counted)
        self._classes: dict[str, OpClass] = {}  # see :attr:`classes`
        self._logged: Counter[str] = Counter()  # see :attr:`logged`
        self._rounded: Counter[str] = Counter()  # see :attr:`rounded`
        self._tallies: front.Left | None = None  # the front's, not yet added to the three above
        self._grid = rounding._grid(bits)
        self._defer: Deferred | None = None
        if defer:
            self._defer = self._deferred_checks(profile, log)
        # deferred: the log's records in op order, each with its positions or a Deferred ticket
        self._pending: list[tuple[int, str, int, Tensor | int]] = []
        self._immediate = immediate  # ordinals of kernel calls not to defer (they failed before)
        self._calls = 0  # kernel calls that could defer, so far in this step
        self._deferred_calls: list[int] = []  # the ordinal of each deferred call, in launch order
        self.failed_calls: frozenset[int] = frozenset()  # deferred calls whose checks failed
        # CPU, sparse log, C kernels: an inexact tensor goes straight to the kernel (the general path
        # through banding costs some 15 us more a tensor in Python, on ~200 tensors a step)
        self._direct = (
            mode in ("record", "replay")
            and isinstance(log, SparseStepLog)
            and self._noise is None
            and self._defer is None
            and self.round_in_place
            and torch.device(profile.device).type == "cpu"
            and native.available()
        )
        self._params: dict[str, native.BandParams] = {}
        self._entry: SparseRecord | None = None  # the auditor entry the kernel last took
        self._front = False  # whether the C++ front stands in for __torch_dispatch__ now (see __enter__)
        self.via_front = False  # whether it did, in this step
        self.front_kernel_tensors = 0  # tensors the front rounded with the C kernels, no Python call

    def __enter__(self) -> RoundingMode:
        """Push the mode; or, on CPU with a profile that emulates nothing (``compute`` is the op
        itself, no noise) and where the C++ front loads, switch the front on instead: the same
        classes, rounding and log, without a Python call per op. A subclass that changes
        ``__torch_dispatch__`` keeps the mode."""
        if (
            self.mode != "plain"
            and self._defer is None
            and type(self).__torch_dispatch__ is RoundingMode.__torch_dispatch__
            and self.profile.interceptor() == "front"
        ):
            front.enter(_front_row, self._front_op, self._front_kernels())
            self._front = self.via_front = True
            return self
        super().__enter__()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if not self._front:
            super().__exit__(exc_type, exc_val, exc_tb)
            return
        self._front = False
        left = front.leave()
        self._front_sync(left.op_index, left.cursor, left.records)
        self.corrections += left.corrections
        self.free += left.free
        self.front_kernel_tensors = left.tensors
        self._add_tallies()  # an earlier session's, if any: this one's are added when read
        self._tallies = left

    def _add_tallies(self) -> None:
        """Add the front's classes and counts, kept since :meth:`__exit__`, to the mode's: only a
        test or a tool reads them, and the loops over every row cost a step some 40 us."""
        left, self._tallies = self._tallies, None
        if left is None:
            return
        for row, kind in left.first_calls:  # the classes of the ops' first calls, in call order
            name = _front_rows[row].name
            if name not in self._classes:
                self._classes[name] = _FRONT_CLASSES[kind]
        for counter, by_row in ((self._logged, left.logged), (self._rounded, left.rounded)):
            for row, n in enumerate(by_row):
                if n:
                    counter[_front_rows[row].name] += n

    @property
    def classes(self) -> dict[str, OpClass]:
        """``str(func)`` -> class, for every op that ran."""
        self._add_tallies()
        return self._classes

    @property
    def logged(self) -> Counter[str]:
        """``str(func)`` -> tensors rounded with the log."""
        self._add_tallies()
        return self._logged

    @property
    def rounded(self) -> Counter[str]:
        """``str(func)`` -> tensors rounded without the log."""
        self._add_tallies()
        return self._rounded

    def _front_kernels(self) -> front.Kernels:
        """What the front may round with the C kernels itself: what :meth:`_front_op` would send to
        them. Exact ops' tensors always; inexact ones in a record or replay on the path the Python
        code would take to the same kernels (:attr:`_direct` for a sparse log; for a packed log,
        :meth:`_record` and :meth:`_replay` rounding in place), and in mode ``round`` to nearest as
        :meth:`_round_inexact` does (the kernel leaves a non-finite lane to it, which words the
        error), unless a subclass changes it."""
        cls, base = type(self), RoundingMode
        own = cls._front_op is base._front_op
        g = self._grid
        exact = native.address("vg_round_inplace") if own else 0
        plain = front.Kernels(round_inplace=exact, k0=g.k0, max_finite=g.max_finite)
        if not (own and cls._round_inexact is base._round_inexact):
            return plain
        if self.mode == "round":
            return (
                plain._replace(round_nearest=exact) if self._noise is None and self._defer is None else plain
            )
        band = self._front_band
        plain = plain._replace(bands=self._known_bands())
        if isinstance(self.log, SparseStepLog):
            if not (self._direct and cls._round_direct is base._round_direct):
                return plain
            if self.mode == "record":
                return plain._replace(record=native.address("vg_round_and_band"), band_for=band)
            table, names, positions = self.log.columns()
            columns = front.SparseEntries(torch.from_numpy(table), names, torch.from_numpy(positions))
            kernel = native.address("vg_round_with_entries")
            return plain._replace(replay=kernel, count_free=self.count_free, band_for=band, entries=columns)
        if not (
            isinstance(self.log, StepLog)
            and self.mode in ("record", "replay")
            and self._noise is None
            and self._defer is None
            and self.round_in_place
            and cls._record is base._record
            and cls._replay is base._replay
        ):
            return plain
        if self.mode == "record":
            threshold = rounding.log_threshold(self.bits, self.tau)
            kernel = native.address("vg_round_and_trits")
            return plain._replace(trits_record=kernel, threshold=threshold, band_for=band)
        entries = [(r.op_index, r.op_name, r.count, trits) for r, trits in self.log.entries()]
        kernel = native.address("vg_round_with_trits")
        return plain._replace(trits_replay=kernel, band_for=band, entries=entries)

    def _known_bands(self) -> Tensor | None:
        """The bands of every row the front has met, worked out once a run (None where a subclass
        works bands out its own way): without them, each step's first tensor of each inexact op
        would take the GIL to ask :meth:`_front_band`."""
        cls, base = type(self), RoundingMode
        if not (cls._front_band is base._front_band and cls._band_params is base._band_params):
            return None
        global _front_bands_last
        k0, max_finite = self._grid.k0, self._grid.max_finite
        last = _front_bands_last  # a task's steps use one table: no hash of it (some 20 us a step)
        if (
            last is not None
            and last[0] is self.bands
            and last[1:3] == (k0, max_finite)
            and len(last[3]) == len(_front_rows)
        ):
            return last[3]
        key = (self.bands, k0, max_finite)
        known = _front_bands.get(key)
        if known is None or len(known) < len(_front_rows):
            params = [self._band_params(plan.name) for plan in list(_front_rows)]
            known = _front_bands[key] = torch.tensor(
                [(p.rel, p.abs) for p in params], dtype=torch.int64
            ).reshape(-1, 2)
        _front_bands_last = (self.bands, k0, max_finite, known)
        return known

    def _front_band(self, row: int) -> tuple[int, int]:
        params = self._band_params(_front_rows[row].name)
        return params.rel, params.abs

    def _front_sync(self, op_index: int, cursor: int, records: front.Records) -> None:
        """Take what the front's kernels did since it last called: their log records, in op order
        (all before the op now calling), the op index and the replay cursor (-1 from
        :func:`front.leave` when its last call here raised: the ones here are the newer then)."""
        if isinstance(records, tuple):  # a sparse record's, as columns
            assert isinstance(self.log, SparseStepLog)
            table, positions = records
            self.log.add_rows(table.numpy(), positions.numpy(), _front_names)
        elif records:
            assert isinstance(self.log, StepLog)
            for index, row, _, trits in records:
                self.log.append(index, _front_rows[row].name, trits)
        if op_index < 0:
            return
        self.op_index = op_index
        if self._cursor is not None:
            self._cursor.move_to(cursor)

    def _front_op(
        self,
        row: int,
        kind: int,
        tensors: list[Tensor],
        op_index: int,
        cursor: int,
        records: front.Records,
    ) -> tuple[int, int]:
        """The front's call for an op that rounds: its float64 tensors the kernels did not take, as
        :meth:`__torch_dispatch__` rounds them (the front ran the op; a front run has no deferral,
        no noise, no split-K), after the front's own work since its last call (:meth:`_front_sync`).
        Returns the op index and the replay cursor for the front to go on from."""
        self._front_sync(op_index, cursor, records)
        name = _front_rows[row].name
        if kind == front.EXACT:
            for t in tensors:
                rounding.round_(t, self.bits)
                self._rounded[name] += 1
        else:
            for t in tensors:
                self._round_inexact(t, name)
        return self.op_index, self._cursor.position if self._cursor is not None else 0

    def _deferred_checks(self, profile: Profile, log: ChunkLog | None) -> Deferred:
        """The step's :class:`Deferred` (``defer`` is for sparse record and replay on CUDA only)."""
        from game.training import cuda_kernels

        if not (
            self.defer_checks
            and self.round_in_place
            and self.mode in ("record", "replay")
            and isinstance(log, SparseStepLog)
            and self._noise is None
            and cuda_kernels.runs_on(torch.device(profile.device))
        ):
            raise ConfigError("deferred checks are for a sparse log's record or replay on CUDA")
        deferred = cuda_kernels.Deferred(torch.device(profile.device))
        if self.mode == "replay":  # every entry of the chunk on the device in one copy
            entries = log.entries()
            host = [e.positions.to(dtype=torch.int64) for e in entries]
            self._offsets = [0, *itertools.accumulate(int(h.numel()) for h in host)]
            flat = torch.cat(host) if host else torch.empty(0, dtype=torch.int64)
            self._device_positions = flat.to(deferred.device)
        return deferred

    @property
    def ops(self) -> frozenset[str]:
        """Names (``str(func)``) of every op that ran."""
        return frozenset(self.classes)

    def finish(self) -> None:
        """Check a replayed log was used up exactly (a longer log is as wrong as a shorter one);
        with deferred checks, read them back first and write the log (:class:`DeferredChecksFailed`
        when one failed: the step must run again without deferral)."""
        if self.deferred_failed():
            raise DeferredChecksFailed(
                f"step {self.step}: a deferred check failed; run the step without deferral", self.failed_calls
            )
        if self._cursor is not None:
            self._cursor.finish()

    def deferred_failed(self) -> bool:
        """Read the deferred checks back (once); whether one failed. After an error in the step, a
        True here means the error may come from values a failed call left unrounded."""
        if self._defer is not None:
            settled, self._defer = self._defer.settle(), None
            if settled.failed:
                self.failed_calls = frozenset(self._deferred_calls[row] for row in settled.failed)
            else:
                assert isinstance(self.log, SparseStepLog)  # deferral is for sparse logs
                for index, name, count, pos in self._pending:  # record mode only
                    positions = settled.positions[pos] if isinstance(pos, int) else pos
                    self.log.append(index, name, count, positions)
                self.corrections += settled.corrections
                if self.count_free:
                    self.free += settled.free
            self._pending = []
        return bool(self.failed_calls)

    def _may_defer(self) -> bool:
        """Whether the next kernel call may defer its checks: deferral is on and the call did not
        fail in an earlier step (the ordinals are the same every step: the same ops in the same
        order). Every call that could defer counts, so ask once per tensor."""
        if self._defer is None:
            return False
        ordinal = self._calls
        self._calls += 1
        return ordinal not in self._immediate

    def _deferred(self, launched: bool) -> bool:
        """Note a call that launched its kernels deferred (``launched``); pass it on."""
        if launched:
            self._deferred_calls.append(self._calls - 1)
        return launched

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        plan = _plan(func)
        cls = plan.fixed if plan.fixed is not None else _conditional_class(func, args, kwargs)
        name = plan.name
        if name not in self._classes:
            self._classes[name] = cls
        if cls is OpClass.MOVE:
            return func(*args, **kwargs)
        if cls is OpClass.EXACT:
            out = func(*args, **kwargs)
            if self.mode != "plain":
                g = self._grid
                for t in _touched(plan, args, kwargs, out):
                    if t.dtype == torch.float64:
                        defer = self._defer
                        if not (
                            defer is not None
                            and self._may_defer()
                            and self._deferred(defer.round_inplace(t, g.k0, g.max_finite))
                        ):
                            rounding.round_(t, self.bits)
                        self._rounded[name] += 1
            return out
        out = self.profile.compute(func, args, kwargs)
        for t in _touched(plan, args, kwargs, out):
            if t.dtype == torch.float64:
                self._round_inexact(t, name)
            elif t.dtype == torch.float32 and self._noise is not None:
                self._noise.perturb(t)  # float32 is never rounded; only the noisy machine touches it
        return out

    def _round_inexact(self, t: Tensor, name: str) -> None:
        if self._noise is not None:
            self._noise.perturb(t)
        if self.mode == "plain":
            return
        index = self.op_index
        self.op_index += 1
        entry: SparseRecord | None = None
        if self._direct and t.is_cpu and t.is_contiguous() and t.numel():
            if self._round_direct(t, index, name):
                return
            if self.mode == "replay":  # the kernel refused the tensor; the torch path words why
                entry = self._entry
        if self._defer is not None and self._may_defer():  # record or replay; no error text needed
            params = self._band_params(name)
            if self.mode == "record":
                ticket = self._defer.round_and_band(t, params)
                if self._deferred(ticket is not None):
                    assert ticket is not None
                    self._pending.append((index, name, t.numel(), ticket))
                    self._logged[name] += 1
                    return
            else:
                assert self._cursor is not None
                entry = self._cursor.take(index, name, t.numel())  # LogSequenceError on mismatch
                i = self._cursor.position - 1
                listed = self._device_positions[self._offsets[i] : self._offsets[i + 1]]
                if self._deferred(self._defer.round_with_entries(t, params, entry.positions, listed)):
                    self._logged[name] += 1
                    return
        where = f"step {self.step}, op #{index} {name}"
        # The log kernels scan for inf and NaN themselves (the C ones in their own pass, where a
        # non-finite lane sends them to torch; the torch ones by check_finite with ``where``);
        # rounding without a log scans here.
        top = rounding.check_finite(t, where) if self.mode == "round" else None
        if self.mode == "round":
            rounding.round_(t, self.bits, top=top)
            self._rounded[name] += 1
            return
        band = self.bands.band(name)
        try:
            if self.mode == "record":
                r = self._record(t, index, name, band, top, where)
            else:
                r = self._replay(t, index, name, band, top, where, entry)
        except banding.BandViolation as exc:
            raise exc.at(self.step, index, name) from None
        if not (r.data_ptr() == t.data_ptr() and r.stride() == t.stride()):  # else rounded in place
            t.copy_(r)
        self._logged[name] += 1

    def _band_params(self, name: str) -> native.BandParams:
        """The kernels' integers for op ``name``'s band (worked out once a step per op)."""
        params = self._params.get(name)
        if params is None:
            band = self.bands.band(name)
            params = self._params[name] = native.BandParams(
                self._grid.k0, self._grid.max_finite, band.rel, band.abs
            )
        return params

    def _round_direct(self, t: Tensor, index: int, name: str) -> bool:
        """The C kernel on a contiguous CPU tensor, in place: what :meth:`_record` and
        :meth:`_replay` do through :mod:`banding` for it. False, with ``t`` untouched, when the
        kernel leaves the tensor to the torch path (rare lanes; for the auditor also an entry out
        of order, out of range or outside its band, which that path words); the auditor's entry is
        then in ``self._entry``."""
        params = self._band_params(name)
        if self.mode == "record":
            positions = native.round_and_band(t, params)
            if positions is None:
                return False
            assert isinstance(self.log, SparseStepLog)
            self.log.append(index, name, t.numel(), positions)
        else:
            assert self._cursor is not None
            entry = self._entry = self._cursor.take(index, name, t.numel())  # LogSequenceError on mismatch
            replayed = native.round_with_entries(t, params, entry.positions, self.count_free)
            if replayed is None:
                return False
            self.corrections += replayed.corrections
            self.free += max(replayed.free, 0)
        self._logged[name] += 1
        return True

    def _record(self, t: Tensor, index: int, name: str, band: Band, top: float | None, where: str) -> Tensor:
        """Trainer: round ``t`` and log what the task's format asks for (``top``: ``max |t|`` when
        scanned; ``where``: the op, for errors). The result may be ``t`` itself (``round_in_place``)."""
        if isinstance(self.log, SparseStepLog):
            r, positions = banding.round_and_band(
                t, self.bits, band, top=top, in_place=self.round_in_place, where=where
            )
            if self._defer is None:
                self.log.append(index, name, t.numel(), positions)
            else:  # after the deferred records before it, in op order
                self._pending.append((index, name, t.numel(), positions))
            return r
        assert isinstance(self.log, StepLog)
        r, trits = banding.round_and_trits(t, self.bits, self.tau, in_place=self.round_in_place, where=where)
        self.log.append(index, name, trits)  # flat, logical (row-major) order on every device
        return r

    def _replay(
        self,
        t: Tensor,
        index: int,
        name: str,
        band: Band,
        top: float | None,
        where: str,
        entry: SparseRecord | None = None,
    ) -> Tensor:
        """Auditor and judge: round ``t`` with the trainer's entries (``entry``: taken from the log
        already), after the band checks."""
        assert self._cursor is not None
        if isinstance(self.log, SparseStepLog):
            if entry is None:
                entry = self._cursor.take(index, name, t.numel())  # LogSequenceError on mismatch
            r, n, free = banding.round_with_entries(
                t,
                self.bits,
                band,
                entry.positions,
                count_free=self.count_free,
                top=top,
                in_place=self.round_in_place,
                where=where,
            )
            self.free += max(free, 0)
        else:
            trits = self._cursor.take(index, name, t.numel())
            r, n = banding.round_with_trits(
                t, self.bits, band, trits, in_place=self.round_in_place, where=where
            )
        self.corrections += n
        return r


__all__ = [
    "CONDITIONAL_OPS",
    "EXACT_OPS",
    "MODES",
    "MOVE_OPS",
    "DeferredChecksFailed",
    "Mode",
    "OpClass",
    "RoundingMode",
    "base_name",
    "classify",
    "op_name",
    "touched_tensors",
]
