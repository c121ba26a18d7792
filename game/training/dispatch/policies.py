"""The roles as policy objects: what ``record``, ``replay``, ``round`` and ``plain`` do with an inexact
op's float64 tensor.

Apart from the mode so that a role is one object rather than a branch on the mode's string at every
step of the way: :data:`ROLES` maps the mode's name (the engine's and the CLI's vocabulary) to its
policy, which the mode asks for each tensor (:meth:`Role.round_inexact`). The policies call the
mode's hooks (``_round_direct``, ``_record``, ``_replay``, the deferral's), so a subclass that
overrides a hook (the log-rewriting deviations override ``_record``) changes every role that uses it.

A policy knows the mode only as :class:`ModeHooks`, the state and hooks it reads and calls, so this
module imports neither the mode nor its state: the mode's state picks a policy from :data:`ROLES`, and
the policies stay below it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torch import Tensor

from game.training.log.chunks import RecordCursor
from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseRecord, SparseStepLog
from game.training.native import bindings
from game.training.numerics import bandcheck, rounding
from game.training.numerics.bandfile import Band, BandTable

if TYPE_CHECKING:  # Triton loads only for CUDA tensors
    from game.training.numerics.cuda_deferred import Deferred


class ModeHooks(Protocol):
    """What a policy reads and calls of the mode that holds it (one step's interception state and
    its kernels' hooks); :class:`~game.training.dispatch.mode.RoundingMode` is one."""

    step: int
    bits: int
    log: ChunkLog | None
    bands: BandTable
    op_index: int  # logged tensors so far in this step
    corrections: int  # rev moves applied (replay)
    count_free: bool
    free: int
    _rounded: Counter[str]
    _logged: Counter[str]
    _direct: bool  # an inexact CPU tensor goes straight to the C kernel
    _defer: Deferred | None
    _pending: list[tuple[int, str, int, Tensor | int]]
    _cursor: RecordCursor[Any] | None
    _entry: SparseRecord | None
    _offsets: list[int]  # replay with deferral: each entry's start in ``_device_positions``
    _device_positions: Tensor
    _fits: list[bool]  # replay with deferral: whether each entry's positions are the kernels'

    def _round_direct(self, t: Tensor, index: int, name: str) -> bool: ...
    def _band_params(self, name: str) -> bindings.BandParams: ...
    def _may_defer(self) -> bool: ...
    def _deferred(self, launched: bool) -> bool: ...
    def _group_calls(self, count: int) -> range | None: ...
    def _deferred_group(self, calls: range) -> None: ...
    def _record(
        self, t: Tensor, index: int, name: str, band: Band, top: float | None, where: str
    ) -> Tensor: ...
    def _replay(
        self,
        t: Tensor,
        index: int,
        name: str,
        band: Band,
        top: float | None,
        where: str,
        entry: SparseRecord | None = None,
    ) -> Tensor: ...


class Role:
    """One role's handling of an inexact op's float64 tensor (after a profile's noise, if any)."""

    name: ClassVar[str]
    #: whether the role rounds at all (``plain`` does not)
    rounds: ClassVar[bool] = True
    #: whether it reads or writes the step's rounding log (``record``, ``replay``)
    logs: ClassVar[bool] = False

    def round_inexact(self, m: ModeHooks, t: Tensor, name: str) -> None:
        raise NotImplementedError

    def round_inexact_group(self, m: ModeHooks, ts: list[Tensor], name: str) -> bool:
        """A foreach op's float64 tensors at once, as :meth:`round_inexact` does each in turn (the
        same op indices, log records and counts), where the step defers them all; False (nothing
        done) leaves them to it."""
        return False


class Plain(Role):
    """No rounding at all (the float64 and float32 baselines)."""

    name = "plain"
    rounds = False

    def round_inexact(self, m: ModeHooks, t: Tensor, name: str) -> None:
        return


class Round(Role):
    """Round to nearest without a log (shows divergence; the calibration's reference)."""

    name = "round"

    def round_inexact(self, m: ModeHooks, t: Tensor, name: str) -> None:
        index = m.op_index
        m.op_index += 1
        # The log kernels scan for NaN and overflow themselves (the C ones in their own pass, where
        # a non-finite lane sends them to torch; the torch ones by check_values with ``where``);
        # rounding without a log scans here. An inf passes, as it does through the log.
        top = rounding.check_values(t, m.bits, f"step {m.step}, op #{index} {name}")
        rounding.round_(t, m.bits, top=top)
        m._rounded[name] += 1


class Logged(Role):
    """A role with a log: the C kernel on a CPU tensor where it may, else the deferred CUDA kernels
    where the step defers, else the torch kernels with the band checks (which word every error)."""

    logs = True

    def round_inexact(self, m: ModeHooks, t: Tensor, name: str) -> None:
        index = m.op_index
        m.op_index += 1
        entry: SparseRecord | None = None
        if m._direct and t.is_cpu and t.is_contiguous() and t.numel():
            if m._round_direct(t, index, name):
                return
            entry = self.refused_entry(m)
        if m._defer is not None and m._may_defer():  # no error text needed
            done, entry = self.deferred(m, t, index, name)
            if done:
                m._logged[name] += 1
                return
        where = f"step {m.step}, op #{index} {name}"
        band = m.bands.band(name)
        try:
            r = self.torch_kernels(m, t, index, name, band, where, entry)
        except bandcheck.BandViolation as exc:
            raise exc.at(m.step, index, name) from None
        if not (r.data_ptr() == t.data_ptr() and r.stride() == t.stride()):  # else rounded in place
            t.copy_(r)
        m._logged[name] += 1

    def round_inexact_group(self, m: ModeHooks, ts: list[Tensor], name: str) -> bool:
        calls = m._group_calls(len(ts)) if m._defer is not None else None
        if calls is None or not self.deferred_group(m, ts, m.op_index, name):
            return False
        m._deferred_group(calls)
        m.op_index += len(ts)
        m._logged[name] += len(ts)
        return True

    def deferred_group(self, m: ModeHooks, ts: list[Tensor], index: int, name: str) -> bool:
        """Launch the deferred group kernels for ``ts`` (op indices from ``index``): whether they
        took them all (if not, nothing is launched or taken from the log)."""
        raise NotImplementedError

    def direct(self, m: ModeHooks, t: Tensor, index: int, name: str) -> bool:
        """The C kernel on a contiguous CPU tensor, in place (see the mode's ``_round_direct``)."""
        raise NotImplementedError

    def refused_entry(self, m: ModeHooks) -> SparseRecord | None:
        """The log entry already taken for a tensor the C kernel refused."""
        return None

    def deferred(self, m: ModeHooks, t: Tensor, index: int, name: str) -> tuple[bool, SparseRecord | None]:
        """Launch the deferred CUDA kernels: whether they took the tensor, and the entry taken."""
        raise NotImplementedError

    def torch_kernels(
        self, m: ModeHooks, t: Tensor, index: int, name: str, band: Band, where: str,
        entry: SparseRecord | None,
    ) -> Tensor:  # fmt: skip
        raise NotImplementedError


class Record(Logged):
    """The trainer: round and log what the task's log format asks for."""

    name = "record"

    def direct(self, m: ModeHooks, t: Tensor, index: int, name: str) -> bool:
        positions = bindings.round_and_band(t, m._band_params(name))
        if positions is None:
            return False
        assert isinstance(m.log, SparseStepLog)
        m.log.append(index, name, t.numel(), positions)
        return True

    def deferred(self, m: ModeHooks, t: Tensor, index: int, name: str) -> tuple[bool, SparseRecord | None]:
        assert m._defer is not None
        ticket = m._defer.round_and_band(t, m._band_params(name))
        if m._deferred(ticket is not None):
            assert ticket is not None
            m._pending.append((index, name, t.numel(), ticket))
            return True, None
        return False, None

    def torch_kernels(
        self, m: ModeHooks, t: Tensor, index: int, name: str, band: Band, where: str,
        entry: SparseRecord | None,
    ) -> Tensor:  # fmt: skip
        return m._record(t, index, name, band, None, where)

    def deferred_group(self, m: ModeHooks, ts: list[Tensor], index: int, name: str) -> bool:
        assert m._defer is not None
        tickets = m._defer.round_and_band_group(ts, m._band_params(name))
        if tickets is None:
            return False
        m._pending.extend(
            (index + i, name, t.numel(), k) for i, (t, k) in enumerate(zip(ts, tickets, strict=True))
        )
        return True


class Replay(Logged):
    """The auditor and the judge: round with the trainer's log, after the band checks."""

    name = "replay"

    def direct(self, m: ModeHooks, t: Tensor, index: int, name: str) -> bool:
        params = m._band_params(name)
        assert m._cursor is not None
        entry = m._entry = m._cursor.take(index, name, t.numel())  # LogSequenceError on mismatch
        replayed = bindings.round_with_entries(t, params, entry.positions, m.count_free)
        if replayed is None:
            return False
        m.corrections += replayed.corrections
        m.free += max(replayed.free, 0)
        return True

    def refused_entry(self, m: ModeHooks) -> SparseRecord | None:
        return m._entry  # the kernel refused the tensor; the torch path words why

    def deferred(self, m: ModeHooks, t: Tensor, index: int, name: str) -> tuple[bool, SparseRecord | None]:
        assert m._defer is not None and m._cursor is not None
        params = m._band_params(name)
        # the entries are on the device already: the record is only checked, not built
        i = m._cursor.check(index, name, t.numel())  # LogSequenceError on mismatch
        listed = m._device_positions[m._offsets[i] : m._offsets[i + 1]]
        if m._deferred(m._defer.round_with_entries(t, params, None, listed, m._fits[i])):
            return True, None
        return False, m._cursor.item(i)  # for the torch path

    def deferred_group(self, m: ModeHooks, ts: list[Tensor], index: int, name: str) -> bool:
        defer, cursor = m._defer, m._cursor
        assert defer is not None and cursor is not None
        first, end = cursor.position, cursor.position + len(ts)
        # every check that could refuse comes before the log is read: then the entries are taken
        # (a mismatch raises as it would one tensor at a time) and the launch cannot refuse
        if end > len(m._fits) or not defer.takes_group(ts, m._fits[first:end]):
            return False
        for i, t in enumerate(ts):
            cursor.check(index + i, name, t.numel())  # LogSequenceError on mismatch
        starts = m._offsets[first:end]
        counts = [b - a for a, b in zip(starts, m._offsets[first + 1 : end + 1], strict=True)]
        defer.round_with_entries_group(ts, m._band_params(name), counts, m._device_positions, starts)
        return True

    def torch_kernels(
        self, m: ModeHooks, t: Tensor, index: int, name: str, band: Band, where: str,
        entry: SparseRecord | None,
    ) -> Tensor:  # fmt: skip
        return m._replay(t, index, name, band, None, where, entry)


#: The policy of each mode name.
ROLES: dict[str, Role] = {role.name: role for role in (Record(), Replay(), Round(), Plain())}


__all__ = ["ROLES", "Logged", "ModeHooks", "Plain", "Record", "Replay", "Role", "Round"]
