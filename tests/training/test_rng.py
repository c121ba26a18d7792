"""Counter-based RNG: Philox known answers, a pure-Python reference, layout independence, uniformity."""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from game.errors import ConfigError
from game.training.native import library
from game.training.numerics import rng

U32 = st.integers(0, 2**32 - 1)

# Random123's published known-answer vectors for Philox4x32-10 (tests/kat_vectors).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def ref_philox(ctr: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Philox4x32-10 with Python integers: slow and obvious."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def ref_stream(seed: int, step: int, purpose: str, example: int, i: int) -> int:
    """Position ``i`` of an example's word stream, from the module docstring, in plain Python."""
    digest = hashlib.sha256(b"vgame-rng-v1\0" + seed.to_bytes(8, "little") + purpose.encode()).digest()
    key = (int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:8], "little"))
    block = i // 4
    return ref_philox((step, example, block & 0xFFFFFFFF, block >> 32), key)[i % 4]


def _words(*values: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t = [torch.tensor([v], dtype=torch.int64) for v in values]
    return t[0], t[1], t[2], t[3]


@pytest.mark.parametrize(("ctr", "key", "expected"), PHILOX_KAT)
def test_philox_matchesRandom123KnownAnswers(ctr, key, expected) -> None:
    out = rng.philox4x32(_words(*ctr), key)
    assert tuple(int(w) for w in out) == expected
    assert ref_philox(ctr, key) == expected


@settings(max_examples=200, deadline=None)
@given(st.tuples(U32, U32, U32, U32), st.tuples(U32, U32))
def test_philox_tensorEqualsPythonReference(ctr, key) -> None:
    out = rng.philox4x32(_words(*ctr), key)
    assert tuple(int(w) for w in out) == ref_philox(ctr, key)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    step=U32,
    example=U32,
    j=st.integers(0, 6),
    purpose=st.text(max_size=12),
)
def test_draws_followDocumentedStreamLayout(seed, step, example, j, purpose) -> None:
    ids = torch.tensor([example])
    ref = functools.partial(ref_stream, seed, step, purpose, example)
    assert int(rng.random_u32(seed, step, purpose, ids, (7,))[0, j]) == ref(j)
    word53 = (ref(2 * j) << 32 | ref(2 * j + 1)) >> 11
    assert int(rng.uniform_int53(seed, step, purpose, ids, (7,))[0, j]) == word53
    normal = sum(ref(12 * j + k) for k in range(12)) * 2.0**-32 - 6.0
    assert float(rng.irwin_hall(seed, step, purpose, ids, (7,))[0, j]) == normal


@pytest.mark.skipif(not library.available(), reason="no C compiler: the torch code is the only path")
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    step=U32,
    ids=st.one_of(st.none(), st.lists(U32, max_size=5)),
    count=st.integers(0, 70),
)
def test_stream_cKernelGivesTheTorchCodesWords(seed, step, ids, count) -> None:
    """On CPU the C kernel draws the stream; the torch code (CUDA's path) must give the same words,
    for every length (whole blocks of four and the tail), with and without example ids."""
    example_ids = None if ids is None else torch.tensor(ids, dtype=torch.int64)
    fast = rng.stream(seed, step, "dropout/p", example_ids, count)
    with library.disabled():
        reference = rng.stream(seed, step, "dropout/p", example_ids, count)
    assert fast.shape == reference.shape and fast.dtype == reference.dtype
    assert torch.equal(fast, reference)


def test_stream_longerThanTwoToThe32Blocks_usesHighCounterWord() -> None:
    # Only the layout rule is checked here (no 2**34-word stream is drawn): the high word is block >> 32.
    key = rng.purpose_key(1, "p")
    words = rng.philox4x32(tuple(torch.tensor([v]) for v in (3, 4, 0, 1)), key)  # type: ignore[arg-type]
    assert tuple(int(w) for w in words) == ref_philox((3, 4, 0, 1), key)


def test_knownAnswerVectors_pinned() -> None:
    # A change to the key derivation, the counter layout or the word order breaks these.
    assert rng.purpose_key(42, "data") == (1284604437, 1782505040)
    got = rng.uniform_int53(42, 7, "dropout/drop", torch.tensor([0, 5, 2**32 - 1]), (3,))
    assert [hex(v) for v in got.flatten().tolist()] == [
        "0x17fdf231d45228", "0x17aebb9e1e2647", "0x1e5c9d8b9785f1",
        "0x11abd985269f18", "0x9de035674cec8", "0x1d49f67bfe7fa4",
        "0x1ba8db8a0b9aa0", "0x12e61e47ecab67", "0x1d87c79ed34032",
    ]  # fmt: skip
    assert rng.randbelow(42, 7, "data", torch.arange(6), (), 1500).tolist() == [
        1238,
        1387,
        238,
        820,
        324,
        1427,
    ]
    assert rng.permutation(0, 0, "split/digits", 10).tolist() == [0, 9, 4, 6, 7, 5, 3, 1, 2, 8]
    words = rng.random_u32(42, 7, "dropout/drop", torch.tensor([0, 5]), (5,))
    assert [hex(v) for v in words.flatten().tolist()] == [
        "0xbfef918e", "0xa2914156", "0xbd75dcf0", "0xf1323e44", "0xf2e4ec5c",
        "0x8d5ecc29", "0x34f8c779", "0x4ef01ab3", "0xa6764323", "0xea4fb3df",
    ]  # fmt: skip


def test_uniform_isExactScaledInteger() -> None:
    ints = rng.uniform_int53(5, 1, "u", torch.arange(4), (100,))
    u = rng.uniform(5, 1, "u", torch.arange(4), (100,))
    assert u.dtype == torch.float64
    assert torch.equal(u * 2.0**53, ints.to(torch.float64))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_batchSplit_sameBits() -> None:
    ids = torch.arange(8, dtype=torch.int64) + 40
    whole = rng.uniform_int53(9, 3, "dropout/x", ids, (5, 7))
    halves = torch.cat(
        [
            rng.uniform_int53(9, 3, "dropout/x", ids[:4], (5, 7)),
            rng.uniform_int53(9, 3, "dropout/x", ids[4:], (5, 7)),
        ]
    )
    singles = torch.cat([rng.uniform_int53(9, 3, "dropout/x", ids[i : i + 1], (5, 7)) for i in range(8)])
    shuffled_ids = ids[torch.tensor([3, 7, 0, 1, 6, 2, 5, 4])]
    shuffled = rng.uniform_int53(9, 3, "dropout/x", shuffled_ids, (5, 7))
    assert torch.equal(whole, halves)
    assert torch.equal(whole, singles)
    assert torch.equal(shuffled, whole[torch.tensor([3, 7, 0, 1, 6, 2, 5, 4])])


def test_prefixOfLongerShape_sameBits() -> None:
    # Element j depends only on j, not on how many elements are drawn (odd counts included).
    short = rng.uniform_int53(1, 1, "p", None, (7,))
    long = rng.uniform_int53(1, 1, "p", None, (20,))
    assert torch.equal(short, long[:7])


def test_threadCount_sameBits() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rng.uniform_int53(2, 2, "t", torch.arange(64), (1000,))
        torch.set_num_threads(max(2, threads))
        many = rng.uniform_int53(2, 2, "t", torch.arange(64), (1000,))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 8},
        {"step": 2},
        {"purpose": "dropout/b"},
        {"example_ids": torch.tensor([1])},
    ],
)
def test_differentKey_differentBits(change) -> None:
    base: dict[str, Any] = {"seed": 7, "step": 1, "purpose": "dropout/a", "example_ids": torch.tensor([0])}
    a = rng.uniform_int53(shape=(64,), **base)
    b = rng.uniform_int53(shape=(64,), **{**base, **change})
    assert not torch.equal(a, b)
    assert int((a == b).sum()) == 0  # 53-bit values: a collision would be a bug


def test_elementsOfOneExample_differ() -> None:
    values = rng.uniform_int53(0, 0, "x", None, (4096,))
    assert values.unique().numel() == 4096


def test_uniform_chiSquareWithinBound() -> None:
    # Fixed key, so this is deterministic; the bound is the 99.99th percentile of chi2(63), about 113.
    u = rng.uniform(123, 4, "chi", torch.arange(16), (4096,)).flatten()
    counts = torch.bincount((u * 64).to(torch.int64), minlength=64).to(torch.float64)
    expected = u.numel() / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 113.0
    # Low bits are uniform too: the parity of the 53-bit integers.
    ints = rng.uniform_int53(123, 4, "chi", torch.arange(16), (4096,))
    assert abs(float((ints & 1).to(torch.float64).mean()) - 0.5) < 0.01


def test_bernoulliMask_rateAndEdges() -> None:
    ids = torch.arange(32)
    mask = rng.bernoulli_mask(1, 1, "b", ids, (1000,), 0.3)
    assert mask.dtype == torch.bool
    assert abs(float(mask.to(torch.float64).mean()) - 0.3) < 0.01
    assert not rng.bernoulli_mask(1, 1, "b", ids, (100,), 0.0).any()
    assert rng.bernoulli_mask(1, 1, "b", ids, (100,), 1.0).all()
    words = rng.random_u32(1, 1, "b", ids, (1000,))
    assert torch.equal(mask, words.to(torch.float64) * 2.0**-32 < 0.3)  # integer decision == float one


def test_randbelow_rangeAndCoverage() -> None:
    picks = rng.randbelow(3, 1, "data", torch.arange(20000), (), 10)
    assert int(picks.min()) == 0 and int(picks.max()) == 9
    counts = torch.bincount(picks, minlength=10)
    assert int(counts.min()) > 1800 and int(counts.max()) < 2200


def test_irwinHall_moments() -> None:
    z = rng.irwin_hall(0, 0, "init/x", None, (200000,))
    assert z.dtype == torch.float64
    assert abs(float(z.mean())) < 0.01
    assert abs(float(z.std()) - 1.0) < 0.01
    assert float(z.abs().max()) <= 6.0


def test_permutation_isPermutation() -> None:
    perm = rng.permutation(5, 0, "perm", 1000)
    assert torch.equal(perm.sort().values, torch.arange(1000))
    assert not torch.equal(perm, torch.arange(1000))


def test_torchGlobalRng_untouched() -> None:
    state = torch.random.get_rng_state()
    rng.uniform(1, 1, "x", torch.arange(4), (10,))
    rng.irwin_hall(1, 1, "x", None, (10,))
    rng.permutation(1, 1, "x", 10)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step": 2**32}, "step"),
        ({"example_ids": torch.tensor([-1])}, "example_ids"),
        ({"example_ids": torch.tensor([2**32])}, "example_ids"),
        ({"example_ids": torch.tensor([1.0])}, "example_ids"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_outOfRangeKeys_raiseConfigError(kwargs, match) -> None:
    args = {"seed": 0, "step": 0, "purpose": "x", "example_ids": None, "shape": (2,), **kwargs}
    with pytest.raises(ConfigError, match=match):
        rng.uniform(**args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sameBitsAsCpu() -> None:
    ids = torch.arange(64, dtype=torch.int64)
    cpu = rng.uniform_int53(11, 5, "dropout/x", ids, (33, 17))
    gpu = rng.uniform_int53(11, 5, "dropout/x", ids.cuda(), (33, 17))
    assert gpu.device.type == "cuda"
    assert torch.equal(cpu, gpu.cpu())
    assert torch.equal(
        rng.irwin_hall(1, 0, "n", None, (999,)), rng.irwin_hall(1, 0, "n", None, (999,), "cuda").cpu()
    )


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_ids_areRangeCheckedOncePerTensorAndVersion(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # A range check of ids on a GPU is a host synchronisation (meta tensors stand in for a GPU's:
    # they are not on the CPU), on CPU two reductions a draw: made again only for another tensor or
    # one changed in place since.
    checked: list[int] = []
    monkeypatch.setattr(rng, "_check_range", lambda ids: checked.append(id(ids)))
    monkeypatch.setattr(rng, "_last_checked", None)
    ids = torch.arange(8, dtype=torch.int64, device=device)
    for _ in range(3):
        rng._check_ids(1, ids)
    assert checked == [id(ids)]
    ids.add_(1)  # changed in place: its version moves
    rng._check_ids(1, ids)
    other = torch.arange(8, dtype=torch.int64, device=device)
    rng._check_ids(1, other)
    rng._check_ids(1, ids)
    assert checked == [id(ids), id(ids), id(other), id(ids)]


def test_cpuIdsChangedAfterACheck_areRefused() -> None:
    ids = torch.arange(8, dtype=torch.int64)
    rng.stream(3, 1, "x", ids, 4)
    ids[0] = -1  # in place, after the check
    with pytest.raises(ConfigError, match="must lie in"):
        rng.stream(3, 1, "x", ids, 4)


class SeenOps(TorchDispatchMode):
    """Records the ATen ops that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_suspended_nestedOnce_modesOffThroughout_andBackAfter(monkeypatch: pytest.MonkeyPatch) -> None:
    # a served draw suspends around its own ops and the words': the modes are popped once, not
    # again inside; every op inside is unseen, the inner block's too, and the mode is back after
    # (also when the inner block raises)
    pops: list[int] = []
    real = rng._disable_current_modes
    monkeypatch.setattr(rng, "_disable_current_modes", lambda: pops.append(1) or real())
    with SeenOps() as seen:
        with rng.suspended():
            torch.ones(3).add_(1)
            with rng.suspended():
                torch.ones(3).mul_(2)
            words = rng.random_u32(3, 1, "dropout/x", None, (5,))
            with pytest.raises(ValueError), rng.suspended():
                torch.ones(1).sub_(1)
                raise ValueError
            torch.ones(3).div_(2)
        assert seen.ops == [] and pops == [1] and words.shape == (5,)
        torch.ones(2).add_(1)
        assert any("add_" in op for op in seen.ops)
        with rng.suspended():  # a fresh one after the first has ended pops again
            torch.ones(1).neg_()
    assert pops == [1, 1] and not any("neg" in op for op in seen.ops)
