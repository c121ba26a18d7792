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
from typing import Any

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
    if npos:  # order and range, on the host where the log was decoded
        host = positions.cpu()
        if int(host[0]) < 0 or int(host[-1]) >= n or (npos > 1 and not bool((host[1:] > host[:-1]).all())):
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


__all__ = ["BLOCK", "available", "round_and_band", "round_inplace", "round_with_entries", "usable"]
