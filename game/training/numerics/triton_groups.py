"""The sparse log's Triton programs over a group of tensors: one launch a pass for all of a foreach
op's outputs, instead of one or more a tensor.

Why: an optimizer step is a few foreach ops, each writing one tensor per parameter; rounded one
tensor at a time, they made 214 of the 352 kernel calls of a gpt-shakespeare step, and over a
thousand at the GPT-2-small shape, each some tens of microseconds of host work on a GPU. Here a
group's tensors are rows of a table on the device (:data:`ROW` int64 values each: the lanes'
address and count, the flags' or the entries' address and count, the counter row), and every
pass reads its tensor's row; each tensor keeps its own counter row, so the checks, the flags and
the refusals are per tensor exactly as when it is done alone. The formulas are those of
:mod:`triton_kernels` (the same helpers, called from here), so the bits are the same.

Two layouts, picked per group by its largest tensor: one program per tensor running every pass
(small tensors; one launch in all), or programs over chunks of :data:`CHUNK` lanes of every tensor
(a grid of chunks by tensors, the chunks past a tensor's end doing nothing), one launch a pass.
"""

from __future__ import annotations

from typing import Any

from game.training.numerics.triton_kernels import triton

#: int64 values per tensor in a group's table: lanes' address, lane count, flags' (trainer) or
#: entries' (auditor) address, entry count, two spare (0: the auditor's scratch for its listed
#: lanes' neighbours until its one pass needed none), the counter row's, one more spare.
ROW = 8

if triton is not None:
    import triton.language as tl

    from game.training.numerics.triton_kernels import (
        _first_at_least,
        _nearest,
        _rare,
        _round_and_band_one,
        _round_and_write_blocks,
        _round_and_write_listed_one,
        _round_band_block,
        _scan_block,
        _top_of,
    )

    @triton.jit
    def _lanes(table, j):
        # tensor j's lanes (as int64 patterns) and their count
        row = table + j * 8
        return tl.load(row).to(tl.pointer_type(tl.int64)), tl.load(row + 1)

    @triton.jit
    def _counters(table, j):
        return tl.load(table + j * 8 + 6).to(tl.pointer_type(tl.int64))

    @triton.jit
    def _entries(table, j):
        # the auditor's entries of tensor j and their count
        row = table + j * 8
        return tl.load(row + 2).to(tl.pointer_type(tl.int64)), tl.load(row + 3)

    # ---- one program per tensor (every tensor of the group small) ---------------------------------

    @triton.jit
    def _group_round_and_band_one(table, k0, rel, abs_, max_finite, BLOCK: tl.constexpr):
        j = tl.program_id(0)
        x_ptr, n = _lanes(table, j)
        flag_ptr = tl.load(table + j * 8 + 2).to(tl.pointer_type(tl.int8))
        _round_and_band_one(x_ptr, flag_ptr, n, k0, rel, abs_, max_finite, _counters(table, j), BLOCK)

    @triton.jit
    def _group_round_and_write_listed_one(table, k0, rel, abs_, max_finite, BLOCK: tl.constexpr):
        j = tl.program_id(0)
        x_ptr, n = _lanes(table, j)
        pos, npos = _entries(table, j)
        _round_and_write_listed_one(
            x_ptr, pos, npos, n, k0, rel, abs_, max_finite, _counters(table, j), BLOCK
        )

    # ---- programs over chunks (grid: chunks x tensors) --------------------------------------------

    @triton.jit
    def _group_scan(table, max_finite, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        j = tl.program_id(1)
        x_ptr, n = _lanes(table, j)
        start = tl.program_id(0) * CHUNK
        if start < n:
            top = tl.zeros([BLOCK], tl.int64)
            bad = tl.zeros([BLOCK], tl.int64)
            for i in range(0, CHUNK, BLOCK):
                a, rare = _scan_block(x_ptr, start + i + tl.arange(0, BLOCK), n, max_finite)
                top = tl.maximum(top, a)
                bad = bad | rare
            stats_ptr = _counters(table, j)
            tl.atomic_max(stats_ptr, tl.max(top, axis=0))
            tl.atomic_max(stats_ptr + 1, tl.max(bad, axis=0))

    @triton.jit
    def _group_round_and_band(table, k0, rel, abs_, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        j = tl.program_id(1)
        x_ptr, n = _lanes(table, j)
        stats_ptr = _counters(table, j)
        start = tl.program_id(0) * CHUNK
        if (start < n) & (tl.load(stats_ptr + 1) == 0):
            flag_ptr = tl.load(table + j * 8 + 2).to(tl.pointer_type(tl.int8))
            top = _top_of(stats_ptr)
            listed = tl.zeros([BLOCK], tl.int64)
            for i in range(0, CHUNK, BLOCK):
                offs = start + i + tl.arange(0, BLOCK)
                listed += _round_band_block(x_ptr, flag_ptr, offs, n, k0, rel, abs_, top)
            tl.atomic_add(stats_ptr + 4, tl.sum(listed, axis=0))

    @triton.jit
    def _group_round_and_write_listed(table, k0, rel, abs_, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        # the auditor's one pass after the scan: the entries checked, the lanes rounded and the
        # listed ones written, block by block of the chunk (a group is a deferred step's: a
        # refused call's values are never kept)
        j = tl.program_id(1)
        x_ptr, n = _lanes(table, j)
        stats_ptr = _counters(table, j)
        start = tl.program_id(0) * CHUNK
        if (start < n) & (tl.load(stats_ptr + 1) == 0):
            pos, npos = _entries(table, j)
            outside, zero, moved, free = _round_and_write_blocks(
                x_ptr, pos, start, CHUNK, n, _first_at_least(pos, npos, start), npos, k0, rel, abs_,
                _top_of(stats_ptr), BLOCK,
            )  # fmt: skip
            tl.atomic_max(stats_ptr + 2, outside)
            tl.atomic_max(stats_ptr + 3, zero)
            tl.atomic_add(stats_ptr + 4, moved)
            tl.atomic_add(stats_ptr + 5, free)

    @triton.jit
    def _group_round_inplace(table, k0, max_finite, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        # rounding needs no whole-tensor pass first, so one launch whatever the sizes
        j = tl.program_id(1)
        x_ptr, n = _lanes(table, j)
        start = tl.program_id(0) * CHUNK
        if start < n:
            bad = tl.zeros([BLOCK], tl.int64)
            for i in range(0, CHUNK, BLOCK):
                offs = start + i + tl.arange(0, BLOCK)
                m = offs < n
                v = tl.load(x_ptr + offs, mask=m, other=0)
                rare = _rare(v, max_finite)
                tl.store(x_ptr + offs, _nearest(v, k0), mask=m & (rare == 0))
                bad = bad | rare
            tl.atomic_max(_counters(table, j) + 1, tl.max(bad, axis=0))


GROUP_KERNELS: dict[str, Any] = (
    {}
    if triton is None
    else {
        "round_and_band_one": _group_round_and_band_one,
        "round_and_write_listed_one": _group_round_and_write_listed_one,
        "scan": _group_scan,
        "round_and_band": _group_round_and_band,
        "round_and_write_listed": _group_round_and_write_listed,
        "round_inplace": _group_round_inplace,
    }
)

__all__ = ["GROUP_KERNELS", "ROW"]
