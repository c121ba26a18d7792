"""SHA-256 of every 4096-byte chunk of a buffer on its device: the Triton kernel of the device leaf.

The chunked leaf (``vgame-leaf-v2``, :mod:`~game.training.state.leafhash`) hashes every chunk of a
level independently, so a GPU hashes them side by side: :func:`hash_chunks` runs one chunk a lane,
:data:`BLOCK` lanes a program, each lane's SHA-256 padding done in the kernel; :func:`device_levels`
runs it once per level until at most 4096 bytes remain (three launches for 1 GB of float64 state:
512 MB, 4 MB, 32 KB of input). :mod:`.device_leaf` builds the bytes it hashes.

Tests (``tests/training/test_cuda_leaf.py``) run the kernel on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1``) against ``hashlib`` per chunk and :mod:`~game.training.state.leafhash` per
leaf. The kernel is plain Triton (uint32 wrapping arithmetic, logical shifts, named variables,
builtins only) so that the compiled path computes what the interpreter does; the interpreter spends
some 0.2 to 0.4 s on each of a chunk's 65 SHA-256 blocks, whatever the number of chunks side by
side.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import Tensor

from game.errors import TrainingError
from game.training.state import leafhash

try:  # Triton comes with torch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: no device leaf
    triton = None

#: Lanes (chunks) per Triton program: one lane per thread at four warps.
BLOCK = 128
#: Lanes per program in Triton's interpreter, where a program's time is its operations' count (some
#: 60 us each, whatever their width) and not their width: every chunk of a test in one program.
INTERPRETED_BLOCK = 1024
#: Warps per program.
NUM_WARPS = 4

_CHUNK = leafhash.CHUNK
_DIGEST = leafhash.DIGEST
#: A byte buffer the kernel reads is padded to this (so that no word load leaves it).
_PAD = 64

#: SHA-256's round constants (FIPS 180-4, 4.2.2).
_K = (
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
)  # fmt: skip


def _device_function(fn: Any) -> Any:
    """``triton.jit`` for the kernel's helpers. In Triton's interpreter every call of a jitted helper
    patches ``triton.language`` again (some 2 ms a call, most of an interpreted block's time), which
    the kernel's launch has already done for this module: there a helper is called as the
    interpreter rewrote it, without the patching. Compiled, it is the plain ``triton.jit``."""
    jitted = triton.jit(fn)
    rewrite = getattr(jitted, "rewrite", None)
    if rewrite is None or not _interpreted(jitted):
        return jitted
    return _Rewritten(rewrite)


def _interpreted(jitted: Any) -> bool:
    """Whether ``triton.jit`` made an interpreted function (``TRITON_INTERPRET=1`` at import)."""
    return type(jitted).__name__ == "InterpretedFunction"


class _Rewritten:
    """An interpreted helper called without re-patching (see :func:`_device_function`)."""

    def __init__(self, rewrite: Any) -> None:
        self._rewrite = rewrite
        self._fn: Any = None

    def __call__(self, *args: Any) -> Any:
        if self._fn is None:
            self._fn = self._rewrite()
        return self._fn(*args)


if triton is not None:

    @_device_function
    def _rotr(x, n: tl.constexpr):
        # x: uint32, so >> is a logical shift
        return (x >> n) | (x << (32 - n))

    @_device_function
    def _add(x, y):
        # uint32 addition modulo 2**32: wrapping is meant, so no overflow check (Triton's interpreter
        # and debug builds would otherwise check every add, and flag the wrap)
        return tl.add(x, y, sanitize_overflow=False)

    @_device_function
    def _bswap(x):
        # a little-endian load's word as the big-endian word SHA-256 reads (and back)
        return ((x & 0xFF) << 24) | ((x & 0xFF00) << 8) | ((x >> 8) & 0xFF00) | (x >> 24)

    @_device_function
    def _ssig0(x):
        return _rotr(x, 7) ^ _rotr(x, 18) ^ (x >> 3)

    @_device_function
    def _ssig1(x):
        return _rotr(x, 17) ^ _rotr(x, 19) ^ (x >> 10)

    @_device_function
    def _k(k_ptr, t: tl.constexpr):
        # round constant t (the table is int32 on the device: its bits as uint32)
        return tl.load(k_ptr + t).to(tl.uint32, bitcast=True)

    @_device_function
    def _round(a, b, c, d, e, f, g, h, k, w):
        # one SHA-256 round: the eight working words, rotated
        s1 = _rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)
        t1 = _add(_add(_add(h, s1), _add(g ^ (e & (f ^ g)), k)), w)
        t2 = _add(_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22), (a & b) | (c & (a | b)))
        return _add(t1, t2), a, b, c, _add(d, t1), e, f, g

    @_device_function
    def _word(src_ptr, base, q, j: tl.constexpr, data_words, end_word, keep, marker, zero):
        # message word q (= 16 * block + j) of each lane's chunk, padded: the chunk's bytes, 0x80,
        # zeros (the caller puts in the bit length); ``base`` + j: the word in the buffer.
        # data_words: words holding some of the chunk's bytes; end_word: the word of the 0x80 byte,
        # which keeps the bytes ``keep`` selects and gets the ``marker`` byte
        raw = tl.load(src_ptr + base + j, mask=q < data_words, other=0).to(tl.uint32, bitcast=True)
        w = _bswap(raw)
        return tl.where(q < end_word, w, tl.where(q == end_word, (w & keep) | marker, zero))

    @triton.jit
    def _sha256_chunks(
        src_ptr, dst_ptr, k_ptr, n_bytes, n_chunks, max_blocks, CHUNK: tl.constexpr, BLOCK: tl.constexpr
    ):
        """``sha256`` of every ``CHUNK``-byte chunk of ``n_bytes`` bytes (``src_ptr``: int32 words,
        the buffer padded so that a word load never leaves it), one chunk a lane; the 32-byte
        digests (as ``hashlib``'s ``digest()``) written one after another to ``dst_ptr`` (int32
        words). ``max_blocks``: SHA-256 blocks of the longest chunk (65 for a full 4096 bytes)."""
        lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = lane < n_chunks
        first_word = lane.to(tl.int64) * (CHUNK // 4)
        length = tl.where(live, tl.minimum(n_bytes - first_word * 4, CHUNK), 0).to(tl.int32)
        blocks = tl.where(live, (length + 9 + 63) // 64, 0)  # data, 0x80, 8 bytes of bit length
        h0 = tl.full([BLOCK], 0x6A09E667, tl.uint32)
        h1 = tl.full([BLOCK], 0xBB67AE85, tl.uint32)
        h2 = tl.full([BLOCK], 0x3C6EF372, tl.uint32)
        h3 = tl.full([BLOCK], 0xA54FF53A, tl.uint32)
        h4 = tl.full([BLOCK], 0x510E527F, tl.uint32)
        h5 = tl.full([BLOCK], 0x9B05688C, tl.uint32)
        h6 = tl.full([BLOCK], 0x1F83D9AB, tl.uint32)
        h7 = tl.full([BLOCK], 0x5BE0CD19, tl.uint32)
        bits = (length * 8).to(tl.uint32)  # below 2**32: the high word of the bit length is 0
        data_words = (length + 3) // 4
        end_word = length // 4
        tail = ((length % 4) * 8).to(tl.uint32)  # bits of the chunk in its end word
        ones = tl.full([BLOCK], 0xFFFFFFFF, tl.uint32)
        zero = tl.full([BLOCK], 0, tl.uint32)
        keep = ~(ones >> tail)
        marker = tl.full([BLOCK], 0x80000000, tl.uint32) >> tail
        for blk in range(0, max_blocks):
            base = first_word + blk * 16
            q = blk * 16
            w0 = _word(src_ptr, base, q + 0, 0, data_words, end_word, keep, marker, zero)
            w1 = _word(src_ptr, base, q + 1, 1, data_words, end_word, keep, marker, zero)
            w2 = _word(src_ptr, base, q + 2, 2, data_words, end_word, keep, marker, zero)
            w3 = _word(src_ptr, base, q + 3, 3, data_words, end_word, keep, marker, zero)
            w4 = _word(src_ptr, base, q + 4, 4, data_words, end_word, keep, marker, zero)
            w5 = _word(src_ptr, base, q + 5, 5, data_words, end_word, keep, marker, zero)
            w6 = _word(src_ptr, base, q + 6, 6, data_words, end_word, keep, marker, zero)
            w7 = _word(src_ptr, base, q + 7, 7, data_words, end_word, keep, marker, zero)
            w8 = _word(src_ptr, base, q + 8, 8, data_words, end_word, keep, marker, zero)
            w9 = _word(src_ptr, base, q + 9, 9, data_words, end_word, keep, marker, zero)
            w10 = _word(src_ptr, base, q + 10, 10, data_words, end_word, keep, marker, zero)
            w11 = _word(src_ptr, base, q + 11, 11, data_words, end_word, keep, marker, zero)
            w12 = _word(src_ptr, base, q + 12, 12, data_words, end_word, keep, marker, zero)
            w13 = _word(src_ptr, base, q + 13, 13, data_words, end_word, keep, marker, zero)
            w14 = _word(src_ptr, base, q + 14, 14, data_words, end_word, keep, marker, zero)
            w15 = _word(src_ptr, base, q + 15, 15, data_words, end_word, keep, marker, zero)
            w15 = tl.where(blocks - 1 == blk, bits, w15)  # the last block ends with the bit length
            va = h0
            vb = h1
            vc = h2
            vd = h3
            ve = h4
            vf = h5
            vg = h6
            vh = h7
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 0), w0)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 1), w1)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 2), w2)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 3), w3)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 4), w4)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 5), w5)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 6), w6)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 7), w7)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 8), w8)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 9), w9)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 10), w10)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 11), w11)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 12), w12)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 13), w13)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 14), w14)
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 15), w15)
            w0 = _add(_add(w0, _ssig1(w14)), _add(w9, _ssig0(w1)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 16), w0)
            w1 = _add(_add(w1, _ssig1(w15)), _add(w10, _ssig0(w2)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 17), w1)
            w2 = _add(_add(w2, _ssig1(w0)), _add(w11, _ssig0(w3)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 18), w2)
            w3 = _add(_add(w3, _ssig1(w1)), _add(w12, _ssig0(w4)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 19), w3)
            w4 = _add(_add(w4, _ssig1(w2)), _add(w13, _ssig0(w5)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 20), w4)
            w5 = _add(_add(w5, _ssig1(w3)), _add(w14, _ssig0(w6)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 21), w5)
            w6 = _add(_add(w6, _ssig1(w4)), _add(w15, _ssig0(w7)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 22), w6)
            w7 = _add(_add(w7, _ssig1(w5)), _add(w0, _ssig0(w8)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 23), w7)
            w8 = _add(_add(w8, _ssig1(w6)), _add(w1, _ssig0(w9)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 24), w8)
            w9 = _add(_add(w9, _ssig1(w7)), _add(w2, _ssig0(w10)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 25), w9)
            w10 = _add(_add(w10, _ssig1(w8)), _add(w3, _ssig0(w11)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 26), w10)
            w11 = _add(_add(w11, _ssig1(w9)), _add(w4, _ssig0(w12)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 27), w11)
            w12 = _add(_add(w12, _ssig1(w10)), _add(w5, _ssig0(w13)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 28), w12)
            w13 = _add(_add(w13, _ssig1(w11)), _add(w6, _ssig0(w14)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 29), w13)
            w14 = _add(_add(w14, _ssig1(w12)), _add(w7, _ssig0(w15)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 30), w14)
            w15 = _add(_add(w15, _ssig1(w13)), _add(w8, _ssig0(w0)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 31), w15)
            w0 = _add(_add(w0, _ssig1(w14)), _add(w9, _ssig0(w1)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 32), w0)
            w1 = _add(_add(w1, _ssig1(w15)), _add(w10, _ssig0(w2)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 33), w1)
            w2 = _add(_add(w2, _ssig1(w0)), _add(w11, _ssig0(w3)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 34), w2)
            w3 = _add(_add(w3, _ssig1(w1)), _add(w12, _ssig0(w4)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 35), w3)
            w4 = _add(_add(w4, _ssig1(w2)), _add(w13, _ssig0(w5)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 36), w4)
            w5 = _add(_add(w5, _ssig1(w3)), _add(w14, _ssig0(w6)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 37), w5)
            w6 = _add(_add(w6, _ssig1(w4)), _add(w15, _ssig0(w7)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 38), w6)
            w7 = _add(_add(w7, _ssig1(w5)), _add(w0, _ssig0(w8)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 39), w7)
            w8 = _add(_add(w8, _ssig1(w6)), _add(w1, _ssig0(w9)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 40), w8)
            w9 = _add(_add(w9, _ssig1(w7)), _add(w2, _ssig0(w10)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 41), w9)
            w10 = _add(_add(w10, _ssig1(w8)), _add(w3, _ssig0(w11)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 42), w10)
            w11 = _add(_add(w11, _ssig1(w9)), _add(w4, _ssig0(w12)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 43), w11)
            w12 = _add(_add(w12, _ssig1(w10)), _add(w5, _ssig0(w13)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 44), w12)
            w13 = _add(_add(w13, _ssig1(w11)), _add(w6, _ssig0(w14)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 45), w13)
            w14 = _add(_add(w14, _ssig1(w12)), _add(w7, _ssig0(w15)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 46), w14)
            w15 = _add(_add(w15, _ssig1(w13)), _add(w8, _ssig0(w0)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 47), w15)
            w0 = _add(_add(w0, _ssig1(w14)), _add(w9, _ssig0(w1)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 48), w0)
            w1 = _add(_add(w1, _ssig1(w15)), _add(w10, _ssig0(w2)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 49), w1)
            w2 = _add(_add(w2, _ssig1(w0)), _add(w11, _ssig0(w3)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 50), w2)
            w3 = _add(_add(w3, _ssig1(w1)), _add(w12, _ssig0(w4)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 51), w3)
            w4 = _add(_add(w4, _ssig1(w2)), _add(w13, _ssig0(w5)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 52), w4)
            w5 = _add(_add(w5, _ssig1(w3)), _add(w14, _ssig0(w6)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 53), w5)
            w6 = _add(_add(w6, _ssig1(w4)), _add(w15, _ssig0(w7)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 54), w6)
            w7 = _add(_add(w7, _ssig1(w5)), _add(w0, _ssig0(w8)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 55), w7)
            w8 = _add(_add(w8, _ssig1(w6)), _add(w1, _ssig0(w9)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 56), w8)
            w9 = _add(_add(w9, _ssig1(w7)), _add(w2, _ssig0(w10)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 57), w9)
            w10 = _add(_add(w10, _ssig1(w8)), _add(w3, _ssig0(w11)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 58), w10)
            w11 = _add(_add(w11, _ssig1(w9)), _add(w4, _ssig0(w12)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 59), w11)
            w12 = _add(_add(w12, _ssig1(w10)), _add(w5, _ssig0(w13)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 60), w12)
            w13 = _add(_add(w13, _ssig1(w11)), _add(w6, _ssig0(w14)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 61), w13)
            w14 = _add(_add(w14, _ssig1(w12)), _add(w7, _ssig0(w15)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 62), w14)
            w15 = _add(_add(w15, _ssig1(w13)), _add(w8, _ssig0(w0)))
            va, vb, vc, vd, ve, vf, vg, vh = _round(va, vb, vc, vd, ve, vf, vg, vh, _k(k_ptr, 63), w15)
            more = blk < blocks  # a lane whose chunk has ended keeps its state
            h0 = tl.where(more, _add(h0, va), h0)
            h1 = tl.where(more, _add(h1, vb), h1)
            h2 = tl.where(more, _add(h2, vc), h2)
            h3 = tl.where(more, _add(h3, vd), h3)
            h4 = tl.where(more, _add(h4, ve), h4)
            h5 = tl.where(more, _add(h5, vf), h5)
            h6 = tl.where(more, _add(h6, vg), h6)
            h7 = tl.where(more, _add(h7, vh), h7)
        out = dst_ptr + lane.to(tl.int64) * 8
        tl.store(out + 0, _bswap(h0).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 1, _bswap(h1).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 2, _bswap(h2).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 3, _bswap(h3).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 4, _bswap(h4).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 5, _bswap(h5).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 6, _bswap(h6).to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 7, _bswap(h7).to(tl.int32, bitcast=True), mask=live)


def available() -> bool:
    """Whether Triton is importable (the kernel may run somewhere)."""
    return triton is not None


def runs_on(device: torch.device | str) -> bool:
    """Whether the kernel runs on this device: a CUDA device Triton supports (with the sparse log's
    kernels' switches, :func:`game.training.numerics.cuda_kernels.runs_on`), or any device while Triton's
    interpreter runs (tests)."""
    if triton is None:
        return False
    from game.training.numerics import cuda_kernels  # its Triton import guard, read once

    return cuda_kernels.runs_on(torch.device(device))


def interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter: ``TRITON_INTERPRET=1`` when this module was
    imported. Import it only for a CUDA state (as :mod:`~game.training.numerics.bandcheck` does
    :mod:`~game.training.numerics.cuda_kernels`) so that a test's setting counts; the kernel uses Triton's
    builtins only, so a module imported too early can be reloaded once the variable is set."""
    return triton is not None and _interpreted(_sha256_chunks)


def _launch_device(device: torch.device) -> Any:
    """A context in which Triton launches on ``device`` (Triton takes the *current* CUDA device's
    stream, not the tensor's)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=16)
def _k_table(device: torch.device) -> Tensor:
    """The round constants on ``device`` (int32: their bits)."""
    signed = [k - (1 << 32) if k >= 1 << 31 else k for k in _K]
    return torch.tensor(signed, dtype=torch.int32, device=device)


def padded(n: int) -> int:
    """``n`` bytes rounded up to what a buffer the kernel reads is padded to (64 bytes)."""
    return -(-n // _PAD) * _PAD


def _words(buf: Tensor, total: int) -> Tensor:
    """The first ``total`` bytes of ``buf`` as int32 words the kernel may read whole (the last word
    may run past ``total``): ``buf`` itself where it allows, else a padded copy."""
    need = -(-total // 4) * 4
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"a level is a 1-d uint8 tensor, got {buf.dtype} of shape {tuple(buf.shape)}")
    if buf.numel() < total:
        raise ValueError(f"a level of {total} bytes in a tensor of {buf.numel()}")
    if buf.numel() >= need and buf.is_contiguous() and buf.storage_offset() % 4 == 0:
        return buf[:need].view(torch.int32)
    copy = torch.zeros(padded(total), dtype=torch.uint8, device=buf.device)
    copy[:total] = buf[:total]
    return copy.view(torch.int32)


def hash_chunks(words: Tensor, n_bytes: int, out: Tensor | None = None) -> Tensor:
    """The SHA-256 digests of the 4096-byte chunks of the first ``n_bytes`` bytes of ``words`` (int32,
    covering ``n_bytes`` rounded up to whole words), concatenated: a uint8 tensor of
    ``32 * ceil(n_bytes / 4096)`` bytes on the same device (one launch, nothing waited for)."""
    if triton is None:
        raise TrainingError("Triton is not installed: the device leaf cannot run")
    if n_bytes <= 0:
        raise ValueError(f"chunks of {n_bytes} bytes")
    if words.dtype != torch.int32 or words.numel() * 4 < n_bytes:
        raise ValueError("hash_chunks reads int32 words covering every byte")
    chunks = -(-n_bytes // _CHUNK)
    if out is None:
        out = torch.empty(chunks * _DIGEST, dtype=torch.uint8, device=words.device)
    max_blocks = (min(n_bytes, _CHUNK) + 9 + 63) // 64
    block = INTERPRETED_BLOCK if interpreted() else BLOCK
    with _launch_device(words.device):
        _sha256_chunks[(-(-chunks // block),)](
            words,
            out.view(torch.int32),
            _k_table(words.device),
            n_bytes,
            chunks,
            max_blocks,
            CHUNK=_CHUNK,
            BLOCK=block,
            num_warps=NUM_WARPS,
        )
    return out


def device_levels(buf: Tensor, total: int) -> Tensor:
    """The last level of ``total`` canonical bytes (the first ``total`` bytes of the uint8 tensor
    ``buf``), reduced on ``buf``'s device level by level (:func:`leafhash.level_sizes`): a uint8
    tensor of at most 4096 bytes there, ready for :func:`leafhash.finish`. Nothing is waited for."""
    sizes = leafhash.level_sizes(total)
    level = buf
    for size in sizes[:-1]:
        level = hash_chunks(_words(level, size), size)
    return level[: sizes[-1]]


__all__ = [
    "BLOCK",
    "available",
    "device_levels",
    "hash_chunks",
    "interpreted",
    "padded",
    "runs_on",
]
