"""Deferred checks of the CUDA kernels: one host synchronisation a step instead of one a tensor.

Apart from :mod:`cuda_kernels` (each call reads its own counters back at once) because it is the
step-wide bookkeeping: a counter row per call, one read-back when the step ends, and the failed
calls named so that the step engine runs the step again without deferral.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from game.training.native.bindings import BandParams
from game.training.numerics import cuda_groups
from game.training.numerics.cuda_kernels import (
    _LANES,
    BLOCK,
    _grid,
    _kernels,
    _launch_round_and_band,
    _launch_round_with_entries,
    _ordered_in_range,
)


class Settled(NamedTuple):
    """What a step's deferred calls came to, once read back."""

    #: Every trainer ticket's listed positions, ticket after ticket (int64, on the host; each
    #: ticket's ascending): one array, so that the log takes them as columns, not a tensor a ticket.
    listed: np.ndarray
    bounds: list[int]  # ticket ``t``'s positions are ``listed[bounds[t] : bounds[t + 1]]``
    corrections: int  # auditor calls: lanes not at their nearest, summed
    free: int  # auditor calls: lanes within 16 bands, summed (counted by the kernel either way)
    failed: tuple[int, ...] = ()  # calls (in launch order) that need the torch path; then nothing else

    def positions(self, ticket: int) -> Tensor:
        """Ticket ``ticket``'s listed positions (a view of :attr:`listed`)."""
        return torch.from_numpy(self.listed[self.bounds[ticket] : self.bounds[ticket + 1]])

    def size(self, ticket: int) -> int:
        """How many positions ticket ``ticket`` listed."""
        return self.bounds[ticket + 1] - self.bounds[ticket]


_NONE = np.zeros(0, dtype=np.int64)


#: Tensors above this many lanes are not deferred (their calls read back at once, as without
#: deferral): what deferral saves is per-tensor waiting, which small tensors are made of.
DEFER_MAX = 1 << 62


class Deferred:
    """The kernels of one step whose checks are read back once, when it ends.

    Why: the functions of :mod:`cuda_kernels` read a tensor's counters back at once (did a lane need the torch path,
    how many lanes are listed), a host synchronisation per rounded tensor; on an H100 a
    gpt-shakespeare record step made some 750 of them. Here every call gets a row of one counter
    buffer and launches its kernels without waiting; :meth:`settle` reads all rows in one
    synchronisation (and the trainer's listed positions in one more). The catch: a call that meets a
    rare lane (or, for the auditor, a bad entry) has not rounded its tensor, and the ops after it
    have used those values, so :meth:`settle` names the failed calls and the caller runs the whole
    step again with the synchronous functions, from a copy of the state taken before, which also
    words any error (:class:`game.training.engine.step.StepEngine`; it then leaves those calls undeferred
    in later steps: at the ResNet-50 shape some tensors hold values below 2**-126 every step).
    Since nothing a failed step computed is kept, an auditor's call may write its listed lanes in
    its check pass, before it knows it is refused: one launch fewer for a large tensor
    (``listed_first``).
    """

    ROWS = 512  # counter rows per buffer (a buffer is zeroed in one launch)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._kernels = _kernels()  # the switches are read once a step, not once a tensor
        self._groups = cuda_groups.kernels() if self._kernels is not None else None
        self._anywhere = os.environ.get("TRITON_INTERPRET") == "1"
        self._buffers: list[Tensor] = []
        self._free_rows: list[Tensor] = []  # views of the last buffer's unused rows, last first
        self._rows = 0
        self._tickets: list[tuple[int, Tensor]] = []  # trainer calls: (row, flags)
        self._replays: list[int] = []  # auditor calls' rows

    def _row(self) -> Tensor:
        if not self._free_rows:
            buf = torch.zeros(self.ROWS, 6, dtype=torch.int64, device=self.device)
            self._buffers.append(buf)
            self._free_rows = list(reversed(buf.unbind(0)))  # one call for every row's view
        self._rows += 1
        return self._free_rows.pop()

    def _takes(self, xf: Tensor) -> dict[str, Any] | None:
        """The kernels when ``xf`` is theirs (:func:`usable`, with this step's switches) and small
        enough to defer (:data:`DEFER_MAX`)."""
        if self._kernels is None or xf.dtype not in _LANES or not xf.is_contiguous():
            return None
        if not 0 < xf.numel() <= DEFER_MAX:
            return None
        # ``is_cuda`` rather than ``device.type``: a device object built per tensor costs a step
        # some 0.5 ms on gpt-shakespeare
        return self._kernels if self._anywhere or xf.is_cuda == self._cuda else None

    def round_and_band(self, xf: Tensor, p: BandParams) -> int | None:
        """Trainer: round ``xf`` in place and flag its listed lanes; a ticket for :meth:`settle`'s
        positions, or None (nothing launched: the tensor is not the kernels')."""
        k = self._takes(xf)
        if k is None:
            return None
        x = xf.view(torch.int64).view(-1)
        n = x.numel()
        flags = torch.empty(n, dtype=torch.int8, device=x.device)
        _launch_round_and_band(k, x, flags, p, self._row())
        self._tickets.append((self._rows - 1, flags))
        return len(self._tickets) - 1

    def round_with_entries(
        self, xf: Tensor, p: BandParams, positions: Tensor, on_device: Tensor, fit: bool | None = None
    ) -> bool:
        """Auditor: check the entries and round ``xf`` in place; False (nothing launched) when the
        tensor is not the kernels' or the entries are out of order or range (checked on the host
        copy ``positions``, unless ``fit`` says already, :func:`entries_fit`; ``on_device`` is the
        same on the tensor's device)."""
        k = self._takes(xf)
        if k is None:
            return False
        x = xf.view(torch.int64).view(-1)
        if fit is None:
            fit = positions.numel() == 0 or _ordered_in_range(positions, x.numel())
        if not fit:
            return False
        _launch_round_with_entries(k, x, on_device, p, self._row(), listed_first=True)
        self._replays.append(self._rows - 1)
        return True

    def round_inplace(self, xf: Tensor, k0: int, max_finite: int) -> bool:
        """Round ``xf`` in place to nearest; False (nothing launched) when it is not the kernels'."""
        k = self._takes(xf)
        if k is None:
            return False
        x = xf.view(torch.int64).view(-1)
        k["round_inplace"][_grid(x.numel())](x, x.numel(), k0, max_finite, self._row(), BLOCK=BLOCK)
        return True

    # ---- a group: a foreach op's tensors, one launch a pass (:mod:`cuda_groups`) ---------------

    def takes_group(self, xs: Sequence[Tensor], fits: Sequence[bool] = ()) -> bool:
        """Whether the group kernels take every tensor of ``xs`` (each as :meth:`_takes` would) and,
        for the auditor, whether every tensor's entries fit (``fits``, from :func:`entries_fit`)."""
        if self._groups is None or not all(fits):
            return False
        return all(self._takes(x) is not None for x in xs)

    def _rows_for(self, count: int) -> tuple[int, list[Tensor]]:
        first = self._rows
        return first, [self._row() for _ in range(count)]

    def round_and_band_group(self, xs: Sequence[Tensor], p: BandParams) -> list[int] | None:
        """Trainer: :meth:`round_and_band` of every tensor of ``xs`` in one launch a pass; a ticket
        per tensor, or None (nothing launched) unless :meth:`takes_group`."""
        k = self._groups
        if k is None or not self.takes_group(xs):
            return None
        sizes = [x.numel() for x in xs]
        flags = torch.empty(sum(sizes), dtype=torch.int8, device=xs[0].device).split(sizes)
        first, rows = self._rows_for(len(xs))
        cuda_groups.round_and_band(k, xs, flags, rows, p)
        tickets = list(range(len(self._tickets), len(self._tickets) + len(xs)))
        self._tickets.extend(zip(range(first, first + len(xs)), flags, strict=True))
        return tickets

    def round_with_entries_group(
        self,
        xs: Sequence[Tensor],
        p: BandParams,
        counts: Sequence[int],
        on_device: Tensor,
        starts: Sequence[int],
    ) -> None:
        """Auditor: :meth:`round_with_entries` of every tensor of ``xs`` in one launch a pass. The
        caller has checked :meth:`takes_group` with the tensors' entries (``counts[i]`` values of
        ``on_device`` from ``starts[i]``)."""
        k = self._groups
        assert k is not None
        first, rows = self._rows_for(len(xs))
        cuda_groups.round_with_entries(k, xs, counts, on_device, starts, rows, p)
        self._replays.extend(range(first, first + len(xs)))

    def round_inplace_group(self, xs: Sequence[Tensor], k0: int, max_finite: int) -> bool:
        """:meth:`round_inplace` of every tensor of ``xs`` in one launch; False (nothing launched)
        unless :meth:`takes_group`."""
        k = self._groups
        if k is None or not self.takes_group(xs):
            return False
        _, rows = self._rows_for(len(xs))
        cuda_groups.round_inplace(k, xs, rows, k0, max_finite)
        return True

    def settle(self) -> Settled:
        """Read every call's counters back (one synchronisation). When a call needed the torch path
        (a rare lane, a bad entry), only ``failed`` is filled: the step must run again without
        deferral."""
        if not self._rows:
            return Settled(_NONE, [0], 0, 0)
        stats = torch.cat(self._buffers)[: self._rows].cpu()
        bad = stats[:, 1:4].any(dim=1)
        if bool(bad.any()):
            return Settled(_NONE, [0], 0, 0, tuple(bad.nonzero().squeeze(1).tolist()))
        listed = stats[:, 4]
        replays = torch.tensor(self._replays, dtype=torch.int64)
        corrections = int(listed[replays].sum()) if self._replays else 0
        free = int(stats[replays, 5].sum()) if self._replays else 0
        counts = listed.tolist()  # one conversion, not one ``int`` of a tensor element a ticket
        some = [flags for row, flags in self._tickets if counts[row]]
        if not some:
            return Settled(_NONE, [0] * (len(self._tickets) + 1), corrections, free)
        lanes, sizes = listed_lanes(some)
        flat, per = host_array(lanes), iter(sizes.tolist())
        bounds = [0]
        for row, _ in self._tickets:
            bounds.append(bounds[-1] + (next(per) if counts[row] else 0))
        return Settled(flat, bounds, corrections, free)


def listed_lanes(flags: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """The read-back's work on the device: the listed lanes of every ``flags`` (int8, those of the
    calls that listed some) in one ``nonzero``, each made relative to its own flags, and how many
    each has. At the GPT-2-small shape that is 6.5-16 million lanes a step: done here, the host
    gets them in one copy, ready to log, where it took 8 ms on the 2-core machine to subtract each
    call's offset. (A ``bincount`` of the lanes' calls would count them too, but with atomics that
    torch's deterministic mode refuses on CUDA.)"""
    numels = torch.tensor([f.numel() for f in flags], dtype=torch.int64, device=flags[0].device)
    ends = numels.cumsum(0)
    lanes = torch.cat(list(flags)).nonzero().squeeze(1)
    before_end = torch.searchsorted(lanes, ends)  # lanes before each call's flags end
    owner = torch.searchsorted(ends, lanes, right=True)  # the call each lane is in
    lanes -= (ends - numels)[owner]
    return lanes, torch.diff(before_end, prepend=before_end.new_zeros(1))


def host_array(t: Tensor) -> np.ndarray:
    """``t`` on the host, as a numpy array: a GPU tensor by way of page-locked memory, which the
    copy fills at the link's speed, where a copy to pageable memory is staged by the driver
    through a buffer of its own (at the GPT-2-small shape a trainer step reads back 52-127 MB of
    listed positions). The array holds its tensor, so the page-locked block lives as long as it."""
    if not t.is_cuda:
        return t.cpu().numpy()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)
    return host.numpy()


def entries_fit(positions: Sequence[Tensor], counts: Sequence[int]) -> list[bool]:
    """For each auditor entry list (host, int64), whether the kernels may take it: none, or strictly
    ascending within ``[0, count)`` (else the torch path words the error). What
    :func:`~game.training.numerics.cuda_kernels._ordered_in_range` says of each, for a whole chunk in
    a few vectorised passes: asked a tensor at a time, it was the auditor's largest own cost on the
    host (some 15 us a tensor). In numpy, one thread: torch's CPU ops would start a parallel region
    for a chunk of some 10^5 entries, which waits for every core."""
    n = len(positions)
    fit = np.ones(n, dtype=bool)
    sizes = np.fromiter((p.numel() for p in positions), dtype=np.int64, count=n)
    if not sizes.sum():
        return fit.tolist()
    flat = np.concatenate([p.numpy() for p in positions]).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(n), sizes)
    limit = np.asarray(counts, dtype=np.int64)[owner]
    fit[owner[(flat < 0) | (flat >= limit)]] = False
    same = owner[1:] == owner[:-1]  # neighbouring entries of one list
    fit[owner[1:][same & (flat[1:] <= flat[:-1])]] = False
    return fit.tolist()


__all__ = ["DEFER_MAX", "Deferred", "Settled", "entries_fit", "host_array", "listed_lanes"]
