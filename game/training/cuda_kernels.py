"""The sparse log's fused kernels for CUDA tensors, in Triton: what ``native/kernels.c`` does on CPU.

On a GPU the torch kernels of :mod:`game.training.banding` cost some 30 launches and several host
synchronisations per rounded tensor; measured on an H100, a gpt-shakespeare trainer step took 304
ms against 26 ms of plain float64 training. These kernels do a tensor in two to five launches and
one synchronisation (two when the trainer lists values). They compute bit for bit what the C kernels compute (integer arithmetic on
the int64 patterns of float64 values, the same formulas, see the C file's header) and, like them,
handle the common lanes only: when a tensor holds a rare lane (the float32-subnormal range, past the
grid's range, inf, NaN) they write nothing and return None or False, and the caller takes the torch
path, which words any error.

Triton comes with torch's CUDA builds; without it (or with ``VGAME_NATIVE=0``) the torch kernels
run. Tests run these kernels on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, which
Triton reads when this module is first imported; :mod:`game.training.banding` imports it only for
a CUDA tensor).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, NamedTuple

import torch
from torch import Tensor

from game.training.native import BandParams, Replay

log = logging.getLogger(__name__)

#: Lanes per Triton program.
BLOCK = 1024


try:  # Triton comes with torch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the torch kernels run
    triton = None

if triton is not None:

    @triton.jit
    def _band_of(a, zero, k0, rel_units, floor_base):
        # kernels.c band_of: min(cap >> clamp(k0 - 3 - shift, 0, 63) + rel_units, cap)
        cap = ((zero + 1) << k0) >> 3
        count = (zero + k0 - 3) - ((zero + floor_base) - (a >> 52))
        count = tl.minimum(tl.maximum(count, 0), 63)
        return tl.minimum((cap >> count) + rel_units, cap)

    @triton.jit
    def _scan_kernel(x_ptr, n, max_finite, stats_ptr, BLOCK: tl.constexpr):
        # Read-only: the largest magnitude's pattern and whether any lane is rare (atomics).
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        a = v & 0x7FFFFFFFFFFFFFFF
        rare = ((a != 0) & (a < ((1023 - 126) << 52))) | (a > max_finite)
        tl.atomic_max(stats_ptr, tl.max(a, axis=0))
        tl.atomic_max(stats_ptr + 1, tl.max(rare.to(tl.int64), axis=0))

    @triton.jit
    def _round_and_band_kernel(x_ptr, flag_ptr, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # Trainer, in place unless the scan found a rare lane: round to nearest (ties to even) and
        # flag the lanes within 4 bands of a midpoint that went to the odd neighbour.
        if tl.load(stats_ptr + 1) != 0:
            return
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        zero = tl.zeros([BLOCK], tl.int64)
        step = (zero + 1) << k0
        half = step >> 1
        top = tl.maximum(tl.load(stats_ptr) >> 52, 1023 - 126)
        rel_units = tl.where(rel + 52 >= 0, (zero + 1) << tl.maximum(zero + rel + 52, 0), 0)
        low = v & (step - 1)
        r = (v + (half - 1) + ((v >> k0) & 1)) & -step
        d = tl.abs(low - half)
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, zero, k0, rel_units, 52 + abs_ + top)
        listed = ((r & step) != 0) & (low != 0) & (d <= (band << 2))
        tl.store(x_ptr + offs, r, mask=m)
        tl.store(flag_ptr + offs, listed.to(tl.int8), mask=m)
        tl.atomic_add(stats_ptr + 4, tl.sum((m & listed).to(tl.int64), axis=0))

    @triton.jit
    def _check_entries_kernel(
        x_ptr, pos_ptr, npos, k0, rel, abs_, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr
    ):
        # Auditor, read-only: each listed lane within 16 bands and not zero (else the first bad
        # entry's index and the zero flag), its nearest and odd neighbours kept for the last pass.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < npos
        p = tl.load(pos_ptr + offs, mask=m, other=0)
        v = tl.load(x_ptr + p, mask=m, other=0)
        zero = tl.zeros([BLOCK], tl.int64)
        step = (zero + 1) << k0
        half = step >> 1
        top = tl.maximum(tl.load(stats_ptr) >> 52, 1023 - 126)
        rel_units = tl.where(rel + 52 >= 0, (zero + 1) << tl.maximum(zero + rel + 52, 0), 0)
        a = v & 0x7FFFFFFFFFFFFFFF
        d = tl.abs((v & (step - 1)) - half)
        band = _band_of(a, zero, k0, rel_units, 52 + abs_ + top)
        outside = m & (d > (band << 4))
        # the first entry outside, as npos - j (0: none), so that a zeroed buffer starts the maximum
        tl.atomic_max(stats_ptr + 2, tl.max(tl.where(outside, npos - offs.to(tl.int64), 0), axis=0))
        tl.atomic_max(stats_ptr + 3, tl.max((m & (a == 0)).to(tl.int64), axis=0))
        lo = v - (v & (step - 1))
        odd = tl.where((lo & step) != 0, lo, lo + step)
        tl.store(near_ptr + offs, (v + (half - 1) + ((v >> k0) & 1)) & -step, mask=m)
        tl.store(odd_ptr + offs, odd, mask=m)

    @triton.jit
    def _round_with_band_kernel(x_ptr, n, npos, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # Auditor, in place when the checks passed: within one band -> even neighbour, else nearest;
        # counts the lanes not at their nearest and the lanes within 16 bands.
        if (tl.load(stats_ptr + 1) != 0) | (tl.load(stats_ptr + 2) != 0) | (tl.load(stats_ptr + 3) != 0):
            return
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        zero = tl.zeros([BLOCK], tl.int64)
        step = (zero + 1) << k0
        half = step >> 1
        top = tl.maximum(tl.load(stats_ptr) >> 52, 1023 - 126)
        rel_units = tl.where(rel + 52 >= 0, (zero + 1) << tl.maximum(zero + rel + 52, 0), 0)
        low = v & (step - 1)
        off = low != 0
        d = tl.abs(low - half)
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, zero, k0, rel_units, 52 + abs_ + top)
        r = (v + (half - 1) + ((v >> k0) & 1)) & -step
        lo = v - low
        even = tl.where((lo & step) != 0, lo + step, lo)
        out = tl.where(off & (d <= band), even, r)
        tl.store(x_ptr + offs, out, mask=m)
        tl.atomic_add(stats_ptr + 4, tl.sum((m & (out != r)).to(tl.int64), axis=0))
        tl.atomic_add(stats_ptr + 5, tl.sum((m & off & (d <= (band << 4))).to(tl.int64), axis=0))

    @triton.jit
    def _write_listed_kernel(x_ptr, pos_ptr, npos, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr):
        # Auditor, last: the listed lanes go to their odd neighbour; the corrections follow.
        if (tl.load(stats_ptr + 1) != 0) | (tl.load(stats_ptr + 2) != 0) | (tl.load(stats_ptr + 3) != 0):
            return
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < npos
        p = tl.load(pos_ptr + offs, mask=m, other=0)
        near = tl.load(near_ptr + offs, mask=m, other=0)
        odd = tl.load(odd_ptr + offs, mask=m, other=0)
        now = tl.load(x_ptr + p, mask=m, other=0)
        delta = (odd != near).to(tl.int64) - (now != near).to(tl.int64)
        tl.atomic_add(stats_ptr + 4, tl.sum(tl.where(m, delta, 0), axis=0))
        tl.store(x_ptr + p, odd, mask=m)

    @triton.jit
    def _round_inplace_kernel(x_ptr, n, k0, max_finite, stats_ptr, BLOCK: tl.constexpr):
        # Round the common lanes to nearest (ties to even) and flag a rare one: rounding again
        # leaves a rounded lane as it is, so the torch path may then redo the whole tensor.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        a = v & 0x7FFFFFFFFFFFFFFF
        rare = m & (((a != 0) & (a < ((1023 - 126) << 52))) | (a > max_finite))
        zero = tl.zeros([BLOCK], tl.int64)
        step = (zero + 1) << k0
        half = step >> 1
        r = (v + (half - 1) + ((v >> k0) & 1)) & -step
        tl.store(x_ptr + offs, r, mask=m & ~rare)
        tl.atomic_max(stats_ptr + 1, tl.max(rare.to(tl.int64), axis=0))


_KERNELS: dict[str, Any] = (
    {}
    if triton is None
    else {
        "scan": _scan_kernel,
        "round_and_band": _round_and_band_kernel,
        "check_entries": _check_entries_kernel,
        "round_with_band": _round_with_band_kernel,
        "write_listed": _write_listed_kernel,
        "round_inplace": _round_inplace_kernel,
    }
)


def _kernels() -> dict[str, Any] | None:
    """The kernels (compiled on first launch), or None without Triton or with ``VGAME_NATIVE=0``."""
    if triton is None or os.environ.get("VGAME_NATIVE", "1") == "0":
        return None
    return _KERNELS


def available() -> bool:
    """Whether the Triton kernels can run (Triton importable, not switched off)."""
    return _kernels() is not None


def usable(x: Tensor) -> bool:
    """Whether a tensor is theirs: float64 (or its int64 view), contiguous, not empty, on a CUDA
    device Triton supports, or anywhere while Triton's interpreter runs (tests)."""
    if x.dtype not in (torch.float64, torch.int64) or not x.is_contiguous() or x.numel() == 0:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return available()
    return x.is_cuda and available() and _supported(x.device.index or 0)


def runs_on(device: torch.device) -> bool:
    """Whether the kernels run on this device: a CUDA device Triton supports, or any device while
    Triton's interpreter runs (tests)."""
    if not available():
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda" and _supported(device.index or 0)


@functools.cache
def _supported(index: int) -> bool:
    """Whether Triton compiles for this GPU: NVIDIA from compute capability 7.0 on (the bound torch's
    own compiler checks), and AMD (torch's ROCm builds, where ``is_cuda`` holds too). Older cards
    keep the torch kernels."""
    if torch.version.hip is not None:
        return True
    ok = torch.cuda.get_device_capability(index) >= (7, 0)
    if not ok:
        log.info("cuda:%d is older than compute capability 7.0: the torch rounding kernels run", index)
    return ok


def _grid(n: int) -> tuple[int]:
    return ((n + BLOCK - 1) // BLOCK,)


def _stats(x: Tensor) -> Tensor:
    """A call's counters, read back in one synchronisation: [0] the largest magnitude's pattern,
    [1] a rare lane seen, [2] the auditor's first entry outside its band (as ``npos - j``; 0: none),
    [3] a listed zero, [4] the auditor's corrections or the trainer's listed lanes, [5] free lanes."""
    return torch.zeros(6, dtype=torch.int64, device=x.device)


def round_and_band(xf: Tensor, p: BandParams) -> Tensor | None:
    """Trainer kernel, **in place** on a contiguous float64 tensor (or its int64 view): rounds it and
    returns the flat positions (int64, ascending, on its device); None, with ``xf`` untouched, when
    the torch kernel must do it (rare lanes)."""
    k = _kernels()
    if k is None or not usable(xf):
        return None
    x = xf.view(torch.int64).view(-1)
    n = x.numel()
    stats = _stats(x)
    flags = torch.empty(n, dtype=torch.int8, device=x.device)
    k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
    k["round_and_band"][_grid(n)](x, flags, n, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)
    _top, bad, _, _, listed, _ = stats.tolist()  # one synchronisation for both
    if bad:
        return None
    if listed == 0:  # most tensors: no nonzero (two more launches and a synchronisation)
        return torch.empty(0, dtype=torch.int64, device=x.device)
    return flags.nonzero().squeeze(1)


def round_with_entries(xf: Tensor, p: BandParams, positions: Tensor, count_free: bool) -> Replay | None:
    """Auditor kernel, **in place** on a contiguous float64 tensor (or its int64 view), with the
    trainer's flat positions: ``(corrections, free)``; None, with ``xf`` untouched, when the torch
    kernel must do it (rare lanes, a listed zero, positions out of order or out of range, or an entry
    outside the band: the torch kernel words the error)."""
    k = _kernels()
    if k is None or not usable(xf):
        return None
    x = xf.view(torch.int64).view(-1)
    n, npos = x.numel(), positions.numel()
    if npos and not _ordered_in_range(positions.cpu(), n):  # on the host, where the log was decoded
        return None
    pos = positions.to(device=x.device, dtype=torch.int64).contiguous()
    stats = _stats(x)
    k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
    near = torch.empty(npos, dtype=torch.int64, device=x.device)  # the listed lanes' neighbours,
    odd = torch.empty_like(near)  # taken before the round pass overwrites them
    if npos:
        k["check_entries"][_grid(npos)](x, pos, npos, p.k0, p.rel, p.abs, near, odd, stats, BLOCK=BLOCK)
    k["round_with_band"][_grid(n)](x, n, npos, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)
    if npos:
        k["write_listed"][_grid(npos)](x, pos, npos, near, odd, stats, BLOCK=BLOCK)
    _top, bad, outside, listed_zero, corrections, free = stats.tolist()
    if bad or outside or listed_zero:
        return None
    return Replay(corrections, free if count_free else -1)


def round_inplace(xf: Tensor, k0: int, max_finite: int) -> bool:
    """Round a contiguous float64 tensor (or its int64 view) in place, nearest, ties to even; False:
    use the torch kernel (then some lanes may be rounded already, which rounding again leaves as they
    are)."""
    k = _kernels()
    if k is None or not usable(xf):
        return False
    x = xf.view(torch.int64).view(-1)
    stats = _stats(x)
    k["round_inplace"][_grid(x.numel())](x, x.numel(), k0, max_finite, stats, BLOCK=BLOCK)
    return int(stats[1]) == 0


# --------------------------------------------------------------------------------------------------
# Deferred checks: one synchronisation a step instead of one a tensor
# --------------------------------------------------------------------------------------------------


class Settled(NamedTuple):
    """What a step's deferred calls came to, once read back."""

    positions: list[Tensor]  # per trainer ticket: its listed positions (int64, ascending, on the host)
    corrections: int  # auditor calls: lanes not at their nearest, summed
    free: int  # auditor calls: lanes within 16 bands, summed (counted by the kernel either way)


class Deferred:
    """The kernels of one step whose checks are read back once, when it ends.

    Why: the functions above read a tensor's counters back at once (did a lane need the torch path,
    how many lanes are listed), a host synchronisation per rounded tensor; on an H100 a
    gpt-shakespeare record step made some 750 of them. Here every call gets a row of one counter
    buffer and launches its kernels without waiting; :meth:`settle` reads all rows in one
    synchronisation (and the trainer's listed positions in one more). The catch: a call that meets a
    rare lane (or, for the auditor, a bad entry) has written nothing, and the ops after it have used
    its unrounded values, so :meth:`settle` returns None and the caller runs the whole step again
    with the synchronous functions, from a copy of the state taken before (see
    :class:`game.training.step.StepEngine`), which also words any error. In honest training that
    never happens: rare lanes are values below 2**-126 or non-finite ones.
    """

    ROWS = 512  # counter rows per buffer (a buffer is zeroed in one launch)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[Tensor] = []
        self._rows = 0
        self._tickets: list[tuple[int, Tensor]] = []  # trainer calls: (row, flags)
        self._replays: list[int] = []  # auditor calls' rows

    def _row(self) -> Tensor:
        i = self._rows % self.ROWS
        if i == 0:
            self._buffers.append(torch.zeros(self.ROWS, 6, dtype=torch.int64, device=self.device))
        self._rows += 1
        return self._buffers[-1][i]

    def round_and_band(self, xf: Tensor, p: BandParams) -> int | None:
        """Trainer: round ``xf`` in place and flag its listed lanes; a ticket for :meth:`settle`'s
        positions, or None (nothing launched: the tensor is not the kernels')."""
        k = _kernels()
        if k is None or not usable(xf):
            return None
        x = xf.view(torch.int64).view(-1)
        n = x.numel()
        row = self._row()
        flags = torch.empty(n, dtype=torch.int8, device=x.device)
        k["scan"][_grid(n)](x, n, p.max_finite, row, BLOCK=BLOCK)
        k["round_and_band"][_grid(n)](x, flags, n, p.k0, p.rel, p.abs, row, BLOCK=BLOCK)
        self._tickets.append((self._rows - 1, flags))
        return len(self._tickets) - 1

    def round_with_entries(self, xf: Tensor, p: BandParams, positions: Tensor, on_device: Tensor) -> bool:
        """Auditor: check the entries and round ``xf`` in place; False (nothing launched) when the
        tensor is not the kernels' or the entries are out of order or range (checked on the host
        copy ``positions``; ``on_device`` is the same on the tensor's device)."""
        k = _kernels()
        if k is None or not usable(xf):
            return False
        x = xf.view(torch.int64).view(-1)
        n, npos = x.numel(), positions.numel()
        if npos and not _ordered_in_range(positions, n):
            return False
        row = self._row()
        k["scan"][_grid(n)](x, n, p.max_finite, row, BLOCK=BLOCK)
        near = odd = on_device
        if npos:
            near = torch.empty(npos, dtype=torch.int64, device=x.device)
            odd = torch.empty_like(near)
            k["check_entries"][_grid(npos)](
                x, on_device, npos, p.k0, p.rel, p.abs, near, odd, row, BLOCK=BLOCK
            )
        k["round_with_band"][_grid(n)](x, n, npos, p.k0, p.rel, p.abs, row, BLOCK=BLOCK)
        if npos:
            k["write_listed"][_grid(npos)](x, on_device, npos, near, odd, row, BLOCK=BLOCK)
        self._replays.append(self._rows - 1)
        return True

    def round_inplace(self, xf: Tensor, k0: int, max_finite: int) -> bool:
        """Round ``xf`` in place to nearest; False (nothing launched) when it is not the kernels'."""
        k = _kernels()
        if k is None or not usable(xf):
            return False
        x = xf.view(torch.int64).view(-1)
        k["round_inplace"][_grid(x.numel())](x, x.numel(), k0, max_finite, self._row(), BLOCK=BLOCK)
        return True

    def settle(self) -> Settled | None:
        """Read every call's counters back (one synchronisation); None when a call needs the torch
        path (a rare lane, a bad entry): the step must run again without deferral."""
        if not self._rows:
            return Settled([], 0, 0)
        stats = torch.cat(self._buffers)[: self._rows].cpu()
        if bool(stats[:, 1:4].any()):
            return None
        listed = stats[:, 4]
        replays = torch.tensor(self._replays, dtype=torch.int64)
        corrections = int(listed[replays].sum()) if self._replays else 0
        free = int(stats[replays, 5].sum()) if self._replays else 0
        none = torch.empty(0, dtype=torch.int64)
        positions = [none] * len(self._tickets)
        some = [(t, flags) for t, (row, flags) in enumerate(self._tickets) if int(listed[row])]
        if some:  # every listed lane of the step in one nonzero, then split per ticket on the host
            flat = torch.cat([flags for _, flags in some]).nonzero().squeeze(1).cpu()
            sizes = torch.tensor([0] + [flags.numel() for _, flags in some]).cumsum(0)
            ends = torch.searchsorted(flat, sizes[1:])
            start = 0
            for (t, _), end, offset in zip(some, ends.tolist(), sizes[:-1].tolist(), strict=True):
                positions[t] = flat[start:end] - offset
                start = end
        return Settled(positions, corrections, free)


def _ordered_in_range(positions: Tensor, n: int) -> bool:
    """Host positions strictly ascending and within ``[0, n)``."""
    return not (
        int(positions[0]) < 0
        or int(positions[-1]) >= n
        or (positions.numel() > 1 and not bool((positions[1:] > positions[:-1]).all()))
    )


__all__ = [
    "BLOCK",
    "Deferred",
    "Settled",
    "available",
    "round_and_band",
    "round_inplace",
    "round_with_entries",
    "runs_on",
    "usable",
]
