"""Launching the group kernels (:mod:`triton_groups`): all of a foreach op's tensors in one launch a
pass, with a counter row per tensor, for :class:`~game.training.numerics.cuda_deferred.Deferred`.

Apart from :mod:`cuda_kernels` (one tensor a call) because the group's work is a table: each
tensor's addresses and counts are written on the host and copied to the device once a group (from
pinned memory, without waiting), and every pass reads its tensor's row. Nothing here reads back:
the rows are settled with the step's others.
"""

from __future__ import annotations

import array
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from game.training.native.bindings import BandParams
from game.training.numerics import cuda_kernels
from game.training.numerics.cuda_kernels import BLOCK
from game.training.numerics.triton_groups import GROUP_KERNELS

#: Lanes (or entries) per program in the chunked layout: a program loops over its chunk block by
#: block, so that a group of large tensors is some thousands of programs, not a hundred thousand.
CHUNK = 16 * BLOCK

_INT64 = 8  # bytes a lane or an entry


#: Set to 0 to round a foreach op's tensors one kernel call each (to compare, or to fall back).
SWITCH = "VGAME_GROUPS"


def kernels() -> dict[str, Any] | None:
    """The group kernels, or None where they are switched off (:data:`SWITCH`) or the per-tensor
    ones are (no Triton, ``VGAME_NATIVE=0``)."""
    if os.environ.get(SWITCH, "1") == "0" or cuda_kernels._kernels() is None:
        return None
    return GROUP_KERNELS


def _table(rows: list[int], device: torch.device) -> Tensor:
    """The group's table on ``device``: on a GPU copied from pinned memory without waiting (torch's
    pinned allocator keeps the host block until the copy has run); elsewhere (Triton's interpreter,
    tests) the host tensor itself. Made by way of an ``array``, whose conversion is C's: a list
    handed to ``torch.tensor`` is read an element at a time (13 us for a group of 13 tensors, 107
    us for one of 148, against 4 and 18)."""
    host = torch.frombuffer(array.array("q", rows), dtype=torch.int64)  # holds the array
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _one_program(sizes: Sequence[int]) -> bool:
    return max(sizes) <= cuda_kernels.ONE_PROGRAM_MAX


def _grid(most: int, tensors: int) -> tuple[int, int]:
    return ((most + CHUNK - 1) // CHUNK, tensors)


def round_and_band(
    k: dict[str, Any],
    xs: Sequence[Tensor],
    sizes: Sequence[int],
    flags: Tensor,
    stats: Sequence[int],
    p: BandParams,
) -> None:
    """The trainer's passes over the contiguous float64 tensors ``xs`` (``sizes`` lanes each): round
    in place, flag into ``flags`` (int8, the tensors' flags one after another), count into the
    counter rows at the addresses ``stats`` (one a tensor)."""
    rows: list[int] = []  # triton_groups.ROW values a tensor
    flag = flags.data_ptr()
    for x, n, s in zip(xs, sizes, stats, strict=True):
        rows += (x.data_ptr(), n, flag, 0, 0, 0, s, 0)
        flag += n
    table = _table(rows, xs[0].device)
    if _one_program(sizes):
        k["round_and_band_one"][(len(xs),)](table, p.k0, p.rel, p.abs, p.max_finite, BLOCK=BLOCK)
        return
    grid = _grid(max(sizes), len(xs))
    k["scan"][grid](table, p.max_finite, CHUNK=CHUNK, BLOCK=BLOCK)
    k["round_and_band"][grid](table, p.k0, p.rel, p.abs, CHUNK=CHUNK, BLOCK=BLOCK)


def round_with_entries(
    k: dict[str, Any],
    xs: Sequence[Tensor],
    counts: Sequence[int],
    positions: Tensor,
    starts: Sequence[int],
    stats: Sequence[int],
    p: BandParams,
) -> None:
    """The auditor's passes over ``xs`` with their entries: tensor ``i``'s are ``counts[i]`` values
    of ``positions`` (int64, on the device, checked for order and range) from ``starts[i]``. One
    pass checks the entries, rounds and writes the listed lanes, after the scan (``listed_first``
    of :func:`~game.training.numerics.cuda_kernels._launch_round_with_entries`: a group is a
    deferred step's), in one program per tensor or in chunks. Counts go into the counter rows at
    the addresses ``stats`` (one a tensor)."""
    sizes = [x.numel() for x in xs]
    rows: list[int] = []
    for x, n, npos, start, s in zip(xs, sizes, counts, starts, stats, strict=True):
        lanes = x.data_ptr()
        # no entries: the lanes stand in for their address, never read
        pos = positions.data_ptr() + _INT64 * start if npos else lanes
        rows += (lanes, n, pos, npos, 0, 0, s, 0)
    table = _table(rows, xs[0].device)
    if _one_program(sizes):  # every count is at most its tensor's size
        k["round_and_write_listed_one"][(len(xs),)](table, p.k0, p.rel, p.abs, p.max_finite, BLOCK=BLOCK)
        return
    grid = _grid(max(sizes), len(xs))
    k["scan"][grid](table, p.max_finite, CHUNK=CHUNK, BLOCK=BLOCK)
    k["round_and_write_listed"][grid](table, p.k0, p.rel, p.abs, CHUNK=CHUNK, BLOCK=BLOCK)


def round_inplace(
    k: dict[str, Any],
    xs: Sequence[Tensor],
    sizes: Sequence[int],
    stats: Sequence[int],
    k0: int,
    max_finite: int,
) -> None:
    """Round ``xs`` (``sizes`` lanes each) in place to nearest, a rare lane flagged in its tensor's
    counter row (at the addresses ``stats``, one a tensor)."""
    rows: list[int] = []
    for x, n, s in zip(xs, sizes, stats, strict=True):
        rows += (x.data_ptr(), n, 0, 0, 0, 0, s, 0)
    grid = _grid(max(sizes), len(xs))
    k["round_inplace"][grid](_table(rows, xs[0].device), k0, max_finite, CHUNK=CHUNK, BLOCK=BLOCK)


__all__ = ["CHUNK", "SWITCH", "kernels", "round_and_band", "round_inplace", "round_with_entries"]
