"""The device leaf (``state/device_leaf.py``, ``state/sha256_kernel.py``) against the host: ``hashlib`` per chunk, ``leafhash`` per leaf,
``encode_state`` per byte, and the host path's error for a value off the grid.

Without a GPU the Triton kernel runs on CPU tensors in Triton's interpreter (set here before the
module is first imported); with one, on the GPU. The interpreter spends some 0.2 to 0.4 s on each
SHA-256 block a chunk takes in turn (a full chunk is 65 of them, whatever the number of chunks
side by side): a test that hashes a full chunk takes 15 to 30 s on CPU (the state's leaf, marked
slow, and the three levels, twice that, slow too), a short chunk a second or less.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from game.training.state import device_leaf, leafhash, sha256_kernel  # noqa: E402  (Triton reads TRITON_INTERPRET at import)
from game.training.state.canonical import encode_state  # noqa: E402
from game.training.state.tensors import OffGridError, TrainState, state_tensors  # noqa: E402

from .test_state import trained  # noqa: E402

if not ON_GPU and sha256_kernel.available() and not sha256_kernel.interpreted():
    sha256_kernel = importlib.reload(sha256_kernel)  # imported before this module set TRITON_INTERPRET

DEV = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.skipif(not sha256_kernel.available(), reason="Triton is not installed")
CHUNK = leafhash.CHUNK


def _random(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _on_device(data: bytes) -> torch.Tensor:
    """``data`` in a uint8 tensor on the device, zero-padded to a multiple of 64 bytes."""
    buf = torch.zeros(-(-len(data) // 64) * 64, dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf.to(DEV)


def _chunk_digests(data: bytes) -> bytes:
    return b"".join(hashlib.sha256(data[i : i + CHUNK]).digest() for i in range(0, len(data), CHUNK))


def _host(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


# --------------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------------

#: One chunk of every length mod 64 (1..64: the 0x80 byte and the bit length in the same block up
#: to 55 bytes, spilling into a second block from 56), and around the second block's boundaries.
RAGGED = [*range(1, 65), 119, 120, 127, 128, 129]


@pytest.mark.parametrize("n", RAGGED)
def test_kernel_raggedChunk_isHashlibSha256(n: int) -> None:
    data = _random(n, n)
    out = sha256_kernel.hash_chunks(_on_device(data).view(torch.int32), n)
    assert _host(out) == hashlib.sha256(data).digest()


def test_kernel_unpaddedBuffer_isCopiedNotOverread() -> None:
    """A level the caller did not pad (an odd length, an odd offset) is copied before the kernel
    reads whole words of it."""
    data = _random(77, 1)
    buf = torch.frombuffer(bytearray(b"x" + data), dtype=torch.uint8).to(DEV)[1:]
    assert _host(sha256_kernel.device_levels(buf, 77)) == data  # one level: the bytes themselves
    words = sha256_kernel._words(buf, 77)
    assert words.numel() * 4 >= 80 and words.data_ptr() != buf.data_ptr()
    assert _host(sha256_kernel.hash_chunks(words, 77)) == hashlib.sha256(data).digest()


#: Three full chunks (each exactly 4096 bytes: 64 blocks of data and one of padding) and a ragged
#: one: several lanes, the last one ending early, in one launch; two levels in all.
SEVERAL = 3 * CHUNK + 1000


@pytest.fixture(scope="module")
def several() -> tuple[bytes, torch.Tensor]:
    data = _random(SEVERAL, 3)
    return data, sha256_kernel.device_levels(_on_device(data), SEVERAL)


def test_kernel_severalChunks_areHashlibPerChunk(several: tuple[bytes, torch.Tensor]) -> None:
    data, level = several
    assert leafhash.level_sizes(SEVERAL) == [SEVERAL, 4 * 32]
    assert _host(level) == _chunk_digests(data)
    assert _host(level)[:32] == hashlib.sha256(data[:CHUNK]).digest()


def test_deviceLevels_twoLevels_isTheLeaf(several: tuple[bytes, torch.Tensor]) -> None:
    data, level = several
    assert leafhash.finish(_host(level), SEVERAL) == leafhash.leaf_of(data)


@pytest.mark.parametrize("n", [1, 100, CHUNK - 1, CHUNK])
def test_deviceLevels_oneLevel_isTheBytes(n: int) -> None:
    data = _random(n, n)
    level = sha256_kernel.device_levels(_on_device(data), n)
    assert _host(level) == data
    assert leafhash.finish(_host(level), n) == leafhash.leaf_of(data)


@pytest.mark.slow
def test_deviceLevels_threeLevels_isTheLeaf() -> None:
    """Over 512 KiB: 129 chunks, whose digests (4128 bytes) take a second level of hashing."""
    n = 128 * CHUNK + 5
    data = _random(n, 5)
    assert len(leafhash.level_sizes(n)) == 3
    level = sha256_kernel.device_levels(_on_device(data), n)
    assert _host(level) == leafhash.reduce_to_final(data)
    assert leafhash.finish(_host(level), n) == leafhash.leaf_of(data)


# --------------------------------------------------------------------------------------------------
# Canonical bytes and the leaf of a state
# --------------------------------------------------------------------------------------------------


def _to_device(state: TrainState) -> TrainState:
    """The state on the test's device (its optimizer's 0-dim step counters stay on the host)."""
    if ON_GPU:
        from game.training.state.tensors import move_state

        move_state(state, DEV)
    return state


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("mlp-digits", {"model": {"hidden": 2}}),  # one level
        ("cnn-digits", {}),  # int64 buffers (BatchNorm's counters)
        ("gpt-shakespeare", {}),  # AdamW: float32 step counters, on the host beside a GPU state
    ],
)
def test_canonicalBytesOnDevice_isEncodeState(preset: str, overrides: dict[str, Any]) -> None:
    _, state = trained(preset, **overrides)
    state = _to_device(state)
    buf, off_grid = device_leaf.canonical_bytes_on_device(state)
    assert buf.device.type == DEV and buf.dtype == torch.uint8
    assert _host(buf) == encode_state(state)
    assert off_grid.dim() == 0 and not bool(off_grid)


class _Assorted(nn.Module):
    """Every dtype the canonical bytes know, 0-dim, empty and strided tensors."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(5, 3, generator=g, dtype=torch.float64).float().double())
        strided = torch.randn(4, 6, generator=g).double().t()  # float32 values, column-major
        self.register_buffer("strided", strided)
        self.register_buffer("empty", torch.zeros(0, 3, dtype=torch.float64))
        self.register_buffer("scalar", torch.tensor(-0.0, dtype=torch.float64))
        self.register_buffer("f32", torch.randn(3, generator=g))
        self.register_buffer("f16", torch.randn(3, generator=g).half())
        self.register_buffer("bf16", torch.randn(3, generator=g).bfloat16())
        self.register_buffer("i64", torch.tensor([1, -(2**40), 3]))
        self.register_buffer("i32", torch.tensor([-7, 8], dtype=torch.int32))
        self.register_buffer("i16", torch.tensor([-7, 8, 9], dtype=torch.int16))
        self.register_buffer("i8", torch.tensor([-1], dtype=torch.int8))
        self.register_buffer("u8", torch.tensor([255, 0, 1], dtype=torch.uint8))
        self.register_buffer("flags", torch.tensor([True, False, True]))


def _assorted() -> TrainState:
    model = _Assorted().to(DEV)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainState(model=model, optimizer=optimizer, step=7)


def test_canonicalBytesOnDevice_everyDtype_isEncodeState() -> None:
    state = _assorted()
    assert not state_tensors(state)["buffer/strided"].is_contiguous()
    buf, off_grid = device_leaf.canonical_bytes_on_device(state)
    assert _host(buf) == encode_state(state)
    assert not bool(off_grid)
    leaf = device_leaf.DeviceLeaf.start(state)  # one level: no kernel
    assert leaf.leaf() == leafhash.leaf_of(encode_state(state))


def test_canonicalBytesOnDevice_noFloat64Values_isEncodeState() -> None:
    """Float64 tensors that hold no values (and none at all): nothing to convert or check."""
    for empty in (torch.zeros(0, 2, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)):
        model = nn.Module()
        model.p = nn.Parameter(empty.to(DEV), requires_grad=empty.is_floating_point())
        model.register_buffer("flags", torch.tensor([True, False], device=DEV))
        state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=1)
        buf, off_grid = device_leaf.canonical_bytes_on_device(state)
        assert _host(buf) == encode_state(state)
        assert not bool(off_grid)
        assert device_leaf.DeviceLeaf.start(state).leaf() == leafhash.leaf_of(encode_state(state))


def test_canonicalBytesOnDevice_tensorsOnTheHost_travelTogether(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors not on the state's device (an optimizer's step counters beside a GPU state) and the
    step number go over in one buffer: here every tensor is made to, float64 ones among them."""
    state = _assorted()
    calls: list[int] = []
    real = device_leaf._to_device

    def everything_away(
        step: torch.Tensor, tensors: list[torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        calls.append(len(tensors))
        return real(step, tensors, device, away=list(range(len(tensors))))

    monkeypatch.setattr(device_leaf, "_to_device", everything_away)
    buf, off_grid = device_leaf.canonical_bytes_on_device(state)
    assert calls == [len(state_tensors(state))]
    assert _host(buf) == encode_state(state)
    assert not bool(off_grid)


@pytest.mark.slow
def test_deviceLeaf_ofAState_isTheHostLeaf() -> None:
    """gpt-shakespeare's small state: 209 KB of canonical bytes, two levels."""
    _, state = trained("gpt-shakespeare")
    state = _to_device(state)
    data = encode_state(state)
    assert len(leafhash.level_sizes(len(data))) == 2
    pending = device_leaf.DeviceLeaf.start(state)
    with torch.no_grad():  # the state may change once the leaf is on its way
        for t in state_tensors(state).values():
            t.zero_()
    assert pending.leaf() == leafhash.leaf_of(data)
    assert pending.leaf() == leafhash.leaf_of(data)  # kept
    assert pending.canonical_bytes().tobytes() == data
    assert isinstance(pending.canonical_bytes(), np.ndarray)


def _off_grid_state() -> TrainState:
    """A one-level state (no kernel) with values off the float32 grid in two tensors."""
    _, state = trained("mlp-digits", model={"hidden": 2})
    state = _to_device(state)
    with torch.no_grad():
        tensors = state_tensors(state)
        tensors["param/fc2.weight"].view(-1)[3] = 1.0 / 3.0
        tensors["param/fc1.bias"].view(-1)[1] = 1.0 + 2.0**-40
    return state


def test_deviceLeaf_offGrid_raisesTheHostError() -> None:
    state = _off_grid_state()
    with pytest.raises(OffGridError) as host:
        encode_state(state)
    _, off_grid = device_leaf.canonical_bytes_on_device(state)
    assert bool(off_grid)
    pending = device_leaf.DeviceLeaf.start(state)  # raises only when the leaf is asked for
    with pytest.raises(OffGridError) as device:
        pending.leaf()
    assert "param/fc1.bias" in str(device.value)  # the first in name order
    assert str(device.value) == str(host.value)


def test_deviceLeaf_nan_raisesTheHostError() -> None:
    _, state = trained("mlp-digits", model={"hidden": 2})
    state = _to_device(state)
    with torch.no_grad():
        state_tensors(state)["param/fc2.bias"].view(-1)[0] = float("nan")
    with pytest.raises(OffGridError) as host:
        encode_state(state)
    with pytest.raises(OffGridError) as device:
        device_leaf.DeviceLeaf.start(state).leaf()
    assert str(device.value) == str(host.value)
