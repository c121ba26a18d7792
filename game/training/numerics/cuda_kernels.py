"""The sparse log's fused kernels for CUDA tensors, in Triton: what ``native/kernels.c`` does on CPU.

On a GPU the torch kernels of :mod:`game.training.numerics.bandcheck` cost some 30 launches and several host
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
Triton reads when this module is first imported; :mod:`game.training.numerics.bandcheck` imports it only for
a CUDA tensor).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
from torch import Tensor

from game.training.native.bindings import BandParams, Replay
from game.training.numerics.triton_kernels import KERNELS, triton

log = logging.getLogger(__name__)

#: Lanes per Triton program.
BLOCK = 1024
#: The kernels read and write 8-byte lanes: float64 values (as their bit patterns) or int64 views.
_LANES = (torch.float64, torch.int64)


def _kernels() -> dict[str, Any] | None:
    """The kernels (compiled on first launch), or None without Triton or with ``VGAME_NATIVE=0``."""
    if triton is None or os.environ.get("VGAME_NATIVE", "1") == "0":
        return None
    return KERNELS


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
    """The trainer's kernels on ``x`` (contiguous float64 lanes, or their int64 view: the kernels read
    either as int64 patterns), counters into ``stats``."""
    n = x.numel()
    if n <= ONE_PROGRAM_MAX:
        k["round_and_band_one"][(1,)](x, flags, n, p.k0, p.rel, p.abs, p.max_finite, stats, BLOCK=BLOCK)
        return
    k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
    k["round_and_band"][_grid(n)](x, flags, n, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)


def _launch_round_with_entries(
    k: dict[str, Any], x: Tensor, pos: Tensor, p: BandParams, stats: Tensor, *, listed_first: bool = False
) -> None:
    """The auditor's kernels on ``x`` (as :func:`_launch_round_and_band` takes it) with the entries
    ``pos`` (on its device, in order and range), counters into ``stats``. ``listed_first`` (a
    deferred step's call): one pass after the scan checks the entries, rounds and writes the listed
    lanes at once: a small tensor in one program with no scratch for the neighbours, a large one in
    two launches, as the trainer's, where a call read back at once has four (scan, check, round,
    write); but a refused call has then written its lanes (the deferred step runs again from a
    copy; a call read back at once must leave a refused tensor as it was)."""
    n, npos = x.numel(), pos.numel()
    pos = pos if npos else x  # x stands in where there are no entries: never read then
    if listed_first:
        if n <= ONE_PROGRAM_MAX:
            k["round_and_write_listed_one"][(1,)](
                x, pos, npos, n, p.k0, p.rel, p.abs, p.max_finite, stats, BLOCK=BLOCK
            )
            return
        k["scan"][_grid(n)](x, n, p.max_finite, stats, BLOCK=BLOCK)
        k["round_and_write_listed"][_grid(n)](x, pos, npos, n, p.k0, p.rel, p.abs, stats, BLOCK=BLOCK)
        return
    # the listed lanes' neighbours, taken before the round pass overwrites them: a pass after it
    # writes them (x stands in when there are none: never read then)
    near = torch.empty(npos, dtype=torch.int64, device=x.device) if npos else x
    odd = torch.empty_like(near) if npos else x
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
    n = xf.numel()
    stats = _stats(xf)
    flags = torch.empty(n, dtype=torch.int8, device=xf.device)
    _launch_round_and_band(k, xf, flags, p, stats)
    _top, bad, _, _, listed, _ = stats.tolist()  # one synchronisation
    if bad:
        return None
    if listed == 0:  # most tensors: no nonzero (two more launches and a synchronisation)
        return torch.empty(0, dtype=torch.int64, device=xf.device)
    return flags.nonzero().squeeze(1)


def round_with_entries(xf: Tensor, p: BandParams, positions: Tensor, count_free: bool) -> Replay | None:
    """Auditor kernel, **in place** on a contiguous float64 tensor (or its int64 view), with the
    trainer's flat positions: ``(corrections, free)``; None, with ``xf`` untouched, when the torch
    kernel must do it (rare lanes, a listed zero, positions out of order or out of range, or an entry
    outside the band: the torch kernel words the error)."""
    k = _kernels()
    if k is None or not usable(xf):
        return None
    n, npos = xf.numel(), positions.numel()
    if npos and not _ordered_in_range(positions.cpu(), n):  # on the host, where the log was decoded
        return None
    pos = positions.to(device=xf.device, dtype=torch.int64).contiguous()
    stats = _stats(xf)
    _launch_round_with_entries(k, xf, pos, p, stats)
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
    stats = _stats(xf)
    k["round_inplace"][_grid(xf.numel())](xf, xf.numel(), k0, max_finite, stats, BLOCK=BLOCK)
    return int(stats[1]) == 0


def _ordered_in_range(positions: Tensor, n: int) -> bool:
    """Host positions strictly ascending and within ``[0, n)``."""
    return not (
        int(positions[0]) < 0
        or int(positions[-1]) >= n
        or (positions.numel() > 1 and not bool((positions[1:] > positions[:-1]).all()))
    )


__all__ = [
    "BLOCK",
    "available",
    "round_and_band",
    "round_inplace",
    "round_with_entries",
    "runs_on",
    "usable",
]
