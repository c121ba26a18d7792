"""Trit packing: the rounding directions of a packed chunk, 1.586 bits each.

The packed chunk (:mod:`~game.training.log.packed`) stores every record's trits concatenated, in
blocks of 116: four groups of 29 trits, a group's value sum(t_i 3^i) < 3^29 < 2^46, the block the
184-bit little-endian integer g0 + g1 2^46 + g2 2^92 + g3 2^138 in 23 bytes; then the last (count
mod 116) trits 5 per byte (radix 3, first trit least significant), unused digits zero. That is 1.586
bits per trit (log2 3 = 1.585) against the paper's 1.6 at five per byte. Chunks of the first layout
(``vgame-log-v1``) hold every trit 5 per byte (:func:`pack_trits_v1`). The C kernels
(:mod:`game.training.native`) pack and unpack the blocks where they run, numpy elsewhere, to the
same bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from game.errors import RoundingLogError
from game.training.native import bindings

TRITS_PER_BYTE = 5  # the tail of a chunk, and every trit of a v1 chunk
MAX_BYTE = 3**TRITS_PER_BYTE - 1  # 242
GROUP_TRITS, GROUP_BITS = 29, 46  # 3**29 = 68,630,377,364,883 < 2**46
BLOCK_GROUPS = 4
BLOCK_TRITS = GROUP_TRITS * BLOCK_GROUPS  # 116
BLOCK_BYTES = GROUP_BITS * BLOCK_GROUPS // 8  # 23: four groups fill whole bytes
MAX_GROUP = 3**GROUP_TRITS - 1


class TritPackingError(RoundingLogError, ValueError):
    """Trits outside 0..2, or packed bytes of the wrong length, above 242 or with nonzero padding."""


# Row b holds the 5 radix-3 digits of byte b, least significant first.
_DIGITS = np.array([[(b // 3**i) % 3 for i in range(TRITS_PER_BYTE)] for b in range(256)], dtype=np.uint8)
_U64 = np.dtype("<u8")


def packed_size(count: int) -> int:
    """Bytes ``count`` trits take: 23 per whole block of 116, then ``ceil(rest / 5)``."""
    blocks, rest = divmod(count, BLOCK_TRITS)
    return blocks * BLOCK_BYTES + packed_size_v1(rest)


def packed_size_v1(count: int) -> int:
    """Bytes ``count`` trits take 5 per byte (the tail, and v1 chunks): ``ceil(count / 5)``."""
    return -(-count // TRITS_PER_BYTE)


def _flat_trits(trits: torch.Tensor) -> np.ndarray:
    flat = trits.detach().reshape(-1).to(device="cpu", dtype=torch.uint8).numpy()
    if flat.size and int(flat.max()) > 2:
        bad = int(np.argmax(flat > 2))
        raise TritPackingError(f"trit {bad} is {int(flat[bad])}; trits are 0 (down), 1 (ignore), 2 (up)")
    return flat


def pack_trits(trits: torch.Tensor) -> bytes:
    """Pack uint8 trits (any shape, row-major order): whole blocks of 116 in 23 bytes, the rest 5 per
    byte (see the module docstring). The C kernel packs the blocks when it is there, else numpy."""
    flat = _flat_trits(trits)
    blocks = flat.size // BLOCK_TRITS
    body = bindings.pack_trit_blocks(flat, blocks)
    if body is None:
        body = _pack_blocks(flat, blocks)
    return body + _pack5(flat[blocks * BLOCK_TRITS :])


def _pack_blocks(flat: np.ndarray, blocks: int) -> bytes:
    head = flat[: blocks * BLOCK_TRITS].reshape(blocks * BLOCK_GROUPS, GROUP_TRITS)
    # Horner from the most significant digit; a group stays below 3**29 < 2**46.
    acc = head[:, GROUP_TRITS - 1].astype(np.uint64)
    for i in range(GROUP_TRITS - 2, -1, -1):
        acc *= np.uint64(3)
        acc += head[:, i]
    g = acc.reshape(blocks, BLOCK_GROUPS)
    # The 184-bit block g0 + g1 2^46 + g2 2^92 + g3 2^138 as three 64-bit words (the last has 56 bits).
    words = np.empty((blocks, 3), dtype=_U64)
    words[:, 0] = g[:, 0] | (g[:, 1] << np.uint64(46))
    words[:, 1] = (g[:, 1] >> np.uint64(18)) | (g[:, 2] << np.uint64(28))
    words[:, 2] = (g[:, 2] >> np.uint64(36)) | (g[:, 3] << np.uint64(10))
    return words.view(np.uint8).reshape(blocks, 24)[:, :BLOCK_BYTES].tobytes()


def _pack5(flat: np.ndarray) -> bytes:
    """Trits 5 per byte: ``t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4``, the last byte zero-padded."""
    n = packed_size_v1(flat.size)
    padded = np.zeros(n * TRITS_PER_BYTE, dtype=np.uint8)
    padded[: flat.size] = flat
    digits = padded.reshape(n, TRITS_PER_BYTE)
    # Horner from the most significant digit; every partial sum stays <= 242, so uint8 is enough.
    acc = digits[:, 4].copy()
    for i in (3, 2, 1, 0):
        acc *= 3
        acc += digits[:, i]
    return acc.tobytes()


def pack_trits_v1(trits: torch.Tensor) -> bytes:
    """Pack trits 5 per byte, every one (the v1 chunk layout and the paper's)."""
    return _pack5(_flat_trits(trits))


def unpack_trits(data: bytes | memoryview, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_trits`: ``count`` uint8 trits from exactly ``packed_size(count)`` bytes."""
    if count < 0:
        raise TritPackingError(f"trit count must be >= 0, got {count}")
    if len(data) != packed_size(count):
        raise TritPackingError(f"{count} trits pack into {packed_size(count)} bytes, got {len(data)}")
    blocks = count // BLOCK_TRITS
    buf = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(count, dtype=np.uint8)
    if not bindings.unpack_trit_blocks(buf, blocks, out):
        out[: blocks * BLOCK_TRITS] = _unpack_blocks(buf, blocks)
    done, done_bytes = blocks * BLOCK_TRITS, blocks * BLOCK_BYTES
    out[done:] = _unpack5(data[done_bytes:], count - done, done_bytes, done)
    return torch.from_numpy(out)


def _unpack_blocks(buf: np.ndarray, blocks: int) -> np.ndarray:
    raw = np.zeros((blocks, 24), dtype=np.uint8)
    raw[:, :BLOCK_BYTES] = buf[: blocks * BLOCK_BYTES].reshape(blocks, BLOCK_BYTES)
    w = raw.view(_U64)
    g = np.empty((blocks, BLOCK_GROUPS), dtype=np.uint64)
    g[:, 0] = w[:, 0] & np.uint64((1 << 46) - 1)
    g[:, 1] = (w[:, 0] >> np.uint64(46)) | ((w[:, 1] & np.uint64((1 << 28) - 1)) << np.uint64(18))
    g[:, 2] = (w[:, 1] >> np.uint64(28)) | ((w[:, 2] & np.uint64((1 << 10) - 1)) << np.uint64(36))
    g[:, 3] = w[:, 2] >> np.uint64(10)
    groups = g.reshape(-1)
    if groups.size and int(groups.max()) > MAX_GROUP:
        bad = int(np.argmax(groups > MAX_GROUP))
        raise TritPackingError(f"group {bad} (block {bad // BLOCK_GROUPS}) is above 3^29 - 1: not 29 trits")
    # Five digits at a time: the remainder by 243 is a byte whose digits _DIGITS holds.
    digits = np.empty((groups.size, 30), dtype=np.uint8)
    for k in range(6):
        digits[:, 5 * k : 5 * k + 5] = _DIGITS[(groups % np.uint64(243)).astype(np.uint8)]
        groups //= np.uint64(243)
    return digits[:, :GROUP_TRITS].reshape(-1)


def _unpack5(data: bytes | memoryview, count: int, byte0: int = 0, trit0: int = 0) -> np.ndarray:
    """``count`` trits 5 per byte; errors count bytes from ``byte0`` and trits from ``trit0``."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size and int(raw.max()) > MAX_BYTE:
        bad = int(np.argmax(raw > MAX_BYTE))
        raise TritPackingError(
            f"byte {byte0 + bad} is {int(raw[bad])}, above {MAX_BYTE} (not 5 radix-3 digits)"
        )
    digits = _DIGITS[raw].reshape(-1)
    if digits[count:].any():
        raise TritPackingError(f"padding digits after trit {trit0 + count} are not zero")
    return digits[:count]


def unpack_trits_v1(data: bytes | memoryview, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_trits_v1`: ``count`` trits from exactly ``ceil(count / 5)`` bytes."""
    if count < 0:
        raise TritPackingError(f"trit count must be >= 0, got {count}")
    if len(data) != packed_size_v1(count):
        raise TritPackingError(f"{count} trits pack into {packed_size_v1(count)} bytes, got {len(data)}")
    return torch.from_numpy(_unpack5(data, count).copy())
