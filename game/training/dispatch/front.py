"""The C++ dispatch front's session: what a step hands the front, what it gets back, and the op rows.

Why a front: a ``TorchDispatchMode`` costs some 9 us of Python for each of the ~480 ATen ops of a
gpt-shakespeare step, a third of a plain float64 step, and half of those ops round nothing. The
front (``native/front.cpp``, built and loaded by :mod:`game.training.native.front`) is a C++
fallback below autograd: ops that round nothing run without Python, and an op that rounds hands the
float64 tensors it produced or changed to the C kernels itself where the mode would
(:class:`Kernels`), or else calls the mode's ``_front_op`` once with them. The rows it keeps per op
are worked out here from the op table (:func:`row_for`), so the front classifies and touches what
the Python mode does (tests/training/test_front.py holds both to the same bits, log and counters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from game.training.dispatch.opplan import OpPlan, conditional_class, plan_of
from game.training.dispatch.optable import (
    COMPLEX_INEXACT,
    FULL_CALLS,
    GRADIENT_REFUSED,
    OpClass,
    base_name,
    refusal,
)
from game.training.native.bindings import BandParams
from game.training.native.front import compiled
from game.training.numerics.bandfile import BandTable

#: Kinds the C++ side knows (``front.cpp``'s ``Kind``): the three classes, then the conditional ops
#: whose class it works out from the arguments, as :func:`~game.training.dispatch.opplan.conditional_class` does.
#: ``GRADIENT``: inexact, or refused where differentiated (``optable.GRADIENT_REFUSED``); then the front
#: hands the call to Python as ``REFUSED``, to be refused by name. ``COMPLEX``: exact, unless a tensor
#: argument is complex (``optable.COMPLEX_INEXACT``; ``DIV`` asks the same first).
MOVE, EXACT, INEXACT, ALPHA, DIV, ACCUMULATE, GRADIENT, REFUSED, COMPLEX = range(9)


class SparseEntries(NamedTuple):
    """A sparse chunk to replay, as columns (:meth:`~game.training.log.sparse.SparseStepLog.columns`)."""

    table: torch.Tensor  # (k, 4) int64: op index, name id, value count, entry count, per record
    names: list[str]  # by name id
    positions: torch.Tensor  # flat int64: every record's positions, one record after another


class Kernels(NamedTuple):
    """What the front rounds with the C kernels itself, without a Python call (front.cpp's
    ``Direct``): kernel addresses (0: that work goes to Python), the grid, and for an inexact op
    its band (``bands`` known ahead, ``band_for(row) -> (rel, abs)`` asked once a session past
    them) and the entries to replay."""

    round_inplace: int = 0  # exact ops' tensors
    record: int = 0  # inexact ops' tensors, sparse record
    replay: int = 0  # inexact ops' tensors, sparse replay
    trits_record: int = 0  # inexact ops' tensors, packed record
    trits_replay: int = 0  # inexact ops' tensors, packed replay
    round_nearest: int = 0  # inexact ops' tensors without a log (mode "round")
    k0: int = 0
    max_finite: int = 0
    threshold: int = 0  # the packed log's floor(tau * step) in float64 ulps
    count_free: bool = False
    band_for: Callable[[int], tuple[int, int]] | None = None
    #: the bands of rows 0..n-1 known ahead, as an (n, 2) int64 tensor of (rel, abs): ``band_for``
    #: is asked only for a row past them (each ask takes the GIL in the middle of the step)
    bands: torch.Tensor | None = None
    #: the chunk to replay: a sparse log's as :meth:`SparseStepLog.columns` gives them (as tensors),
    #: a packed log's as (op index, op name, count, trits) per record, in order
    entries: SparseEntries | Sequence[tuple[int, str, int, torch.Tensor]] = ()


#: Log records the front made and Python has not logged yet. In a sparse record, two tensors: a
#: (k, 4) int64 table of (op index, row, count, entries) per record, and every record's positions
#: one after another (flat int64). Otherwise (op index, row, count, trits) per packed record.
Records = tuple[torch.Tensor, torch.Tensor] | list[tuple[int, int, int, torch.Tensor]]


class Left(NamedTuple):
    """What a session did that Python has not seen yet, from :func:`leave`."""

    first_calls: list[tuple[int, int]]  # (row, class) of each op's first call, in call order
    op_index: int  # the step's logged tensors so far; -1: the last on_op call raised, Python's is newer
    cursor: int  # replay records taken so far; -1 as op_index
    records: Records  # not yet logged
    logged: list[int]  # tensors the kernels rounded with the log, by row
    rounded: list[int]  # tensors the kernels rounded without it, by row
    corrections: int
    free: int
    tensors: int  # tensors the kernels took in all


_NO_BANDS = torch.zeros(0, 2, dtype=torch.int64)


def enter(
    plan_for: Callable[[str, str], tuple[int, int, int, list[int], list[int], int, str, int]],
    on_op: Callable[..., tuple[int, int]],
    kernels: Kernels,
    *,
    shared: bool = False,
) -> None:
    """Switch the front on for this thread. ``plan_for`` gives an op's row the first time the front
    meets it; ``on_op(row, class, tensors, op index, cursor, records)`` rounds the float64 tensors
    the kernels did not take, after logging ``records`` (the front's, since its last call) and
    taking the op index and replay cursor from it, and returns them as they are after.

    ``shared``: also serve a thread that has the front's key and no session of its own, as
    autograd's device thread does a GPU step's backward pass (one shared session at a time, and
    never two threads at once: ``front.cpp`` raises rather than guess)."""
    k = kernels
    compiled().enter(
        plan_for, on_op, (k.round_inplace, k.record, k.replay, k.trits_record, k.trits_replay, k.round_nearest), k.k0,
        k.max_finite, k.threshold, k.count_free, k.band_for,
        k.bands if k.bands is not None else _NO_BANDS,
        k.entries if isinstance(k.entries, SparseEntries) else list(k.entries), shared,
    )  # fmt: skip


def leave() -> Left:
    """Switch it off, with what the session did since the last ``on_op`` call."""
    return Left(*compiled().leave())


#: Plans of the ops the front has met, by row id (the front keeps the id, not the plan).
rows: list[OpPlan] = []
#: Their names, by the same row id: the sparse log reads a row's name here (it only grows).
names: list[str] = []
#: The kernels' bands of every row in ``rows``, by (band table, grid k0, grid's largest finite
#: pattern): the front takes them at ``enter`` and asks Python only for a row met after.
_bands: dict[tuple[BandTable, int, int], Tensor] = {}
#: The last of them asked for, with its key (the table by identity).
_bands_last: tuple[BandTable, int, int, Tensor] | None = None
KINDS = {OpClass.MOVE: MOVE, OpClass.EXACT: EXACT, OpClass.INEXACT: INEXACT}
CLASSES = {MOVE: OpClass.MOVE, EXACT: OpClass.EXACT, INEXACT: OpClass.INEXACT, REFUSED: OpClass.REFUSED}


def row_for(
    schema_name: str, overload: str, where: str = ""
) -> tuple[int, int, int, list[int], list[int], int, str, int]:
    """An op's row for the front, the first time it meets the op: (id, kind, position of the
    argument a conditional kind reads or -1, written positions, hidden positions, position of their
    ``training`` flag or -1, the op's name in the log, position of the flag the front sets true or
    -1: :data:`~game.training.dispatch.optable.FULL_CALLS`). The kinds and positions say what
    :func:`~game.training.dispatch.opplan.classify` and :func:`~game.training.dispatch.opplan.touched_by` do, for the boxed arguments the front sees (all of them,
    in schema order). A ``REFUSED`` op raises :class:`~game.errors.UnsupportedOpError` (``where``
    prefixes its message): the front keeps no row for it, so it asks, and raises, at each call,
    and the error reaches the op's caller as itself (pybind11 carries a Python error through
    the dispatcher, forward and backward)."""
    ns, _, name = schema_name.partition("::")
    func = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    plan = plan_of(func)
    if plan.fixed is OpClass.REFUSED:
        raise refusal(func, where)
    positions = {a.name: i for i, a in enumerate(func._schema.arguments)}
    arg = -1
    if plan.fixed is not None:
        kind = KINDS[plan.fixed]
    else:
        base = base_name(func)
        if base in ("add", "sub", "rsub"):
            kind, arg = ALPHA, positions.get("alpha", -1)
        elif base == "div":
            kind, arg = DIV, positions.get("rounding_mode", -1)
        elif base == "index_put" and "accumulate" in positions:
            kind, arg = ACCUMULATE, positions["accumulate"]
        elif base in GRADIENT_REFUSED:
            kind = GRADIENT
        elif base in COMPLEX_INEXACT:
            kind = COMPLEX
        else:  # the rest depend on the overload alone
            kind = KINDS[conditional_class(func, (), {})]
    hidden, training = plan.hidden if plan.hidden is not None else ((), -1)
    rows.append(plan)
    names.append(plan.name)
    full = positions.get(FULL_CALLS.get(base_name(func), ""), -1)
    return len(rows) - 1, kind, arg, [i for i, _, _ in plan.written], list(hidden), training, plan.name, full


def known_bands(table: BandTable, k0: int, max_finite: int, params_of: Callable[[str], BandParams]) -> Tensor:
    """The kernels' bands (rel, abs) of every row met so far, for one band table and grid, worked
    out once a run (``params_of(op name)`` gives a row's): without them, each step's first tensor of
    each inexact op would take the GIL to ask the mode."""
    global _bands_last
    last = _bands_last  # a task's steps use one table: no hash of it (some 20 us a step)
    if last is not None and last[0] is table and last[1:3] == (k0, max_finite) and len(last[3]) == len(rows):
        return last[3]
    key = (table, k0, max_finite)
    known = _bands.get(key)
    if known is None or len(known) < len(rows):
        params = [params_of(plan.name) for plan in list(rows)]
        known = _bands[key] = torch.tensor([(p.rel, p.abs) for p in params], dtype=torch.int64).reshape(-1, 2)
    _bands_last = (table, k0, max_finite, known)
    return known
