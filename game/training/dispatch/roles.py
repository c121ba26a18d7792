"""What the trainer (``record``) and the auditor and judge (``replay``) do with an inexact op's tensor.

Apart from the dispatch (:mod:`~game.training.dispatch.mode`) because it is the per-role part: the
trainer rounds and logs what the task's log format asks for, the auditor rounds with the trainer's
entries after the band checks; ``round`` rounds without a log and ``plain`` leaves the tensor. The
fast paths (the C kernels on a CPU tensor, the deferred CUDA kernels) and the torch kernels of
:mod:`~game.training.numerics.bandcheck` give the same bits; a subclass may override
``_record``/``_replay`` (the log-rewriting deviations do), which keeps the C++ front off.
"""

from __future__ import annotations

import torch
from torch import Tensor

from game.training.dispatch.modestate import ModeState
from game.training.dispatch.optable import sparse_refusal
from game.training.dispatch.policies import Logged
from game.training.log.packed import StepLog
from game.training.log.sparse import SparseRecord, SparseStepLog
from game.training.native import bindings
from game.training.numerics import bandcheck, rounding
from game.training.numerics.bandfile import Band


class RoleKernels(ModeState):
    """The rounding of one inexact tensor, per role (see :class:`~game.training.dispatch.mode.RoundingMode`)."""

    def _round_exact(self, t: Tensor, name: str) -> None:
        """An exact op's float64 tensor: rounded to the grid without a log entry (on CUDA by a
        deferred kernel where the step defers); float64's largest value, a model's
        ``finfo(dtype).min`` mask, goes to the grid's largest (:func:`rounding.largest_to_grid_`)."""
        defer, g = self._defer, self._grid
        if not (
            defer is not None
            and self._may_defer()
            and self._deferred(defer.round_inplace(t, g.k0, g.max_finite))
        ):
            rounding.round_(t, self.bits, sentinel=True)
        self._rounded[name] += 1

    def _round_exact_group(self, ts: list[Tensor], name: str) -> bool:
        """A foreach op's float64 tensors, exact: rounded as :meth:`_round_exact` rounds each, in one
        deferred launch; False (nothing done) where the step does not defer them all."""
        defer, g = self._defer, self._grid
        calls = self._group_calls(len(ts)) if defer is not None else None
        if calls is None or defer is None or not defer.round_inplace_group(ts, g.k0, g.max_finite):
            return False
        self._deferred_group(calls)
        self._rounded[name] += len(ts)
        return True

    def _round_group(self, exact: bool, ts: list[Tensor], name: str) -> bool:
        """An op's float64 tensors among ``ts`` (``exact``: an exact op's) in one deferred launch a
        pass, where the step groups them (:attr:`_groups`) and there are two or more, as a foreach
        op makes; False, nothing done, where not: each tensor is then rounded on its own. The
        Python mode and the front's call both come here."""
        if not self._groups or len(ts) < 2:
            return False
        ts = [t for t in ts if t.dtype == torch.float64]
        if len(ts) < 2:
            return False
        if exact:
            return self._round_exact_group(ts, name)
        return self.role.round_inexact_group(self, ts, name)

    def _round_results(self, exact: bool, ts: list[Tensor], name: str) -> None:
        """An op's results, one rule for the Python mode and the front's call: a foreach op's in one
        deferred launch where the step groups them, else each float64 one on its own (``exact``:
        without a log). A complex128 result (an FFT's) is rounded as its float64 (real, imaginary)
        lanes, as its op's class says (a product of complex tensors is inexact:
        ``optable.COMPLEX_INEXACT``): it went unrounded, and an FFT's last bits differ from library
        to library, so another machine's ops after it computed on other values, and an honest
        trainer failed its audit."""
        if (
            self._groups  # asked first: where the step groups nothing, no scan of the tensors
            and len(ts) > 1
            and not any(t.dtype == torch.complex128 for t in ts)
            and self._round_group(exact, ts, name)
        ):
            return
        for t in ts:
            dtype = t.dtype
            if t.layout != torch.strided and (t.is_floating_point() or t.is_complex()):
                raise sparse_refusal(name, t.layout, f"step {self.step}: ")
            if dtype == torch.float64:
                (self._round_exact if exact else self._round_inexact)(t, name)
            elif dtype == torch.complex128:
                (self._round_exact if exact else self._round_inexact)(torch.view_as_real(t), name)
            elif not exact and dtype == torch.float32 and self._noise is not None:
                self._noise.perturb(t)  # a baseline's float32 (a rounding step widens it)

    def _round_inexact(self, t: Tensor, name: str) -> None:
        """An inexact op's float64 tensor: the profile's noise, then what the role does with it
        (:class:`~game.training.dispatch.policies.Role`)."""
        if self._noise is not None:
            self._noise.perturb(t)
        self.role.round_inexact(self, t, name)

    def _band_params(self, name: str) -> bindings.BandParams:
        """The kernels' integers for op ``name``'s band (worked out once a step per op)."""
        params = self._params.get(name)
        if params is None:
            band = self.bands.band(name)
            params = self._params[name] = bindings.BandParams(
                self._grid.k0, self._grid.max_finite, band.rel, band.abs
            )
        return params

    def _round_direct(self, t: Tensor, index: int, name: str) -> bool:
        """The C kernel on a contiguous CPU tensor, in place: what :meth:`_record` and
        :meth:`_replay` do through :mod:`~game.training.numerics.bandcheck` for it. False, with ``t`` untouched, when the
        kernel leaves the tensor to the torch path (rare lanes; for the auditor also an entry out
        of order, out of range or outside its band, which that path words); the auditor's entry is
        then in ``self._entry``."""
        role = self.role
        assert isinstance(role, Logged)  # the direct path is for record and replay
        if not role.direct(self, t, index, name):
            return False
        self._logged[name] += 1
        return True

    def _record(self, t: Tensor, index: int, name: str, band: Band, top: float | None, where: str) -> Tensor:
        """Trainer: round ``t`` and log what the task's format asks for (``top``: ``max |t|`` when
        scanned; ``where``: the op, for errors). The result may be ``t`` itself (``round_in_place``)."""
        if isinstance(self.log, SparseStepLog):
            r, positions = bandcheck.round_and_band(
                t, self.bits, band, top=top, in_place=self.round_in_place, where=where
            )
            if self._defer is None:
                self.log.append(index, name, t.numel(), positions)
            else:  # after the deferred records before it, in op order
                self._pending.append((index, name, t.numel(), positions))
            return r
        assert isinstance(self.log, StepLog)
        r, trits = bandcheck.round_and_trits(
            t, self.bits, self.tau, in_place=self.round_in_place, where=where
        )
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
            r, n, free = bandcheck.round_with_entries(
                t,
                self.bits,
                band,
                entry.positions,
                count_free=self.count_free,
                top=top,
                in_place=self.round_in_place,
                where=where,
                checks=self.checks,
            )
            self.free += max(free, 0)
        else:
            trits = self._cursor.take(index, name, t.numel())
            r, n = bandcheck.round_with_trits(
                t, self.bits, band, trits, in_place=self.round_in_place, where=where, checks=self.checks
            )
        self.corrections += n
        return r
