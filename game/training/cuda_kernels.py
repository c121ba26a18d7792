"""The sparse log's fused kernels for CUDA tensors, in Triton: what ``native/kernels.c`` does on CPU.

On a GPU the torch kernels of :mod:`game.training.banding` cost some 30 launches and several host
synchronisations per rounded tensor; measured on an H100, a gpt-shakespeare trainer step took 304
ms against 26 ms of plain float64 training. These kernels do a small tensor in one launch and a
large one in two to four, and :class:`Deferred` reads a whole step's checks back in one
synchronisation (the functions below read each call's back at once). They compute bit for bit what
the C kernels compute (integer arithmetic on the int64 patterns of float64 values, the same
formulas, see the C file's header) and, like them, handle the common lanes only: when a tensor
holds a rare lane (the float32-subnormal range, past the grid's range, inf, NaN) they write nothing
and say so, and the caller takes the torch path, which words any error.

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
#: The kernels read and write 8-byte lanes: float64 values (as their bit patterns) or int64 views.
_LANES = (torch.float64, torch.int64)


try:  # Triton comes with torch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the torch kernels run
    triton = None

if triton is not None:
    # Each pass over a block of lanes is a helper, so that the kernels below (one program per block
    # for large tensors, one program for a whole small tensor) share every formula.

    @triton.jit
    def _band_of(a, k0, rel, floor_base):
        # kernels.c band_of: min(cap >> clamp(k0 - 3 - shift, 0, 63) + rel_units, cap), with
        # rel_units = 2^(52 + rel) (0 below 2^0) and shift = floor_base - exponent(a)
        zero = tl.zeros_like(a)
        rel_units = tl.where(rel + 52 >= 0, (zero + 1) << tl.maximum(zero + rel + 52, 0), 0)
        cap = ((zero + 1) << k0) >> 3
        count = (zero + k0 - 3) - ((zero + floor_base) - (a >> 52))
        count = tl.minimum(tl.maximum(count, 0), 63)
        return tl.minimum((cap >> count) + rel_units, cap)

    @triton.jit
    def _nearest(v, k0):
        # round half to even on the signed pattern (kernels.c nearest)
        half = ((tl.zeros_like(v) + 1) << k0) >> 1
        return (v + (half - 1) + ((v >> k0) & 1)) & -(half << 1)

    @triton.jit
    def _rare(v, max_finite):
        # 1 where a lane needs the torch path: the float32-subnormal range, past the range, inf, NaN
        a = v & 0x7FFFFFFFFFFFFFFF
        return (((a != 0) & (a < ((1023 - 126) << 52))) | (a > max_finite)).to(tl.int64)

    @triton.jit
    def _scan_block(x_ptr, offs, n, max_finite):
        # the lanes' magnitudes (0 outside the tensor) and whether each is rare
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        return v & 0x7FFFFFFFFFFFFFFF, _rare(v, max_finite)

    @triton.jit
    def _round_band_block(x_ptr, flag_ptr, offs, n, k0, rel, abs_, top):
        # trainer: round to nearest in place, flag the lanes within 4 bands of a midpoint that went
        # to the odd neighbour; returns the flags (0 outside the tensor)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        step = (tl.zeros_like(v) + 1) << k0
        low = v & (step - 1)
        r = _nearest(v, k0)
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, k0, rel, 52 + abs_ + top)
        listed = m & ((r & step) != 0) & (low != 0) & (tl.abs(low - (step >> 1)) <= (band << 2))
        tl.store(x_ptr + offs, r, mask=m)
        tl.store(flag_ptr + offs, listed.to(tl.int8), mask=m)
        return listed.to(tl.int64)

    @triton.jit
    def _check_entries_block(x_ptr, pos_ptr, j, npos, k0, rel, abs_, top, near_ptr, odd_ptr):
        # auditor, read-only: for entries j, (npos - j where outside 16 bands, else 0) and whether
        # the lane is zero; their nearest and odd neighbours kept for the last pass
        m = j < npos
        p = tl.load(pos_ptr + j, mask=m, other=0)
        v = tl.load(x_ptr + p, mask=m, other=0)
        step = (tl.zeros_like(v) + 1) << k0
        a = v & 0x7FFFFFFFFFFFFFFF
        band = _band_of(a, k0, rel, 52 + abs_ + top)
        outside = m & (tl.abs((v & (step - 1)) - (step >> 1)) > (band << 4))
        lo = v - (v & (step - 1))
        tl.store(near_ptr + j, _nearest(v, k0), mask=m)
        tl.store(odd_ptr + j, tl.where((lo & step) != 0, lo, lo + step), mask=m)
        return tl.where(outside, npos - j.to(tl.int64), 0), (m & (a == 0)).to(tl.int64)

    @triton.jit
    def _round_with_band_block(x_ptr, offs, n, k0, rel, abs_, top):
        # auditor: within one band of a midpoint -> even neighbour, else nearest, in place; returns
        # per lane (moved off its nearest, within 16 bands)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        step = (tl.zeros_like(v) + 1) << k0
        low = v & (step - 1)
        off = low != 0
        d = tl.abs(low - (step >> 1))
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, k0, rel, 52 + abs_ + top)
        r = _nearest(v, k0)
        lo = v - low
        out = tl.where(off & (d <= band), tl.where((lo & step) != 0, lo + step, lo), r)
        tl.store(x_ptr + offs, out, mask=m)
        return (m & (out != r)).to(tl.int64), (m & off & (d <= (band << 4))).to(tl.int64)

    @triton.jit
    def _write_listed_block(x_ptr, pos_ptr, j, npos, near_ptr, odd_ptr):
        # auditor, last: listed lanes go to their odd neighbour; returns the change in corrections
        m = j < npos
        p = tl.load(pos_ptr + j, mask=m, other=0)
        near = tl.load(near_ptr + j, mask=m, other=0)
        odd = tl.load(odd_ptr + j, mask=m, other=0)
        now = tl.load(x_ptr + p, mask=m, other=0)
        tl.store(x_ptr + p, odd, mask=m)
        return tl.where(m, (odd != near).to(tl.int64) - (now != near).to(tl.int64), 0)

    @triton.jit
    def _top_of(stats_ptr):
        return tl.maximum(tl.load(stats_ptr) >> 52, 1023 - 126)

    @triton.jit
    def _refused(stats_ptr):
        return (tl.load(stats_ptr + 1) != 0) | (tl.load(stats_ptr + 2) != 0) | (tl.load(stats_ptr + 3) != 0)

    # ---- one program per block (large tensors) --------------------------------------------------

    @triton.jit
    def _scan_kernel(x_ptr, n, max_finite, stats_ptr, BLOCK: tl.constexpr):
        # read-only: the largest magnitude's pattern and whether any lane is rare (atomics)
        a, rare = _scan_block(x_ptr, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n, max_finite)
        tl.atomic_max(stats_ptr, tl.max(a, axis=0))
        tl.atomic_max(stats_ptr + 1, tl.max(rare, axis=0))

    @triton.jit
    def _round_and_band_kernel(x_ptr, flag_ptr, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # trainer, unless the scan found a rare lane
        if tl.load(stats_ptr + 1) != 0:
            return
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        listed = _round_band_block(x_ptr, flag_ptr, offs, n, k0, rel, abs_, _top_of(stats_ptr))
        tl.atomic_add(stats_ptr + 4, tl.sum(listed, axis=0))

    @triton.jit
    def _check_entries_kernel(
        x_ptr, pos_ptr, npos, k0, rel, abs_, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr
    ):
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        outside, zero = _check_entries_block(
            x_ptr, pos_ptr, j, npos, k0, rel, abs_, _top_of(stats_ptr), near_ptr, odd_ptr
        )
        # the first entry outside, as npos - j (0: none), so that a zeroed row starts the maximum
        tl.atomic_max(stats_ptr + 2, tl.max(outside, axis=0))
        tl.atomic_max(stats_ptr + 3, tl.max(zero, axis=0))

    @triton.jit
    def _round_with_band_kernel(x_ptr, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # auditor, when the checks passed
        if _refused(stats_ptr):
            return
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        moved, free = _round_with_band_block(x_ptr, offs, n, k0, rel, abs_, _top_of(stats_ptr))
        tl.atomic_add(stats_ptr + 4, tl.sum(moved, axis=0))
        tl.atomic_add(stats_ptr + 5, tl.sum(free, axis=0))

    @triton.jit
    def _write_listed_kernel(x_ptr, pos_ptr, npos, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr):
        if _refused(stats_ptr):
            return
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        delta = _write_listed_block(x_ptr, pos_ptr, j, npos, near_ptr, odd_ptr)
        tl.atomic_add(stats_ptr + 4, tl.sum(delta, axis=0))

    @triton.jit
    def _round_inplace_kernel(x_ptr, n, k0, max_finite, stats_ptr, BLOCK: tl.constexpr):
        # round the common lanes to nearest and flag a rare one: rounding again leaves a rounded
        # lane as it is, so the torch path may then redo the whole tensor
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        rare = _rare(v, max_finite)
        tl.store(x_ptr + offs, _nearest(v, k0), mask=m & (rare == 0))
        tl.atomic_max(stats_ptr + 1, tl.max(rare, axis=0))

    # ---- one program for a whole tensor (small tensors: one launch instead of two to four) -------
    # The passes follow each other in one program; a barrier between two passes makes the first
    # one's writes visible to every thread of the second.

    @triton.jit
    def _scan_all(x_ptr, n, max_finite, stats_ptr, BLOCK: tl.constexpr):
        top = tl.zeros([BLOCK], tl.int64)
        bad = tl.zeros([BLOCK], tl.int64)
        for start in range(0, n, BLOCK):
            a, rare = _scan_block(x_ptr, start + tl.arange(0, BLOCK), n, max_finite)
            top = tl.maximum(top, a)
            bad = bad | rare
        tl.store(stats_ptr, tl.max(top, axis=0))
        tl.store(stats_ptr + 1, tl.max(bad, axis=0))
        return tl.max(bad, axis=0) == 0

    @triton.jit
    def _round_and_band_one(x_ptr, flag_ptr, n, k0, rel, abs_, max_finite, stats_ptr, BLOCK: tl.constexpr):
        if _scan_all(x_ptr, n, max_finite, stats_ptr, BLOCK):
            tl.debug_barrier()
            top = _top_of(stats_ptr)
            listed = tl.zeros([BLOCK], tl.int64)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                listed += _round_band_block(x_ptr, flag_ptr, offs, n, k0, rel, abs_, top)
            tl.store(stats_ptr + 4, tl.sum(listed, axis=0))

    @triton.jit
    def _round_with_entries_one(
        x_ptr, pos_ptr, npos, n, k0, rel, abs_, max_finite, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr
    ):
        if _scan_all(x_ptr, n, max_finite, stats_ptr, BLOCK):
            top = _top_of(stats_ptr)
            outside = tl.zeros([BLOCK], tl.int64)
            zero = tl.zeros([BLOCK], tl.int64)
            for start in range(0, npos, BLOCK):
                j = start + tl.arange(0, BLOCK)
                o, z = _check_entries_block(x_ptr, pos_ptr, j, npos, k0, rel, abs_, top, near_ptr, odd_ptr)
                outside = tl.maximum(outside, o)
                zero = zero | z
            tl.store(stats_ptr + 2, tl.max(outside, axis=0))
            tl.store(stats_ptr + 3, tl.max(zero, axis=0))
            if (tl.max(outside, axis=0) == 0) & (tl.max(zero, axis=0) == 0):
                tl.debug_barrier()
                moved = tl.zeros([BLOCK], tl.int64)
                free = tl.zeros([BLOCK], tl.int64)
                for start in range(0, n, BLOCK):
                    mv, fr = _round_with_band_block(x_ptr, start + tl.arange(0, BLOCK), n, k0, rel, abs_, top)
                    moved += mv
                    free += fr
                tl.debug_barrier()
                for start in range(0, npos, BLOCK):
                    j = start + tl.arange(0, BLOCK)
                    moved += _write_listed_block(x_ptr, pos_ptr, j, npos, near_ptr, odd_ptr)
                tl.store(stats_ptr + 4, tl.sum(moved, axis=0))
                tl.store(stats_ptr + 5, tl.sum(free, axis=0))


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
        "round_and_band_one": _round_and_band_one,
        "round_with_entries_one": _round_with_entries_one,
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
    if x.dtype not in _LANES or not x.is_contiguous() or x.numel() == 0:
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


#: Tensors up to this many lanes are done by one program (one launch, the passes in a loop): on a
#: GPU the time of a small tensor is the launches', each some tens of microseconds of host Python.
#: Larger ones keep one SM busy for longer than launches cost; of 8K, 16K and 64K lanes, 16K gave
#: the fastest record steps on an H100 for gpt-shakespeare and the ResNet-50 shape.
ONE_PROGRAM_MAX = 1 << 14


def _launch_round_and_band(k: dict[str, Any], x: Tensor, flags: Tensor, p: BandParams, stats: Tensor) -> None:
    """The trainer's kernels on the flat int64 view ``x``, counters into ``stats``."""
    n = x.numel()
    if n <= ONE_PROGRAM_MAX:
        k["round_and_band_one"][(1,)](x, flags, n, p.k0, p.rel, p.abs, p.max_finite, stats, BLOCK=BLOCK)
        return
    k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
    k["round_and_band"][_grid(n)](x, flags, n, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)


def _launch_round_with_entries(
    k: dict[str, Any], x: Tensor, pos: Tensor, p: BandParams, stats: Tensor
) -> None:
    """The auditor's kernels on the flat int64 view ``x`` with the entries ``pos`` (on its device,
    in order and range), counters into ``stats``."""
    n, npos = x.numel(), pos.numel()
    # the listed lanes' neighbours, taken before the round pass overwrites them (x stands in when
    # there are none: never read then)
    near = torch.empty(npos, dtype=torch.int64, device=x.device) if npos else x
    odd = torch.empty_like(near) if npos else x
    pos = pos if npos else x
    if n <= ONE_PROGRAM_MAX:
        k["round_with_entries_one"][(1,)](
            x, pos, npos, n, p.k0, p.rel, p.abs, p.max_finite, near, odd, stats, BLOCK=BLOCK
        )
        return
    k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
    if npos:
        k["check_entries"][_grid(npos)](x, pos, npos, p.k0, p.rel, p.abs, near, odd, stats, BLOCK=BLOCK)
    k["round_with_band"][_grid(n)](x, n, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)
    if npos:
        k["write_listed"][_grid(npos)](x, pos, npos, near, odd, stats, BLOCK=BLOCK)


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
    _launch_round_and_band(k, x, flags, p, stats)
    _top, bad, _, _, listed, _ = stats.tolist()  # one synchronisation
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
    _launch_round_with_entries(k, x, pos, p, stats)
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
    failed: tuple[int, ...] = ()  # calls (in launch order) that need the torch path; then nothing else


#: Tensors above this many lanes are not deferred (their calls read back at once, as without
#: deferral): what deferral saves is per-tensor waiting, which small tensors are made of.
DEFER_MAX = 1 << 62


class Deferred:
    """The kernels of one step whose checks are read back once, when it ends.

    Why: the functions above read a tensor's counters back at once (did a lane need the torch path,
    how many lanes are listed), a host synchronisation per rounded tensor; on an H100 a
    gpt-shakespeare record step made some 750 of them. Here every call gets a row of one counter
    buffer and launches its kernels without waiting; :meth:`settle` reads all rows in one
    synchronisation (and the trainer's listed positions in one more). The catch: a call that meets a
    rare lane (or, for the auditor, a bad entry) has written nothing, and the ops after it have used
    its unrounded values, so :meth:`settle` names the failed calls and the caller runs the whole
    step again with the synchronous functions, from a copy of the state taken before, which also
    words any error (:class:`game.training.engine.step.StepEngine`; it then leaves those calls undeferred
    in later steps: at the ResNet-50 shape some tensors hold values below 2**-126 every step).
    """

    ROWS = 512  # counter rows per buffer (a buffer is zeroed in one launch)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._kernels = _kernels()  # the switches are read once a step, not once a tensor
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
        return self._kernels if xf.device.type == self.device.type or self._anywhere else None

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

    def round_with_entries(self, xf: Tensor, p: BandParams, positions: Tensor, on_device: Tensor) -> bool:
        """Auditor: check the entries and round ``xf`` in place; False (nothing launched) when the
        tensor is not the kernels' or the entries are out of order or range (checked on the host
        copy ``positions``; ``on_device`` is the same on the tensor's device)."""
        k = self._takes(xf)
        if k is None:
            return False
        x = xf.view(torch.int64).view(-1)
        if positions.numel() and not _ordered_in_range(positions, x.numel()):
            return False
        _launch_round_with_entries(k, x, on_device, p, self._row())
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

    def settle(self) -> Settled:
        """Read every call's counters back (one synchronisation). When a call needed the torch path
        (a rare lane, a bad entry), only ``failed`` is filled: the step must run again without
        deferral."""
        if not self._rows:
            return Settled([], 0, 0)
        stats = torch.cat(self._buffers)[: self._rows].cpu()
        bad = stats[:, 1:4].any(dim=1)
        if bool(bad.any()):
            return Settled([], 0, 0, tuple(bad.nonzero().squeeze(1).tolist()))
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
