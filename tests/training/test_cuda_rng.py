"""The Triton stream kernel against the torch code and the C kernel: the same words, bit for bit.

Without a GPU the kernel runs on CPU tensors in Triton's interpreter (set here before the module is
first imported); with one, on the GPU. The reference is ``rng.stream`` on CPU with the C kernel off
(the torch code), and the C kernel itself.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.errors import ConfigError
from game.training.native import library
from game.training.numerics import rng

from .test_rng import PHILOX_KAT, U32, ref_philox, ref_stream

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from game.training.numerics import cuda_rng  # noqa: E402  (Triton reads TRITON_INTERPRET at import)

DEV = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.skipif(not cuda_rng.available(), reason="Triton is not installed")

#: Program sizes: a small one, so that short streams cross program boundaries, and the real one.
BLOCKS = [8, cuda_rng.BLOCK]
#: Ids at the edges of the counter word, in no order, repeated.
EDGE_IDS = [2**32 - 1, 0, 7, 0, 2**31, 2**32 - 1, 1]


@contextlib.contextmanager
def _block(lanes: int) -> Iterator[None]:
    """Run the kernel with ``lanes`` lanes a program."""
    saved = cuda_rng.BLOCK
    cuda_rng.BLOCK = lanes
    try:
        yield
    finally:
        cuda_rng.BLOCK = saved


def _ids(values: list[int] | None) -> torch.Tensor | None:
    return None if values is None else torch.tensor(values, dtype=torch.int64)


def _kernel(seed: int, step: int, purpose: str, ids: torch.Tensor | None, count: int) -> torch.Tensor:
    words = cuda_rng.stream_words(step, ids, count, rng.purpose_key(seed, purpose), DEV)
    assert words is not None
    assert words.device.type == torch.device(DEV).type and words.dtype == torch.int64
    return words.cpu()


def _reference(seed: int, step: int, purpose: str, ids: torch.Tensor | None, count: int) -> torch.Tensor:
    with library.disabled():  # the torch code
        return rng.stream(seed, step, purpose, ids, count)


def _assert_all_equal(seed: int, step: int, purpose: str, ids: torch.Tensor | None, count: int) -> None:
    got = _kernel(seed, step, purpose, ids, count)
    want = _reference(seed, step, purpose, ids, count)
    assert got.shape == want.shape == (1 if ids is None else ids.numel(), count)
    assert torch.equal(got, want)
    if library.available():
        assert torch.equal(got, rng.stream(seed, step, purpose, ids, count))  # the C kernel


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    step=st.one_of(st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1]), U32),
    purpose=st.text(max_size=12),
    ids=st.one_of(
        st.none(),
        st.lists(st.one_of(st.sampled_from(EDGE_IDS), U32), max_size=6),
    ),
    count=st.one_of(st.integers(0, 9), st.integers(10, 200)),
    lanes=st.sampled_from(BLOCKS),
)
def test_kernel_equalsTorchAndC(seed, step, purpose, ids, count, lanes) -> None:
    with _block(lanes):
        _assert_all_equal(seed, step, purpose, _ids(ids), count)


@pytest.mark.parametrize("count", [1, 3, 4, 5, 8, 4 * cuda_rng.BLOCK * 2 + 5])
@pytest.mark.parametrize("ids", [None, [0], EDGE_IDS, list(range(40, 0, -3))])
def test_kernel_edgeCountsAndIds_equalTorchAndC(count, ids) -> None:
    # The largest count crosses programs (of BLOCK lanes, 4 words each) inside rows and between them.
    _assert_all_equal(42, 7, "dropout/drop", _ids(ids), count)


@pytest.mark.parametrize(("lanes", "examples"), [(64, 500), (cuda_rng.BLOCK, 3000)])
def test_kernel_manyShortRows_equalTorchAndC(lanes, examples) -> None:
    # data picks: one word for each of many examples, rows ending mid-program
    ids = torch.randperm(examples, generator=torch.Generator().manual_seed(0)).to(torch.int64) * 1_000_003
    with _block(lanes):
        for count in (1, 2, 7):
            _assert_all_equal(3, 11, "data", ids, count)


@pytest.mark.parametrize(("ctr", "key", "expected"), PHILOX_KAT)
def test_kernel_matchesRandom123KnownAnswers(ctr, key, expected) -> None:
    # Counter (step, id, block lo, block hi): the test hook's first block sets the last two words.
    c0, c1, c2, c3 = ctr
    out = torch.empty((1, 4), dtype=torch.int64, device=DEV)
    cuda_rng._launch(out, torch.tensor([c1], device=DEV), c0, 4, key, first_block=c2 | c3 << 32)
    assert tuple(out[0].tolist()) == expected


@pytest.mark.parametrize("first_block", [2**32 - 3, 2**40 + 5, 2**63 - 4])
def test_kernel_blockPastTwoToThe32_usesHighCounterWord(first_block) -> None:
    # Streams this long are never drawn whole: start the kernel near the block (count's) edge.
    key = rng.purpose_key(1, "p")
    ids = [5, 2**32 - 1]
    out = torch.empty((2, 14), dtype=torch.int64, device=DEV)
    with _block(8):
        cuda_rng._launch(out, torch.tensor(ids, device=DEV), 3, 14, key, first_block=first_block)
    for r, example in enumerate(ids):
        for p in range(14):
            b = first_block + p // 4
            assert int(out[r, p]) == ref_philox((3, example, b & 0xFFFFFFFF, b >> 32), key)[p % 4]


def test_kernel_followsDocumentedLayout() -> None:
    words = _kernel(9, 4, "init/w", torch.tensor([2**32 - 1, 0]), 11)
    for r, example in enumerate((2**32 - 1, 0)):
        assert words[r].tolist() == [ref_stream(9, 4, "init/w", example, i) for i in range(11)]


def test_kernel_emptyShapes() -> None:
    assert _kernel(1, 1, "x", torch.zeros(0, dtype=torch.int64), 5).shape == (0, 5)
    assert _kernel(1, 1, "x", torch.tensor([3, 4]), 0).shape == (2, 0)
    assert _kernel(1, 1, "x", None, 0).shape == (1, 0)


def test_stream_offTheCpu_dispatchesToKernel(monkeypatch) -> None:
    """``rng.stream`` for a CUDA device draws with the kernel (without a GPU: redirected to the
    interpreter's CPU tensors), and every draw built on it gives the torch code's bits."""
    calls: list[torch.device] = []
    real = cuda_rng.stream_words

    def spy(step, ids, count, key, device):
        calls.append(torch.device(device))
        return real(step, ids, count, key, DEV)

    monkeypatch.setattr(cuda_rng, "stream_words", spy)
    ids = torch.tensor([0, 5, 2**32 - 1])
    got = rng.stream(42, 7, "dropout/drop", ids, 13, device="cuda")
    assert [d.type for d in calls] == ["cuda"]
    assert torch.equal(got.cpu(), _reference(42, 7, "dropout/drop", ids, 13))
    mask = rng.bernoulli_mask(1, 2, "dropout/m", ids, (3, 5), 0.25, device="cuda")
    with library.disabled():
        assert torch.equal(mask.cpu(), rng.bernoulli_mask(1, 2, "dropout/m", ids, (3, 5), 0.25))
    normal = rng.irwin_hall(1, 0, "init/n", None, (17,), device="cuda")
    with library.disabled():
        assert torch.equal(normal.cpu(), rng.irwin_hall(1, 0, "init/n", None, (17,)))
    assert len(calls) == 3


def test_stream_onCpu_neverUsesTriton(monkeypatch) -> None:
    """CPU draws take the C kernel or the torch code, even while Triton's interpreter runs."""
    calls: list[object] = []
    monkeypatch.setattr(cuda_rng, "stream_words", lambda *a: calls.append(a))
    rng.stream(1, 1, "x", torch.tensor([1, 2]), 9)
    rng.stream(1, 1, "x", None, 9, device="cpu")
    with library.disabled():
        rng.stream(1, 1, "x", torch.tensor([1, 2]), 9)
    assert calls == []


def test_switches_turnKernelOff(monkeypatch) -> None:
    ids = torch.tensor([1, 2])
    assert cuda_rng.stream_words(1, ids, 5, (1, 2), DEV) is not None
    with library.disabled():
        assert cuda_rng.stream_words(1, ids, 5, (1, 2), DEV) is None
    monkeypatch.setenv("VGAME_NATIVE", "0")
    assert not cuda_rng.available()
    assert cuda_rng.stream_words(1, ids, 5, (1, 2), DEV) is None


def test_otherDevices_runTorchCode(monkeypatch) -> None:
    # A device the kernel does not take (here: meta) gets the torch code's tensor on that device.
    assert not cuda_rng.runs_on(torch.device("meta"))
    torch_calls: list[int] = []
    real = rng.philox4x32
    monkeypatch.setattr(rng, "philox4x32", lambda *a: (torch_calls.append(1), real(*a))[1])
    out = rng.stream(1, 1, "x", None, 9, device="meta")
    assert out.device.type == "meta" and out.shape == (1, 9) and torch_calls == [1]


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_cuda_kernelOff_torchCodeOnGpu_sameBits(monkeypatch) -> None:
    ids = torch.arange(64, dtype=torch.int64)
    fast = rng.stream(11, 5, "dropout/x", ids.cuda(), 1001)
    monkeypatch.setenv("VGAME_NATIVE", "0")
    slow = rng.stream(11, 5, "dropout/x", ids.cuda(), 1001)
    assert fast.is_cuda and slow.is_cuda
    assert torch.equal(fast, slow)
    assert torch.equal(fast.cpu(), _reference(11, 5, "dropout/x", ids, 1001))


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_cuda_idsChangedAfterACheck_areCheckedAgain() -> None:
    # Device ids are range-checked once while unchanged (a check is a host synchronisation); a
    # tensor changed in place since (its version moved) is checked again, and refused when wrong.
    ids = torch.arange(8, dtype=torch.int64, device="cuda")
    rng.stream(3, 1, "x", ids, 4)
    rng.stream(3, 1, "x", ids, 4)  # the same tensor, unchanged: no second check needed
    ids[0] = -1
    with pytest.raises(ConfigError, match="must lie in"):
        rng.stream(3, 1, "x", ids, 4)


# --------------------------------------------------------------------------------------------------
# Dropout's scaled keep mask in one pass (rng.scaled_keep)
# --------------------------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float64 tensor's bits: equal bits, not equal values (+0 and -0 differ)."""
    return t.cpu().contiguous().view(torch.int64)


def _mask_times(seed, step, purpose, ids, shape, p, value) -> torch.Tensor:
    """The reference: the torch code's keep mask, converted and multiplied as dropout did."""
    with library.disabled():
        return rng.bernoulli_mask(seed, step, purpose, ids, shape, p).to(torch.float64) * value


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    step=U32,
    ids=st.one_of(st.none(), st.lists(st.one_of(st.sampled_from(EDGE_IDS), U32), max_size=5)),
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    p=st.one_of(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), st.floats(0.0, 1.0)),
    value=st.floats(2.0**-1000, 2.0**1000),
    lanes=st.sampled_from(BLOCKS),
)
def test_scaledKeep_kernelCAndTorch_giveTheMaskTimesTheValue_bitForBit(
    seed, step, ids, shape, p, value, lanes
):
    """The Triton kernel, the C kernel and the torch code each give ``bernoulli_mask(...) * value``
    as float64, bit for bit, from the same words: what dropout's step computed before."""
    ids_t = _ids(ids)
    want = _mask_times(seed, step, "torch/0/dropout", ids_t, shape, p, value)
    threshold, key = math.ceil(p * 2**32), rng.purpose_key(seed, "torch/0/dropout")
    with _block(lanes):
        got = cuda_rng.scaled_keep(step, ids_t, math.prod(shape), key, threshold, value, DEV)
    assert got is not None and got.dtype == torch.float64
    assert torch.equal(_bits(got.reshape(want.shape)), _bits(want))
    with library.disabled():
        assert torch.equal(
            _bits(rng.scaled_keep(seed, step, "torch/0/dropout", ids_t, shape, p, value)), _bits(want)
        )
    if library.available():
        c = rng.scaled_keep(seed, step, "torch/0/dropout", ids_t, shape, p, value)
        assert c.shape == want.shape and torch.equal(_bits(c), _bits(want))


def test_scaledKeep_offTheCpu_isOneLaunchOfTheKernel(monkeypatch) -> None:
    """For a CUDA device the mask is the kernel's (without a GPU: redirected to the interpreter's
    CPU tensors), one call a draw, with no stream words drawn apart; on CPU it never is."""
    calls: list[torch.device] = []
    real = cuda_rng.scaled_keep

    def spy(step, ids, count, key, threshold, value, device):
        calls.append(torch.device(device))
        return real(step, ids, count, key, threshold, value, DEV)

    monkeypatch.setattr(cuda_rng, "scaled_keep", spy)
    monkeypatch.setattr(cuda_rng, "stream_words", lambda *a: pytest.fail("words drawn apart"))
    ids = torch.tensor([0, 5, 2**32 - 1])
    got = rng.scaled_keep(1, 2, "torch/3/dropout", ids, (3, 5), 0.75, 4 / 3, device="cuda")
    assert [d.type for d in calls] == ["cuda"]
    assert torch.equal(_bits(got), _bits(_mask_times(1, 2, "torch/3/dropout", ids, (3, 5), 0.75, 4 / 3)))
    rng.scaled_keep(1, 2, "torch/3/dropout", ids, (3, 5), 0.75, 4 / 3)
    with library.disabled():
        monkeypatch.undo()
        monkeypatch.setattr(cuda_rng, "scaled_keep", spy)
        rng.scaled_keep(1, 2, "torch/3/dropout", ids, (3, 5), 0.75, 4 / 3)
    assert len(calls) == 1
