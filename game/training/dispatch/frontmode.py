"""The mode's side of the C++ dispatch front: what the front may round itself, and the calls it makes.

Apart from :mod:`~game.training.dispatch.front` (the session's calls and the op rows, shared by
every mode) because this is one step's: the kernels and bands handed to the front when the step
enters (:meth:`FrontMode._front_kernels`), the front's call for an op whose tensors it left to
Python (:meth:`FrontMode._front_op`), and its records and counters taken back when the step leaves.
A subclass that overrides a hook the front would bypass keeps those tensors on the Python path.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from game.training.dispatch import front
from game.training.dispatch.optable import OpClass, refusal, refuse_unrounded
from game.training.dispatch.roles import RoleKernels
from game.training.log.packed import StepLog
from game.training.log.sparse import SparseStepLog
from game.training.native import library
from game.training.numerics import logtrits


class FrontMode(RoleKernels):
    """The front's hand-offs (see :class:`~game.training.dispatch.mode.RoundingMode`)."""

    def _add_tallies(self) -> None:
        """Add the front's classes and counts, kept since :meth:`__exit__`, to the mode's: only a
        test or a tool reads them, and the loops over every row cost a step some 40 us."""
        left, self._tallies = self._tallies, None
        if left is None:
            return
        for row, kind in left.first_calls:  # the classes of the ops' first calls, in call order
            name = front.rows[row].name
            if name not in self._classes:
                self._classes[name] = front.CLASSES[kind]
        for counter, by_row in ((self._logged, left.logged), (self._rounded, left.rounded)):
            for row, n in enumerate(by_row):
                if n:
                    counter[front.rows[row].name] += n

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
        cls, base = type(self), FrontMode
        own = cls._front_op is base._front_op
        g = self._grid
        if self._defer is not None:  # a deferring step orders its records itself: Python takes all
            return front.Kernels(k0=g.k0, max_finite=g.max_finite)
        exact = library.address("vg_round_inplace") if own else 0
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
                return plain._replace(record=library.address("vg_round_and_band"), band_for=band)
            table, names, positions = self.log.columns()
            columns = front.SparseEntries(torch.from_numpy(table), names, torch.from_numpy(positions))
            kernel = library.address("vg_round_with_entries")
            return plain._replace(replay=kernel, count_free=self.count_free, band_for=band, entries=columns)
        if not (
            isinstance(self.log, StepLog)
            and self.role.logs
            and self._noise is None
            and self._defer is None
            and self.round_in_place
            and cls._record is base._record
            and cls._replay is base._replay
        ):
            return plain
        if self.mode == "record":
            threshold = logtrits.log_threshold(self.bits, self.tau)
            kernel = library.address("vg_round_and_trits")
            return plain._replace(trits_record=kernel, threshold=threshold, band_for=band)
        entries = [(r.op_index, r.op_name, r.count, trits) for r, trits in self.log.entries()]
        kernel = library.address("vg_round_with_trits")
        return plain._replace(trits_replay=kernel, band_for=band, entries=entries)

    def _known_bands(self) -> Tensor | None:
        """The bands of every row the front has met, worked out once a run (None where a subclass
        works bands out its own way): without them, each step's first tensor of each inexact op
        would take the GIL to ask :meth:`_front_band`."""
        cls, base = type(self), FrontMode
        if not (cls._front_band is base._front_band and cls._band_params is base._band_params):
            return None
        return front.known_bands(self.bands, self._grid.k0, self._grid.max_finite, self._band_params)

    def _front_band(self, row: int) -> tuple[int, int]:
        params = self._band_params(front.rows[row].name)
        return params.rel, params.abs

    def _front_sync(self, op_index: int, cursor: int, records: front.Records) -> None:
        """Take what the front's kernels did since it last called: their log records, in op order
        (all before the op now calling), the op index and the replay cursor (-1 from
        :func:`front.leave` when its last call here raised: the ones here are the newer then)."""
        if isinstance(records, tuple):  # a sparse record's, as columns
            assert isinstance(self.log, SparseStepLog)
            table, positions = records
            self.log.add_rows(table.numpy(), positions.numpy(), front.names)
        elif records:
            assert isinstance(self.log, StepLog)
            for index, row, _, trits in records:
                self.log.append(index, front.rows[row].name, trits)
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
        :meth:`__torch_dispatch__` rounds them (the front ran the op; a front run has no noise and
        no split-K; a deferring step's kernels take nothing, so a foreach op's tensors all come
        here, to be grouped), after the front's own work since its last call
        (:meth:`_front_sync`). Returns the op index and the replay cursor for the front to go on
        from."""
        self._front_sync(op_index, cursor, records)
        if kind == front.REFUSED:  # a call the front's class says to refuse (optable.GRADIENT_REFUSED)
            raise refusal(front.rows[row].func, f"step {self.step}: ")
        name = front.rows[row].name
        exact = kind == front.EXACT
        if not exact:  # the front hands on an inexact op's unrounded results only to be refused
            refuse_unrounded(name, tensors, f"step {self.step}: ")
        self._round_results(exact, tensors, name)
        return self.op_index, self._cursor.position if self._cursor is not None else 0
