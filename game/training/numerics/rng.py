"""Counter-based randomness: every draw is a pure function of (seed, step, purpose, example, element).

Why: torch's generators are stateful and their output depends on the device (CUDA's Philox layout
changes with the GPU model) and on how work is split. Here each value is Philox4x32-10 (Salmon et
al. 2011, the Random123 reference algorithm) of a counter built from *where* the value is used, so
it is identical on CPU and CUDA, for any thread count and any batch layout: computing examples 0..7
at once gives the same bits as 0..3 then 4..7.

Layout (``RNG_FORMAT``):

* key (2 x 32 bits) = first 8 bytes of ``sha256(b"vgame-rng-v1\\0" || seed as uint64 LE || purpose)``,
  read as two little-endian uint32;
* each (key, step, example id) has a *stream* of uint32 words: position ``i`` is word ``i % 4`` of
  Philox4x32-10 at counter ``(step, example id, (i // 4) mod 2**32, (i // 4) >> 32)``;
* a draw that needs ``k`` words per element gives element ``j`` (row-major within the example) the
  positions ``k*j .. k*j + k - 1``: 1 word for masks and integer picks, 2 (high word first) for
  53-bit uniforms, 12 for Irwin-Hall normals;
* draws without an example (initialisation) use example id 0.

All arithmetic is on non-negative int64 tensors holding values below 2**49 (32-bit words, the
multiplier split into 16-bit halves), so no operation overflows or depends on signed shifts: the
same ops give the same bits on every device torch supports. The rounds work in place (large
temporaries cost more than the arithmetic on a CPU). On CPU a C kernel
(:func:`game.training.native.bindings.philox_stream`) draws the same words (1.5 ms a gpt-shakespeare step
instead of 19); on a CUDA device a Triton kernel (:func:`game.training.numerics.cuda_rng.stream_words`) does,
in one launch a draw instead of some 240 tiny ones. The torch code is their reference (the tests
hold both to it bit for bit) and runs on other devices, without a C compiler or Triton, with
``VGAME_NATIVE=0`` and inside ``native.library.disabled()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import weakref
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

from game.errors import ConfigError
from game.training.native import bindings, front

RNG_FORMAT = b"vgame-rng-v1\0"

_MASK32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_PHILOX_ROUNDS = 10
_TWO_M53 = 2.0**-53
_TWO_M32 = 2.0**-32


def purpose_key(seed: int, purpose: str) -> tuple[int, int]:
    """The Philox key for a (task seed, purpose) pair; purposes name what a draw is for."""
    if not 0 <= seed < 2**64:
        raise ConfigError(f"seed: {seed} is outside 0..2**64-1")
    digest = hashlib.sha256(RNG_FORMAT + seed.to_bytes(8, "little") + purpose.encode("utf-8")).digest()
    return int.from_bytes(digest[0:4], "little"), int.from_bytes(digest[4:8], "little")


def _mulhilo_(a: Tensor, m: int) -> Tensor:
    """In place: ``a`` (32-bit words) becomes the high word of ``a * m``; returns the low word.

    The product is never formed: with ``m = mh * 2**16 + ml`` both partial products stay below 2**48.
    """
    lo = a * (m & 0xFFFF)  # p_lo < 2**48
    a.mul_(m >> 16)  # p_hi < 2**48; a * m = p_hi * 2**16 + p_lo
    t = a & 0xFFFF
    t.bitwise_left_shift_(16).add_(lo)  # t = (p_hi mod 2**16) * 2**16 + p_lo < 2**49
    a.bitwise_right_shift_(16).add_(t.bitwise_right_shift(32))  # high word
    return t.bitwise_and_(_MASK32)  # low word


def philox4x32(
    counter: tuple[Tensor, Tensor, Tensor, Tensor], key: tuple[int, int], rounds: int = _PHILOX_ROUNDS
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32 on int64 tensors holding uint32 words (all four the same shape; inputs untouched)."""
    c0, c1, c2, c3 = (c.clone() for c in counter)
    k0, k1 = key
    for _ in range(rounds):
        lo0 = _mulhilo_(c0, _PHILOX_M0)  # c0 now holds hi0
        lo1 = _mulhilo_(c2, _PHILOX_M1)  # c2 now holds hi1
        n0 = c2.bitwise_xor_(c1).bitwise_xor_(k0)
        n2 = c0.bitwise_xor_(c3).bitwise_xor_(k1)
        c0, c1, c2, c3 = n0, lo1, n2, lo0
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


#: The tensor of example ids checked last, and its version counter then: a step draws with one
#: batch's ids many times (dropout in every layer), and a range check of a tensor on a GPU is a
#: host synchronisation (on CPU two reductions, some 10 us a draw), so it is made once a batch
#: instead of twice a draw. (A weak reference to the tensor itself: tensors compare element by
#: element, so they cannot be keys of a dict.)
_last_checked: tuple[weakref.ref[Tensor], int] | None = None


def _check_ids(step: int, example_ids: Tensor | None) -> None:
    global _last_checked
    if not 0 <= step <= _MASK32:
        raise ConfigError(f"step: {step} does not fit the RNG's 32-bit counter word")
    if example_ids is None:
        return
    if example_ids.dtype != torch.int64 or example_ids.dim() != 1:
        raise ConfigError("example_ids: expected a 1-D int64 tensor")
    last = _last_checked
    if last is not None and last[0]() is example_ids and last[1] == example_ids._version:
        return
    _check_range(example_ids)
    _last_checked = (weakref.ref(example_ids), example_ids._version)


def _check_range(example_ids: Tensor) -> None:
    if example_ids.numel() and (int(example_ids.min()) < 0 or int(example_ids.max()) > _MASK32):
        raise ConfigError("example_ids: ids must lie in 0..2**32-1")


def _device(example_ids: Tensor | None, device: torch.device | str | None) -> torch.device:
    """The device a draw's words are made on: ``device``, else ``example_ids``' (else the CPU)."""
    if device is None:
        return example_ids.device if example_ids is not None else torch.device("cpu")
    return torch.device(device)


def stream(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    count: int,
    device: torch.device | str | None = None,
) -> Tensor:
    """Positions ``0 .. count-1`` of each example's uint32 stream: int64 ``[len(example_ids), count]``
    (one row, example id 0, when ``example_ids`` is None).

    The device defaults to the device of ``example_ids`` (else CPU); the bits never depend on it.
    The words come from the C kernel on CPU, the Triton kernel on a CUDA device it runs on, else
    the torch code below (their reference).
    """
    _check_ids(step, example_ids)
    device = _device(example_ids, device)
    if device.type == "cpu":
        ids_cpu = example_ids.cpu() if example_ids is not None else None
        fast = bindings.philox_stream(step, ids_cpu, count, purpose_key(seed, purpose))
        if fast is not None:  # the C kernel: the same words, some 40 times faster
            return fast
    else:
        from game.training.numerics import cuda_rng  # imports Triton: only off the CPU

        drawn = cuda_rng.stream_words(step, example_ids, count, purpose_key(seed, purpose), device)
        if drawn is not None:  # the Triton kernel: the same words in one launch
            return drawn
    ids = (
        torch.zeros(1, dtype=torch.int64, device=device)
        if example_ids is None
        else example_ids.to(device=device, dtype=torch.int64)
    )
    blocks = (count + 3) // 4
    block = torch.arange(blocks, dtype=torch.int64, device=device)
    size = (ids.numel(), blocks)
    c0 = torch.full(size, step, dtype=torch.int64, device=device)
    c1 = ids.unsqueeze(1).expand(size)
    c2 = (block & _MASK32).unsqueeze(0).expand(size)
    c3 = (block >> 32).unsqueeze(0).expand(size)
    words = philox4x32((c0, c1, c2, c3), purpose_key(seed, purpose))
    return torch.stack(words, dim=2).reshape(size[0], 4 * blocks)[:, :count]


class _Depth(threading.local):
    """How deep this thread is in :func:`suspended` (each thread has its own modes)."""

    n = 0


_depth = _Depth()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Neither the dispatch modes, the C++ front nor any function mode (a user's ``torch.device``
    context, say) see the ops inside: a draw is integer arithmetic on explicit devices, the same
    whatever is on. Inside another, it does nothing: a served draw suspends once around its own ops
    and the words', where each suspending again cost some 7 us a draw (more with the step's modes
    on their stack), 37 draws a GPT-2-shape step."""
    if _depth.n:
        yield
        return
    with _disable_current_modes(), front.suspended(), torch._C.DisableTorchFunction():
        _depth.n += 1
        try:
            yield
        finally:
            _depth.n -= 1


def _words(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    k: int,
    device: torch.device | str | None,
) -> Tensor:
    """``k`` stream words per element: shape ``(len(example_ids), *shape, k)``, or ``(*shape, k)``.

    Computed with any dispatch mode (and the C++ front) suspended: the words are pure integer
    arithmetic, identical with or without the rounding interceptor (which leaves integer results
    alone), and dropout would otherwise send some 200 tiny integer ops per call through Python one
    by one. Function modes are off too: a step's stock-op mode (``dispatch/stockops.py``) must never
    see the RNG's own torch calls, and a user's ``torch.device`` context must not move them.
    """
    n = math.prod(shape)
    with suspended():
        flat = stream(seed, step, purpose, example_ids, n * k, device)
    out_shape = (*shape, k) if example_ids is None else (flat.shape[0], *shape, k)
    return flat.reshape(out_shape)


def random_u32(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    device: torch.device | str | None = None,
) -> Tensor:
    """Uniform integers in ``[0, 2**32)`` (int64): shape ``(len(example_ids), *shape)``, or ``shape``."""
    return _words(seed, step, purpose, example_ids, shape, 1, device).squeeze(-1)


def uniform_int53(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    device: torch.device | str | None = None,
) -> Tensor:
    """Uniform integers in ``[0, 2**53)``: the top 53 bits of two stream words (high word first)."""
    w = _words(seed, step, purpose, example_ids, shape, 2, device)
    return (w[..., 0] << 21) | (w[..., 1] >> 11)


def uniform(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    device: torch.device | str | None = None,
) -> Tensor:
    """Uniform float64 in ``[0, 1)``, exactly ``(u64 >> 11) * 2**-53`` (no rounding anywhere)."""
    return uniform_int53(seed, step, purpose, example_ids, shape, device).to(torch.float64) * _TWO_M53


def bernoulli_mask(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    p: float,
    device: torch.device | str | None = None,
) -> Tensor:
    """Boolean mask, True with probability ``ceil(p * 2**32) / 2**32``: one stream word per element.

    Decided on integers only: ``word < ceil(p * 2**32)``, i.e. ``word * 2**-32 < p`` exactly.
    """
    return random_u32(seed, step, purpose, example_ids, shape, device) < _threshold(p)


def _threshold(p: float) -> int:
    """The keep threshold of probability ``p``: ``ceil(p * 2**32)``, exact (``p * 2**32`` only moves
    the exponent)."""
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"p: {p} is outside [0, 1]")
    return math.ceil(p * 2**32)


def scaled_keep(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    p: float,
    value: float,
    device: torch.device | str | None = None,
) -> Tensor:
    """Dropout's scaled keep mask: float64 ``value`` where :func:`bernoulli_mask` (of the same
    arguments) is True, else +0, in :func:`random_u32`'s shape. These are the values of
    ``bernoulli_mask(...).to(torch.float64) * value`` (a product by 1 or 0 is exact), made in one
    pass by the C kernel on CPU and in one launch by the Triton kernel on a CUDA device it runs on;
    elsewhere by that torch code, their reference.

    Why: a served dropout made its mask as int64 words, then a compare, a conversion and a product:
    four passes over the mask and three tensors more, some 0.1 ms of a gpt-shakespeare draw on
    CPU, and on a GPU four launches a draw, 37 draws a GPT-2-shape step."""
    threshold, n = _threshold(p), math.prod(shape)
    _check_ids(step, example_ids)
    device = _device(example_ids, device)
    key = purpose_key(seed, purpose)
    with suspended():
        if device.type == "cpu":
            ids = example_ids.cpu() if example_ids is not None else None
            flat = bindings.philox_scaled_keep(step, ids, n, key, threshold, value)
        else:
            from game.training.numerics import cuda_rng  # imports Triton: only off the CPU

            flat = cuda_rng.scaled_keep(step, example_ids, n, key, threshold, value, device)
        if flat is None:
            words = stream(seed, step, purpose, example_ids, n, device)
            flat = (words < threshold).to(torch.float64).mul_(value)
    return flat.reshape(tuple(shape) if example_ids is None else (flat.shape[0], *shape))


def randbelow(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    n: int,
    device: torch.device | str | None = None,
) -> Tensor:
    """Integers in ``[0, n)`` as ``(word * n) >> 32`` (Lemire's multiply-shift; bias below n / 2**32)."""
    if not 1 <= n < 2**31:
        raise ConfigError(f"n: {n} is outside 1..2**31-1")
    return (random_u32(seed, step, purpose, example_ids, shape, device) * n) >> 32


def irwin_hall(
    seed: int,
    step: int,
    purpose: str,
    example_ids: Tensor | None,
    shape: Sequence[int],
    device: torch.device | str | None = None,
) -> Tensor:
    """Approximately standard normal float64: the sum of 12 uniform 32-bit words, scaled, minus 6.

    No transcendental functions (Box-Muller's log and cos round differently across libms): the sum
    is an exact integer below 2**36, and scaling by 2**-32 and subtracting 6 are exact in float64.
    """
    total = _words(seed, step, purpose, example_ids, shape, 12, device).sum(dim=-1)  # exact integer sum
    return total.to(torch.float64) * _TWO_M32 - 6.0


def permutation(seed: int, step: int, purpose: str, n: int) -> Tensor:
    """A keyed random permutation of ``range(n)`` (CPU int64): a stable argsort of 53-bit keys."""
    keys = uniform_int53(seed, step, purpose, None, (n,))
    return torch.sort(keys, stable=True).indices


__all__ = [
    "RNG_FORMAT",
    "bernoulli_mask",
    "irwin_hall",
    "permutation",
    "philox4x32",
    "purpose_key",
    "randbelow",
    "random_u32",
    "scaled_keep",
    "stream",
    "uniform",
    "uniform_int53",
]
