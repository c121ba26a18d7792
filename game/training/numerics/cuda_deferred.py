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
_ROW = 6  # int64 counters a call's row holds
_ROW_BYTES = 8 * _ROW


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
    Since nothing a failed step computed is kept, an auditor's call may check its entries, round
    and write its listed lanes in one pass, before it knows it is refused: two launches for a large
    tensor, not four (``listed_first``).
    """

    ROWS = 512  # counter rows per buffer (a buffer is zeroed in one launch)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._kernels = _kernels()  # the switches are read once a step, not once a tensor
        self._groups = cuda_groups.kernels() if self._kernels is not None else None
        self._anywhere = os.environ.get("TRITON_INTERPRET") == "1"
        self._buffers: list[Tensor] = []
        self._views: tuple[Tensor, ...] | None = None  # the last buffer's rows, once a call asks for one
        self._left = 0  # rows of the last buffer not handed out
        self._rows = 0  # rows handed out, every buffer's: row i is the i-th call's
        self._pieces: list[Tensor] = []  # the trainer calls' flags: one a call, or one a group's calls
        self._tickets: list[tuple[int, int, int]] = []  # trainer calls: (row, piece, lanes)
        self._replays: list[int] = []  # auditor calls' rows

    def _buffer(self) -> Tensor:
        """A new counter buffer, zeroed in one launch, once the last one's rows are all handed out."""
        buf = torch.zeros(self.ROWS, _ROW, dtype=torch.int64, device=self.device)
        self._buffers.append(buf)
        self._views, self._left = None, self.ROWS
        return buf

    def _row(self) -> Tensor:
        """The next counter row, for a call of one tensor."""
        buf = self._buffers[-1] if self._left else self._buffer()
        if self._views is None:
            self._views = buf.unbind(0)  # one call for every row's view
        row = self._views[self.ROWS - self._left]
        self._left -= 1
        self._rows += 1
        return row

    def _block(self, count: int) -> tuple[int, list[int]]:
        """The next ``count`` counter rows, for a group: the first's index and every row's address.
        Addresses, not views: a group's table holds only those, and a view a row cost a group of
        148 tensors some 100 us of the host's time. Row ``i`` is the ``i``-th call's, so a group
        may go on into a new buffer (:meth:`settle` names failed calls by their rows)."""
        first, addresses = self._rows, list[int]()
        while count:
            buf = self._buffers[-1] if self._left else self._buffer()
            take = min(count, self._left)
            at = buf.data_ptr() + _ROW_BYTES * (self.ROWS - self._left)
            addresses += range(at, at + _ROW_BYTES * take, _ROW_BYTES)
            self._left -= take
            self._rows += take
            count -= take
        return first, addresses

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
        n = xf.numel()
        flags = torch.empty(n, dtype=torch.int8, device=xf.device)
        _launch_round_and_band(k, xf, flags, p, self._row())
        self._tickets.append((self._rows - 1, len(self._pieces), n))
        self._pieces.append(flags)
        return len(self._tickets) - 1

    def round_with_entries(
        self, xf: Tensor, p: BandParams, positions: Tensor | None, on_device: Tensor, fit: bool | None = None
    ) -> bool:
        """Auditor: check the entries and round ``xf`` in place; False (nothing launched) when the
        tensor is not the kernels' or the entries are out of order or range (checked on the host
        copy ``positions``, unless ``fit`` says already, :func:`entries_fit`, when ``positions`` may
        be None; ``on_device`` is the same on the tensor's device)."""
        k = self._takes(xf)
        if k is None:
            return False
        if fit is None:
            assert positions is not None, "the host copy of the entries, or their fit"
            fit = positions.numel() == 0 or _ordered_in_range(positions, xf.numel())
        if not fit:
            return False
        _launch_round_with_entries(k, xf, on_device, p, self._row(), listed_first=True)
        self._replays.append(self._rows - 1)
        return True

    def round_inplace(self, xf: Tensor, k0: int, max_finite: int) -> bool:
        """Round ``xf`` in place to nearest; False (nothing launched) when it is not the kernels'."""
        k = self._takes(xf)
        if k is None:
            return False
        n = xf.numel()
        k["round_inplace"][_grid(n)](xf, n, k0, max_finite, self._row(), BLOCK=BLOCK)
        return True

    # ---- a group: a foreach op's tensors, one launch a pass (:mod:`cuda_groups`) ---------------

    def takes_group(self, xs: Sequence[Tensor], fits: Sequence[bool] = ()) -> bool:
        """Whether the group kernels take every tensor of ``xs`` (each as :meth:`_takes` would) and,
        for the auditor, whether every tensor's entries fit (``fits``, from :func:`entries_fit`)."""
        return self._group_sizes(xs, fits) is not None

    def _group_sizes(self, xs: Sequence[Tensor], fits: Sequence[bool] = ()) -> list[int] | None:
        """Each tensor's lanes where :meth:`takes_group`, else None."""
        if self._groups is None or not all(fits):
            return None
        sizes = []
        for x in xs:
            if self._takes(x) is None:
                return None
            sizes.append(x.numel())
        return sizes

    def round_and_band_group(self, xs: Sequence[Tensor], p: BandParams) -> list[int] | None:
        """Trainer: :meth:`round_and_band` of every tensor of ``xs`` in one launch a pass; a ticket
        per tensor, or None (nothing launched) unless :meth:`takes_group`. The tensors' flags are
        one piece, read back whole."""
        k, sizes = self._groups, self._group_sizes(xs)
        if k is None or sizes is None:
            return None
        flags = torch.empty(sum(sizes), dtype=torch.int8, device=xs[0].device)
        first, stats = self._block(len(xs))
        cuda_groups.round_and_band(k, xs, sizes, flags, stats, p)
        piece, start = len(self._pieces), len(self._tickets)
        self._pieces.append(flags)
        self._tickets.extend((first + i, piece, n) for i, n in enumerate(sizes))
        return list(range(start, start + len(xs)))

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
        first, stats = self._block(len(xs))
        cuda_groups.round_with_entries(k, xs, counts, on_device, starts, stats, p)
        self._replays.extend(range(first, first + len(xs)))

    def round_inplace_group(self, xs: Sequence[Tensor], k0: int, max_finite: int) -> bool:
        """:meth:`round_inplace` of every tensor of ``xs`` in one launch; False (nothing launched)
        unless :meth:`takes_group`."""
        k, sizes = self._groups, self._group_sizes(xs)
        if k is None or sizes is None:
            return False
        cuda_groups.round_inplace(k, xs, sizes, self._block(len(xs))[1], k0, max_finite)
        return True

    def listed_pieces(self, counts: Sequence[int]) -> tuple[list[Tensor], list[int], list[bool]]:
        """What the read-back joins, given every row's listed count: the pieces of flags that hold
        listed lanes (a call's own, or a group's whole: its calls that list none add none), each
        call's lanes within them in order, and which pieces those are."""
        took = [False] * len(self._pieces)
        for row, piece, _ in self._tickets:
            if counts[row]:
                took[piece] = True
        pieces = [flags for flags, t in zip(self._pieces, took, strict=True) if t]
        return pieces, [n for _, piece, n in self._tickets if took[piece]], took

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
        pieces, lanes_of, took = self.listed_pieces(counts)
        if not pieces:
            return Settled(_NONE, [0] * (len(self._tickets) + 1), corrections, free)
        lanes, sizes = listed_lanes(pieces, lanes_of)
        flat, per = host_array(lanes), iter(sizes.tolist())
        bounds = [0]
        for _, piece, _ in self._tickets:
            bounds.append(bounds[-1] + (next(per) if took[piece] else 0))
        return Settled(flat, bounds, corrections, free)


def listed_lanes(flags: Sequence[Tensor], lanes_of: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
    """The read-back's work on the device: the listed lanes of calls' flags (int8) in one
    ``nonzero``, each made relative to its own call's flags, and how many each call has. ``flags``
    are pieces that hold the calls' flags one after another (a group's calls share one piece),
    ``lanes_of`` each call's lanes (by default a call a piece). At the GPT-2-small shape that is
    6.5-16 million lanes a step: done here, the host gets them in one copy, ready to log, where it
    took 8 ms on the 2-core machine to subtract each call's offset. (A ``bincount`` of the lanes'
    calls would count them too, but with atomics that torch's deterministic mode refuses on CUDA.)"""
    sizes = [f.numel() for f in flags] if lanes_of is None else lanes_of
    numels = torch.tensor(sizes, dtype=torch.int64, device=flags[0].device)
    ends = numels.cumsum(0)
    lanes = (flags[0] if len(flags) == 1 else torch.cat(list(flags))).nonzero().squeeze(1)
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
