"""The sparse log's Triton programs (JIT-compiled on first launch); launched by :mod:`cuda_kernels`.

Apart from the launching code so that each module stays one thing: these are the device programs,
pass by pass (scan a block for rare lanes, round and flag the band, check the auditor's entries,
round with the band, write the listed lanes, round in place; for a deferred step the auditor's
last three in one pass), and for small tensors the same passes in one program. Their formulas are
the C kernels' (``native/kernels.c``), bit for bit. Without Triton (a CPU-only install)
``triton`` is None and :data:`KERNELS` is empty.
"""

from __future__ import annotations

from typing import Any

try:  # Triton comes with torch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the torch kernels run
    triton = None

if triton is not None:
    # Each pass over a block of lanes is a helper, so that the kernels below (one program per block
    # for large tensors, one program for a whole small tensor) share every formula.

    @triton.jit
    def _int64s(ptr):
        # the lanes as int64 patterns, whether the launch passed float64 values or their int64
        # view: a launch passes the step's float64 tensor itself, since two views a call (to int64,
        # flat) cost the host some 1.6 us, five hundred times a GPT-2-shape step
        return ptr.to(tl.pointer_type(tl.int64), bitcast=True)

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
    def _entry(v, k0, rel, abs_, top):
        # a listed lane's value v: whether it lies within 16 bands of its midpoint (an entry outside
        # is refused), its nearest and its odd neighbour (where the trainer's log sends it)
        step = (tl.zeros_like(v) + 1) << k0
        low = v & (step - 1)
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, k0, rel, 52 + abs_ + top)
        inside = tl.abs(low - (step >> 1)) <= (band << 4)
        lo = v - low
        return inside, _nearest(v, k0), tl.where((lo & step) != 0, lo, lo + step)

    @triton.jit
    def _check_entries_block(x_ptr, pos_ptr, j, npos, k0, rel, abs_, top, near_ptr, odd_ptr):
        # auditor, read-only: for entries j, (npos - j where outside 16 bands, else 0) and whether
        # the lane is zero; their nearest and odd neighbours kept for the last pass
        m = j < npos
        p = tl.load(pos_ptr + j, mask=m, other=0)
        v = tl.load(x_ptr + p, mask=m, other=0)
        inside, near, odd = _entry(v, k0, rel, abs_, top)
        tl.store(near_ptr + j, near, mask=m)
        tl.store(odd_ptr + j, odd, mask=m)
        zero = (v & 0x7FFFFFFFFFFFFFFF) == 0
        return tl.where(m & ~inside, npos - j.to(tl.int64), 0), (m & zero).to(tl.int64)

    @triton.jit
    def _with_band(v, k0, rel, abs_, top):
        # auditor, one lane: within one band of a midpoint -> even neighbour, else nearest; and
        # whether that moved it off its nearest, whether it lies within 16 bands (a free lane)
        step = (tl.zeros_like(v) + 1) << k0
        low = v & (step - 1)
        off = low != 0
        d = tl.abs(low - (step >> 1))
        band = _band_of(v & 0x7FFFFFFFFFFFFFFF, k0, rel, 52 + abs_ + top)
        r = _nearest(v, k0)
        lo = v - low
        out = tl.where(off & (d <= band), tl.where((lo & step) != 0, lo + step, lo), r)
        return out, out != r, off & (d <= (band << 4))

    @triton.jit
    def _round_with_band_block(x_ptr, offs, n, k0, rel, abs_, top):
        # auditor: every lane as _with_band says, in place; returns per lane (moved off its
        # nearest, within 16 bands)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        out, moved, free = _with_band(v, k0, rel, abs_, top)
        tl.store(x_ptr + offs, out, mask=m)
        return (m & moved).to(tl.int64), (m & free).to(tl.int64)

    @triton.jit
    def _first_at_least(pos_ptr, npos, key):
        # the index of the first of the ascending entries pos[0:npos] at or past lane ``key`` (npos
        # if none): 64 entries sampled at once narrow the range 64-fold, so four or five rounds
        # find it among millions. Why 64, not a block's 1,024: every program of a tensor searches,
        # and a round's samples are scattered loads (1,024 a round would read, by count, twice
        # the lanes' own bytes at the GPT-2-small shape). The answer stays within [lo, hi]: the
        # samples before it are below key
        lo = tl.full([], 0, tl.int64)
        hi = lo + npos
        while lo < hi:
            stride = (hi - lo + 63) // 64
            at = lo + tl.arange(0, 64).to(tl.int64) * stride
            inside = at < hi
            below = tl.sum(
                (inside & (tl.load(pos_ptr + at, mask=inside, other=0) < key)).to(tl.int64), axis=0
            )
            was = lo
            lo = tl.where(below > 0, was + (below - 1) * stride + 1, was)
            hi = tl.minimum(was + below * stride, hi)
        return lo

    @triton.jit
    def _round_and_write_block(
        x_ptr, pos_ptr, start, n, first, npos, k0, rel, abs_, top, BLOCK: tl.constexpr
    ):
        # auditor, deferred: lanes start .. start + BLOCK rounded with the band, and those of them
        # the log lists (entries first .. , at most BLOCK: positions ascend strictly) checked and
        # written to their odd neighbour. A listed lane is counted as the entry says (moved off its
        # nearest; free: within 16 bands and not on the grid, which is _with_band's free too), not
        # as the round says. Returns (npos - j for the first entry j outside 16 bands, else 0;
        # whether a listed lane is zero; moved; free; the entries taken). A refused call has
        # written its lanes too: a deferred step never keeps them, it runs again from a copy.
        j = first + tl.arange(0, BLOCK).to(tl.int64)
        p = tl.load(pos_ptr + j, mask=j < npos, other=0)
        mine = (j < npos) & (p < start + BLOCK)
        v = tl.load(x_ptr + p, mask=mine, other=0)
        inside, near, odd = _entry(v, k0, rel, abs_, top)
        _out, moved_by_round, _free = _with_band(v, k0, rel, abs_, top)
        tl.debug_barrier()  # every listed lane read before the round writes any of them
        moved, free = _round_with_band_block(x_ptr, start + tl.arange(0, BLOCK), n, k0, rel, abs_, top)
        tl.debug_barrier()  # the round's writes land before the listed lanes' (the same addresses)
        tl.store(x_ptr + p, odd, mask=mine)
        relisted = (mine & (odd != near)).to(tl.int64) - (mine & moved_by_round).to(tl.int64)
        return (
            tl.max(tl.where(mine & ~inside, npos - j, 0), axis=0),
            tl.max((mine & ((v & 0x7FFFFFFFFFFFFFFF) == 0)).to(tl.int64), axis=0),
            tl.sum(moved, axis=0) + tl.sum(relisted, axis=0),
            tl.sum(free, axis=0),
            tl.sum(mine.to(tl.int64), axis=0),
        )

    @triton.jit
    def _round_and_write_blocks(
        x_ptr, pos_ptr, start, length, n, first, npos, k0, rel, abs_, top, BLOCK: tl.constexpr
    ):
        # _round_and_write_block over lanes start .. start + length, block by block, each block's
        # entries going on from where the last one's stopped (``first``: the first block's first
        # entry); returns its first four results, the blocks' together
        outside = tl.full([], 0, tl.int64)
        zero = tl.full([], 0, tl.int64)
        moved = tl.full([], 0, tl.int64)
        free = tl.full([], 0, tl.int64)
        for i in range(0, length, BLOCK):
            o, z, mv, fr, taken = _round_and_write_block(
                x_ptr, pos_ptr, start + i, n, first, npos, k0, rel, abs_, top, BLOCK
            )
            first += taken
            outside = tl.maximum(outside, o)
            zero = tl.maximum(zero, z)
            moved += mv
            free += fr
        return outside, zero, moved, free

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
        x_ptr = _int64s(x_ptr)
        a, rare = _scan_block(x_ptr, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n, max_finite)
        tl.atomic_max(stats_ptr, tl.max(a, axis=0))
        tl.atomic_max(stats_ptr + 1, tl.max(rare, axis=0))

    @triton.jit
    def _round_and_band_kernel(x_ptr, flag_ptr, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # trainer, unless the scan found a rare lane
        if tl.load(stats_ptr + 1) != 0:
            return
        x_ptr = _int64s(x_ptr)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        listed = _round_band_block(x_ptr, flag_ptr, offs, n, k0, rel, abs_, _top_of(stats_ptr))
        tl.atomic_add(stats_ptr + 4, tl.sum(listed, axis=0))

    @triton.jit
    def _check_entries_kernel(
        x_ptr, pos_ptr, npos, k0, rel, abs_, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr
    ):
        x_ptr, pos_ptr, near_ptr, odd_ptr = (
            _int64s(x_ptr),
            _int64s(pos_ptr),
            _int64s(near_ptr),
            _int64s(odd_ptr),
        )
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        outside, zero = _check_entries_block(
            x_ptr, pos_ptr, j, npos, k0, rel, abs_, _top_of(stats_ptr), near_ptr, odd_ptr
        )
        # the first entry outside, as npos - j (0: none), so that a zeroed row starts the maximum
        tl.atomic_max(stats_ptr + 2, tl.max(outside, axis=0))
        tl.atomic_max(stats_ptr + 3, tl.max(zero, axis=0))

    @triton.jit
    def _round_and_write_listed_kernel(
        x_ptr, pos_ptr, npos, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr
    ):
        # a deferred auditor's one pass after the scan: entries checked, lanes rounded, listed lanes
        # written, each program its own block's (so no pass has to wait for another's)
        if tl.load(stats_ptr + 1) != 0:
            return
        x_ptr, pos_ptr = _int64s(x_ptr), _int64s(pos_ptr)
        start = tl.program_id(0) * BLOCK
        first = _first_at_least(pos_ptr, npos, start)
        outside, zero, moved, free, _taken = _round_and_write_block(
            x_ptr, pos_ptr, start, n, first, npos, k0, rel, abs_, _top_of(stats_ptr), BLOCK
        )
        tl.atomic_max(stats_ptr + 2, outside)
        tl.atomic_max(stats_ptr + 3, zero)
        tl.atomic_add(stats_ptr + 4, moved)
        tl.atomic_add(stats_ptr + 5, free)

    @triton.jit
    def _round_with_band_kernel(x_ptr, n, k0, rel, abs_, stats_ptr, BLOCK: tl.constexpr):
        # auditor, when the checks passed
        if _refused(stats_ptr):
            return
        x_ptr = _int64s(x_ptr)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        moved, free = _round_with_band_block(x_ptr, offs, n, k0, rel, abs_, _top_of(stats_ptr))
        tl.atomic_add(stats_ptr + 4, tl.sum(moved, axis=0))
        tl.atomic_add(stats_ptr + 5, tl.sum(free, axis=0))

    @triton.jit
    def _write_listed_kernel(x_ptr, pos_ptr, npos, near_ptr, odd_ptr, stats_ptr, BLOCK: tl.constexpr):
        if _refused(stats_ptr):
            return
        x_ptr, pos_ptr, near_ptr, odd_ptr = (
            _int64s(x_ptr),
            _int64s(pos_ptr),
            _int64s(near_ptr),
            _int64s(odd_ptr),
        )
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        delta = _write_listed_block(x_ptr, pos_ptr, j, npos, near_ptr, odd_ptr)
        tl.atomic_add(stats_ptr + 4, tl.sum(delta, axis=0))

    @triton.jit
    def _round_inplace_kernel(x_ptr, n, k0, max_finite, stats_ptr, BLOCK: tl.constexpr):
        # round the common lanes to nearest and flag a rare one: rounding again leaves a rounded
        # lane as it is, so the torch path may then redo the whole tensor
        x_ptr = _int64s(x_ptr)
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
        x_ptr = _int64s(x_ptr)
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
        x_ptr, pos_ptr, near_ptr, odd_ptr = (
            _int64s(x_ptr),
            _int64s(pos_ptr),
            _int64s(near_ptr),
            _int64s(odd_ptr),
        )
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

    @triton.jit
    def _round_and_write_listed_one(
        x_ptr, pos_ptr, npos, n, k0, rel, abs_, max_finite, stats_ptr, BLOCK: tl.constexpr
    ):
        # a deferred auditor's small tensor in one program: the scan, then block by block the one
        # pass of _round_and_write_block, each block's entries going on from the last's (no search,
        # and no scratch for the neighbours: a refused call's values are never kept)
        x_ptr, pos_ptr = _int64s(x_ptr), _int64s(pos_ptr)
        if _scan_all(x_ptr, n, max_finite, stats_ptr, BLOCK):
            tl.debug_barrier()
            first = tl.full([], 0, tl.int64)
            outside, zero, moved, free = _round_and_write_blocks(
                x_ptr, pos_ptr, 0, n, n, first, npos, k0, rel, abs_, _top_of(stats_ptr), BLOCK
            )
            tl.store(stats_ptr + 2, outside)
            tl.store(stats_ptr + 3, zero)
            tl.store(stats_ptr + 4, moved)
            tl.store(stats_ptr + 5, free)


KERNELS: dict[str, Any] = (
    {}
    if triton is None
    else {
        "scan": _scan_kernel,
        "round_and_band": _round_and_band_kernel,
        "check_entries": _check_entries_kernel,
        "round_and_write_listed": _round_and_write_listed_kernel,
        "round_with_band": _round_with_band_kernel,
        "write_listed": _write_listed_kernel,
        "round_inplace": _round_inplace_kernel,
        "round_and_band_one": _round_and_band_one,
        "round_with_entries_one": _round_with_entries_one,
        "round_and_write_listed_one": _round_and_write_listed_one,
    }
)
