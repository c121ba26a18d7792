"""What one step's interception holds: its settings, counters and replay cursor, and the deferred
CUDA checks.

The base of :class:`~game.training.dispatch.mode.RoundingMode`, apart so that each module holds one
concern: this one the state (built once a step) and the deferral of the CUDA kernels' checks to the
step's end (:class:`~game.training.numerics.cuda_deferred.Deferred`); :mod:`~game.training.dispatch.roles`
what the trainer and the auditor do with a tensor, :mod:`~game.training.dispatch.frontmode` the C++
front's side, :mod:`~game.training.dispatch.mode` the dispatch itself.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from game.errors import ConfigError, TrainingError
from game.training.dispatch.front import Left
from game.training.dispatch.optable import OpClass
from game.training.dispatch.policies import ROLES, Role
from game.training.dispatch.profiles import NoiseSource, Profile
from game.training.log.chunks import ChunkMismatchError, RecordCursor
from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseRecord, SparseStepLog
from game.training.native import bindings, library
from game.training.numerics import rounding
from game.training.numerics.bandfile import MAX_EXP, Band, BandTable
from game.training.numerics.reach import Checks

if TYPE_CHECKING:  # imported when a step defers its checks (Triton loads only for CUDA tensors)
    from game.training.numerics.cuda_deferred import Deferred, Settled

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


class ModeState(TorchDispatchMode):
    """One step's interception state (see :class:`~game.training.dispatch.mode.RoundingMode`)."""

    #: The kernels may round an op's output in its own storage (a subclass that still needs the
    #: unrounded values after ``_record``, like the log-rewriting deviations, sets it False).
    round_in_place: bool = True
    #: On CUDA the kernels may leave their checks to the end of the step (``defer``, see
    #: :class:`~game.training.numerics.cuda_deferred.Deferred`); a subclass that reads a tensor's log record
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
        checks: Checks = "judge",
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
        self.role: Role = ROLES[mode]  # what the mode does with an inexact op's tensor
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
        self.checks: Checks = checks  # replay: how far from a midpoint an entry is accepted (numerics.reach)
        self.free = 0  # off-grid values within 16 bands of a midpoint (sparse replay, when counted)
        self._classes: dict[str, OpClass] = {}  # see :attr:`classes`
        self._logged: Counter[str] = Counter()  # see :attr:`logged`
        self._rounded: Counter[str] = Counter()  # see :attr:`rounded`
        self._tallies: Left | None = None  # the front's, not yet added to the three above
        self._grid = rounding._grid(bits)
        self._defer: Deferred | None = None
        if defer:
            self._defer = self._deferred_checks(profile, log)
        # a foreach op's tensors in one deferred launch (set on entering, where no subclass rounds
        # its own way: see RoundingMode.__enter__)
        self._groups = False
        # deferred: the log's records in op order, each with its positions or a Deferred ticket
        self._pending: list[tuple[int, str, int, Tensor | int]] = []
        self._immediate = immediate  # ordinals of kernel calls not to defer (they failed before)
        self._calls = 0  # kernel calls that could defer, so far in this step
        self._deferred_calls: list[int] = []  # the ordinal of each deferred call, in launch order
        self.failed_calls: frozenset[int] = frozenset()  # deferred calls whose checks failed
        # CPU, sparse log, C kernels: an inexact tensor goes straight to the kernel (the general path
        # through bandcheck costs some 15 us more a tensor in Python, on ~200 tensors a step)
        self._direct = (
            self.role.logs
            and isinstance(log, SparseStepLog)
            and self._noise is None
            and self._defer is None
            and self.round_in_place
            and torch.device(profile.device).type == "cpu"
            and library.available()
        )
        self._params: dict[str, bindings.BandParams] = {}
        self._entry: SparseRecord | None = None  # the auditor entry the kernel last took
        self._front = False  # whether the C++ front stands in for __torch_dispatch__ now (see __enter__)
        self.via_front = False  # whether it did, in this step
        self.front_kernel_tensors = 0  # tensors the front rounded with the C kernels, no Python call

    def _deferred_checks(self, profile: Profile, log: ChunkLog | None) -> Deferred:
        """The step's :class:`Deferred` (``defer`` is for sparse record and replay on CUDA only)."""
        from game.training.numerics import cuda_deferred, cuda_kernels

        if not (
            self.defer_checks
            and self.round_in_place
            and self.role.logs
            and isinstance(log, SparseStepLog)
            and self._noise is None
            and cuda_kernels.runs_on(torch.device(profile.device))
        ):
            raise ConfigError("deferred checks are for a sparse log's record or replay on CUDA")
        deferred = cuda_deferred.Deferred(torch.device(profile.device))
        if self.mode == "replay":  # every entry of the chunk on the device in one copy
            rows = log.decoded_rows()
            if rows is not None:  # a chunk as read: its entries in one array, each list fits
                sizes = rows.table[:, 3]
                self._fits = [True] * len(sizes)
                self._offsets = [0, *np.cumsum(sizes).tolist()]
                pinned = log.pinned_positions()
                flat = torch.from_numpy(rows.positions) if pinned is None else pinned
            else:  # a log built or changed here: checked list by list, gathered into one array
                pinned = None
                entries = log.entries()
                host = [e.positions.to(dtype=torch.int64) for e in entries]
                self._fits = cuda_deferred.entries_fit(host, [e.record.count for e in entries])
                self._offsets = [0, *itertools.accumulate(int(h.numel()) for h in host)]
                flat = torch.cat(host) if host else torch.empty(0, dtype=torch.int64)
            # from page-locked memory (the read-ahead pinned it) the copy runs without the host
            # waiting, ahead of the kernels that read it on the same stream
            self._device_positions = flat.to(deferred.device, non_blocking=pinned is not None)
        return deferred

    def deferred_failed(self) -> bool:
        """Read the deferred checks back (once); whether one failed. After an error in the step, a
        True here means the error may come from values a failed call left unrounded."""
        if self._defer is not None:
            settled, self._defer = self._defer.settle(), None
            if settled.failed:
                self.failed_calls = frozenset(self._deferred_calls[row] for row in settled.failed)
            else:
                self._log_pending(settled)  # record mode only
                self.corrections += settled.corrections
                if self.count_free:
                    self.free += settled.free
            self._pending = []
        return bool(self.failed_calls)

    def _log_pending(self, settled: Settled) -> None:
        """Log a deferred step's records, in op order: as columns when every one is a ticket (the
        listed positions stay the one array :meth:`Deferred.settle` made), else one by one."""
        pending = self._pending
        assert isinstance(self.log, SparseStepLog)  # deferral is for sparse logs
        if pending and all(isinstance(p[3], int) for p in pending):
            names: dict[str, int] = {}
            table = np.empty((len(pending), 4), dtype=np.int64)
            table[:, 0] = [p[0] for p in pending]
            table[:, 1] = [names.setdefault(p[1], len(names)) for p in pending]
            table[:, 2] = [p[2] for p in pending]
            table[:, 3] = [settled.size(p[3]) for p in pending]  # type: ignore[arg-type]  # tickets
            self.log.add_rows(table, settled.listed, list(names))
            return
        for index, name, count, pos in pending:
            positions = settled.positions(pos) if isinstance(pos, int) else pos
            self.log.append(index, name, count, positions)

    def _may_defer(self) -> bool:
        """Whether the next kernel call may defer its checks: deferral is on and the call did not
        fail in an earlier step (the ordinals are the same every step: the same ops in the same
        order). Every call that could defer counts, so ask once per tensor."""
        if self._defer is None:
            return False
        ordinal = self._calls
        self._calls += 1
        return ordinal not in self._immediate

    def _group_calls(self, count: int) -> range | None:
        """The ordinals the next ``count`` kernel calls would have, done one by one, when none of
        them failed in an earlier step (a group is deferred whole or not at all); nothing counted
        yet (:meth:`_deferred_group` does)."""
        calls = range(self._calls, self._calls + count)
        if self._immediate and any(c in self._immediate for c in calls):
            return None
        return calls

    def _deferred_group(self, calls: range) -> None:
        """Note a group's calls as launched deferred, as :meth:`_may_defer` and :meth:`_deferred`
        note them one at a time."""
        self._calls = calls.stop
        self._deferred_calls.extend(calls)

    def _deferred(self, launched: bool) -> bool:
        """Note a call that launched its kernels deferred (``launched``); pass it on."""
        if launched:
            self._deferred_calls.append(self._calls - 1)
        return launched
