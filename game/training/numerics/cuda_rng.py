"""The RNG's stream words for CUDA devices, in Triton: what ``native.bindings.philox_stream`` does on CPU.

:func:`game.training.numerics.rng.stream` as torch ops costs 242 tiny kernels a draw on a GPU (some 1,700
launches a gpt-shakespeare step for dropout alone); here one launch draws a whole ``[ids, count]``
tensor. Each lane computes one Philox4x32-10 block, the four words at positions ``4b .. 4b+3`` of
one example's stream (counter ``(step, example id, b mod 2**32, b >> 32)``, see :mod:`rng`'s
layout), in 32-bit unsigned arithmetic: ``umulhi`` for the high half of each 32x32-bit product, a
wrapping multiply for the low half, the key schedule's additions mod 2**32. Lanes run over the
flattened (example, block) pairs, so one launch serves many short rows (data picks: one word per
example) as well as a few long ones (dropout masks); indices and offsets are int64.

Runs where :func:`game.training.numerics.cuda_kernels.runs_on` says the Triton kernels do (a CUDA device
Triton compiles for; any device while Triton's interpreter runs, which is how the tests run it on
CPU tensors), and not with ``VGAME_NATIVE=0`` nor inside ``native.library.disabled()``: there
:func:`stream_words` returns None and :func:`rng.stream` runs its torch code, the reference these
words equal bit for bit (tests/training/test_cuda_rng.py).
"""

from __future__ import annotations

import struct
from typing import Any

import torch
from torch import Tensor

from game.training.native import library
from game.training.numerics import cuda_kernels

try:  # Triton comes with torch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the torch code runs
    triton = None

#: Lanes (Philox blocks, four words each) per Triton program: of 256, 512, 1024 and 2048, 256 wrote
#: fastest on an H100 (2.3 TB/s for 16 x 2**22 words, 0.24 ms; the torch code took 26 ms).
BLOCK = 256


if triton is not None:

    @triton.jit
    def _philox_lanes(
        ids_ptr, step, k0, k1, blocks, total, first_block, HAS_IDS: tl.constexpr, BLOCK: tl.constexpr
    ):
        """This program's lanes: each one's Philox block (its four words c0 .. c3, Philox4x32-10 of
        the counter (step, example id, b mod 2**32, b >> 32)), its example row, its block's index
        in the row, and whether it is live. Lane i: row = i // blocks, b = first_block + i % blocks;
        the scalars step, k0 and k1 arrive as int32 (their uint32 bits), so one compiled kernel
        serves every key."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = i < total
        row = i // blocks
        local = i - row * blocks  # the block's index within the row
        b = local + first_block
        if HAS_IDS:
            ex = tl.load(ids_ptr + row, mask=live, other=0).to(tl.uint32)  # ids lie in 0..2**32-1
        else:
            ex = tl.zeros([BLOCK], dtype=tl.uint32)
        c0 = tl.zeros([BLOCK], dtype=tl.uint32) + step.to(tl.uint32)
        c1 = ex
        c2 = (b & 0xFFFFFFFF).to(tl.uint32)
        c3 = (b >> 32).to(tl.uint32)
        key0 = tl.zeros([BLOCK], dtype=tl.uint32) + k0.to(tl.uint32)
        key1 = tl.zeros([BLOCK], dtype=tl.uint32) + k1.to(tl.uint32)
        m0 = tl.full([BLOCK], 0xD2511F53, dtype=tl.uint32)
        m1 = tl.full([BLOCK], 0xCD9E8D57, dtype=tl.uint32)
        w0 = tl.full([BLOCK], 0x9E3779B9, dtype=tl.uint32)
        w1 = tl.full([BLOCK], 0xBB67AE85, dtype=tl.uint32)
        for _ in tl.static_range(10):
            hi0 = tl.umulhi(m0, c0)
            lo0 = m0 * c0  # uint32: the low half, wrapped
            hi1 = tl.umulhi(m1, c2)
            lo1 = m1 * c2
            c0 = hi1 ^ c1 ^ key0
            c1 = lo1
            c2 = hi0 ^ c3 ^ key1
            c3 = lo0
            key0 = key0 + w0  # mod 2**32
            key1 = key1 + w1
        # each lane's four words as one [BLOCK, 4] (four strided stores ran at a third of the write
        # bandwidth on an H100: a lane stores its four contiguous words at once)
        words = tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), [BLOCK, 4])  # c0 c1 c2 c3
        return words, row, local, live

    @triton.jit(do_not_specialize=["step", "k0", "k1", "count", "blocks", "total", "first_block"])
    def _philox_stream_kernel(
        ids_ptr,
        out_ptr,
        step,
        k0,
        k1,
        count,
        blocks,
        total,
        first_block,
        HAS_IDS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        words, row, local, live = _philox_lanes(
            ids_ptr, step, k0, k1, blocks, total, first_block, HAS_IDS, BLOCK
        )
        at = (local * 4)[:, None] + tl.arange(0, 4)[None, :]  # the block's positions in the row
        # uint32 -> int64 zero-extends
        tl.store(out_ptr + (row * count)[:, None] + at, words.to(tl.int64), mask=live[:, None] & (at < count))

    @triton.jit(do_not_specialize=["step", "k0", "k1", "count", "blocks", "total", "threshold", "value_bits"])
    def _philox_scaled_keep_kernel(
        ids_ptr,
        out_ptr,
        step,
        k0,
        k1,
        count,
        blocks,
        total,
        threshold,
        value_bits,
        HAS_IDS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # rng.scaled_keep: value where the word is below threshold (<= 2**32, as int64), else +0;
        # value arrives as its float64 bits in an int64 (Triton would pass a Python float as float32)
        words, row, local, live = _philox_lanes(ids_ptr, step, k0, k1, blocks, total, 0, HAS_IDS, BLOCK)
        value = value_bits.to(tl.int64).to(tl.float64, bitcast=True)
        kept = tl.where(words.to(tl.int64) < threshold.to(tl.int64), value, 0.0)
        at = (local * 4)[:, None] + tl.arange(0, 4)[None, :]
        tl.store(out_ptr + (row * count)[:, None] + at, kept, mask=live[:, None] & (at < count))


def _i32(word: int) -> int:
    """A uint32 as the int32 with its bits (Triton types a Python int by its value)."""
    return word - (1 << 32) if word > 0x7FFFFFFF else word


def available() -> bool:
    """Whether the kernel can run anywhere: Triton importable, and neither ``VGAME_NATIVE=0`` nor
    ``native.library.disabled()``."""
    return triton is not None and not library.disabled.off and cuda_kernels.available()


def runs_on(device: torch.device) -> bool:
    """Whether the kernel runs on this device: a CUDA device Triton compiles for; under Triton's
    interpreter (tests) CUDA or CPU tensors."""
    return device.type in ("cuda", "cpu") and available() and cuda_kernels.runs_on(device)


def _launch(
    out: Tensor, ids: Tensor | None, step: int, count: int, key: tuple[int, int], first_block: int = 0
) -> None:
    """Fill ``out`` (int64 ``[rows, count]``, contiguous) with positions ``4 * first_block ..`` of
    each row's stream (``first_block``, below 2**64, is 0 but in tests of the counter's last words)."""
    first = first_block - (1 << 64) if first_block >= 1 << 63 else first_block  # the int64 with its bits
    _run(_philox_stream_kernel, out, ids, step, count, key, first)


def _run(
    kernel: Any, out: Tensor, ids: Tensor | None, step: int, count: int, key: tuple[int, int], *own: int
) -> None:
    """One launch of ``kernel`` over ``out``'s rows (``[rows, count]``, contiguous): a lane a Philox
    block of a row, the lanes' own scalars, then the kernel's ``own``."""
    rows = out.shape[0]
    blocks = (count + 3) // 4
    total = rows * blocks
    if total == 0:
        return
    kernel[(triton.cdiv(total, BLOCK),)](
        out if ids is None else ids,  # never read without ids
        out,
        _i32(step),
        _i32(key[0]),
        _i32(key[1]),
        count,
        blocks,
        total,
        *own,
        HAS_IDS=ids is not None,
        BLOCK=BLOCK,
    )


def _ids_and_out(
    example_ids: Tensor | None, count: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[Tensor | None, Tensor] | None:
    """A draw's ids on ``device`` and its output, ``[len(example_ids), count]`` (one row without ids)
    of ``dtype``; None where the kernels do not run on ``device``."""
    device = torch.device(device)
    if not runs_on(device):
        return None
    ids = None if example_ids is None else example_ids.to(device=device, dtype=torch.int64).contiguous()
    return ids, torch.empty((1 if ids is None else ids.numel(), count), dtype=dtype, device=device)


def scaled_keep(
    step: int,
    example_ids: Tensor | None,
    count: int,
    key: tuple[int, int],
    threshold: int,
    value: float,
    device: torch.device | str,
) -> Tensor | None:
    """Dropout's scaled keep mask under ``key`` (``rng.scaled_keep``'s values): float64
    ``[len(example_ids), count]`` on ``device``, ``value`` where :func:`stream_words`' word is below
    ``threshold`` (at most 2**32), else +0, in one launch; None where the kernel does not run. The
    caller has checked the step and the ids fit 32 bits."""
    made = _ids_and_out(example_ids, count, torch.float64, device)
    if made is None:
        return None
    ids, out = made
    value_bits = struct.unpack("<q", struct.pack("<d", value))[0]
    _run(_philox_scaled_keep_kernel, out, ids, step, count, key, threshold, value_bits)
    return out


def stream_words(
    step: int, example_ids: Tensor | None, count: int, key: tuple[int, int], device: torch.device | str
) -> Tensor | None:
    """Positions ``0 .. count-1`` of each example's stream under ``key``: int64 ``[len(example_ids),
    count]`` on ``device`` (one row, example id 0, when ``example_ids`` is None), ``rng.stream``'s
    words; None where the kernel does not run (the caller runs the torch code). The caller has
    checked the step and the ids fit 32 bits."""
    made = _ids_and_out(example_ids, count, torch.int64, device)
    if made is None:
        return None
    ids, out = made
    _launch(out, ids, step, count, key)
    return out


__all__ = ["BLOCK", "available", "runs_on", "scaled_keep", "stream_words"]
