"""The group kernels (a foreach op's tensors in one launch a pass) against the per-tensor ones: the
same bits, positions, counts and failed calls, and whole steps that equal immediate ones.

Without a GPU they run on CPU tensors in Triton's interpreter (as in ``test_cuda_kernels``, which
sets the switch before the kernels' modules are first imported); with one, on the GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.dispatch.profiles import get_profile
from game.training.engine.step import StepEngine
from game.training.native import front, library
from game.training.numerics import rounding

from .test_cuda_kernels import BAND, DEV, _auditor_case, _bits, _copy, _engines, _far_lane, _params
from .test_native import _values

if not torch.cuda.is_available():  # as test_cuda_kernels, whichever module is collected first
    os.environ["TRITON_INTERPRET"] = "1"

from game.training.numerics import cuda_deferred, cuda_groups, cuda_kernels  # after the switch

pytestmark = pytest.mark.skipif(not cuda_kernels.available(), reason="Triton is not installed")

#: What meets a step's ops: the C++ front where it is built, and the Python mode.
INTERCEPTORS = ["front", "python"] if library.available() and front.available() else ["python"]

#: Both layouts of a group: one program per tensor, or programs over chunks (here of two blocks, so
#: that tensors of a few thousand lanes span several chunks and end inside one).
LAYOUTS = ["one program", "chunks"]


@contextlib.contextmanager
def _layout(layout: str) -> Iterator[None]:
    saved = cuda_kernels.ONE_PROGRAM_MAX, cuda_groups.CHUNK
    cuda_kernels.ONE_PROGRAM_MAX = 1 << 62 if layout == "one program" else 0
    cuda_groups.CHUNK = 2 * cuda_kernels.BLOCK
    try:
        yield
    finally:
        cuda_kernels.ONE_PROGRAM_MAX, cuda_groups.CHUNK = saved


def _trainer_values(rare: bool) -> list[torch.Tensor]:
    """Tensors of a group: sizes across block and chunk edges, one with zeros, one maybe with rare lanes."""
    xs = [_values(1, 32, "none", 1.0)[:1], _values(2, 32, "zero", 3.0), _values(3, 32, "none", 0.5)]
    xs += [torch.cat([_values(s, 32, "none", 1.0) for s in (4, 5, 6)])[:4097]]  # past two chunks
    xs += [_values(7, 32, "subnormal" if rare else "none", 1.0)]
    return xs


def _assert_settled_empty(settled: cuda_deferred.Settled) -> None:
    assert settled.listed.size == 0 and settled.bounds == [0] and settled[2:] == (0, 0, ())


def _settle_both(calls: Any) -> tuple[cuda_deferred.Settled, cuda_deferred.Settled]:
    """``calls(deferred, grouped)`` on a fresh Deferred each way; both settled."""
    one, group = cuda_deferred.Deferred(torch.device(DEV)), cuda_deferred.Deferred(torch.device(DEV))
    calls(one, False)
    calls(group, True)
    return one.settle(), group.settle()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rare", [False, True])
def test_trainerGroup_equalsOneCallATensor(layout: str, rare: bool) -> None:
    """The same bits, the same listed positions per tensor, and a rare lane failing its own call only."""
    xs = _trainer_values(rare)
    bufs: dict[bool, list[torch.Tensor]] = {}
    tickets: dict[bool, list[int | None]] = {}

    def calls(d: cuda_deferred.Deferred, grouped: bool) -> None:
        b = bufs[grouped] = [_copy(x) for x in xs]
        if grouped:
            got = d.round_and_band_group(b, _params(32, BAND))
            assert got is not None
            tickets[grouped] = list(got)
        else:
            tickets[grouped] = [d.round_and_band(x, _params(32, BAND)) for x in b]

    with _layout(layout):
        one, group = _settle_both(calls)
    assert one.failed == group.failed == ((len(xs) - 1,) if rare else ())
    if rare:
        return  # nothing else is read back from a failed step: it runs again without deferral
    for a, b in zip(bufs[False], bufs[True], strict=True):
        assert torch.equal(_bits(a), _bits(b))
    for ta, tb in zip(tickets[False], tickets[True], strict=True):
        assert ta is not None and tb is not None and torch.equal(one.positions(ta), group.positions(tb))
    assert group.listed.size > 0 and group.bounds[-1] == group.listed.size


@pytest.mark.parametrize("rare", [False, True])
def test_groupsRowsGoOnIntoANewBuffer_eachCallKeepingItsRow(
    rare: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counter buffers of three rows: a call, a group of five (its rows in the first buffer's last
    two and the next's three), a call. The same positions per tensor as one call a tensor, and a
    rare lane fails the call it is in (the step names its failed calls by their rows)."""
    monkeypatch.setattr(cuda_deferred.Deferred, "ROWS", 3)
    xs = [_values(20, 32, "none", 1.0), *_trainer_values(rare), _values(21, 32, "none", 2.0)]
    tickets: dict[bool, list[int | None]] = {}

    def calls(d: cuda_deferred.Deferred, grouped: bool) -> None:
        b = [_copy(x) for x in xs]
        if grouped:
            first = d.round_and_band(b[0], _params(32, BAND))
            group = d.round_and_band_group(b[1:-1], _params(32, BAND))
            assert group is not None
            tickets[grouped] = [first, *group, d.round_and_band(b[-1], _params(32, BAND))]
        else:
            tickets[grouped] = [d.round_and_band(x, _params(32, BAND)) for x in b]
        assert len(d._buffers) == 3

    one, group = _settle_both(calls)
    assert one.failed == group.failed == ((len(xs) - 2,) if rare else ())
    if rare:
        return
    for ta, tb in zip(tickets[False], tickets[True], strict=True):
        assert ta is not None and tb is not None and torch.equal(one.positions(ta), group.positions(tb))
    assert group.listed.size > 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("failing", ["none", "entry outside", "listed zero", "rare lane"])
def test_auditorGroup_equalsOneCallATensor(layout: str, failing: str) -> None:
    """Entries spread over the group (one tensor with none): the same bits, corrections, free lanes
    and failed calls as one call a tensor."""
    cases = [_auditor_case(s) for s in (11, 12, 13)]
    cases.insert(1, (_values(14, 32, "none", 2.0), torch.empty(0, dtype=torch.int64)))
    if failing == "entry outside":
        x, pos = cases[2]
        cases[2] = (x, torch.cat([pos, torch.tensor([_far_lane(x)])]).unique())
    elif failing == "listed zero":
        x, pos = cases[3]
        x = x.clone()
        x[int(pos[0])] = 0.0
        cases[3] = (x, pos)
    elif failing == "rare lane":
        x, pos = cases[1]
        cases[1] = (torch.cat([x, torch.tensor([3e-39], dtype=torch.float64)]), pos)
    positions = [p for _, p in cases]
    flat = torch.cat(positions).to(DEV)
    starts = [0, *torch.tensor([int(p.numel()) for p in positions]).cumsum(0).tolist()[:-1]]
    bufs: dict[bool, list[torch.Tensor]] = {}

    def calls(d: cuda_deferred.Deferred, grouped: bool) -> None:
        b = bufs[grouped] = [_copy(x) for x, _ in cases]
        if grouped:
            assert d.takes_group(b, cuda_deferred.entries_fit(positions, [x.numel() for x in b]))
            counts = [int(p.numel()) for p in positions]
            d.round_with_entries_group(b, _params(32, BAND), counts, flat, starts)
        else:
            for x, p in zip(b, positions, strict=True):
                assert d.round_with_entries(x, _params(32, BAND), p, p.to(DEV))

    with _layout(layout):
        one, group = _settle_both(calls)
    want_failed = {"none": (), "entry outside": (2,), "listed zero": (3,), "rare lane": (1,)}[failing]
    assert one.failed == group.failed == want_failed
    if failing == "none":
        for a, b in zip(bufs[False], bufs[True], strict=True):
            assert torch.equal(_bits(a), _bits(b))
        assert (group.corrections, group.free) == (one.corrections, one.free)
        assert group.corrections > 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rare", [False, True])
def test_exactGroup_roundsToNearest(layout: str, rare: bool) -> None:
    xs = _trainer_values(rare)
    bufs = [_copy(x) for x in xs]
    d = cuda_deferred.Deferred(torch.device(DEV))
    with _layout(layout):
        assert d.round_inplace_group(bufs, *_params(32, BAND)[:2])
        settled = d.settle()
    assert settled.failed == ((len(xs) - 1,) if rare else ())
    for x, b in list(zip(xs, bufs, strict=True))[: len(xs) - 1]:
        assert torch.equal(_bits(b), _bits(rounding.rnd(x, 32)))


def test_groupNotTheKernels_launchesNothing() -> None:
    """One tensor the kernels do not take (not contiguous, float32) or one entry list out of order:
    the group is refused whole, before anything is launched or counted."""
    d = cuda_deferred.Deferred(torch.device(DEV))
    x = _copy(_values(1, 32, "none", 1.0))
    odd = [_copy(_values(2, 32, "none", 1.0)).view(-1, 2).t(), _copy(_values(3, 32, "none", 1.0)).float()]
    for bad in odd:
        assert d.round_and_band_group([x, bad], _params(32, BAND)) is None
        assert not d.round_inplace_group([x, bad], *_params(32, BAND)[:2])
    for bad in ([5, 3], [2, 99999]):
        fits = cuda_deferred.entries_fit([torch.tensor([1, 2]), torch.tensor(bad)], [x.numel()] * 2)
        assert fits == [True, False] and not d.takes_group([x, x], fits)
    assert torch.equal(_bits(x), _bits(_values(1, 32, "none", 1.0)))
    _assert_settled_empty(d.settle())


@settings(max_examples=200, deadline=None)
@given(
    lists=st.lists(
        st.tuples(st.lists(st.integers(-3, 40), max_size=6), st.integers(0, 40)),
        max_size=6,
    )
)
def test_entriesFit_saysWhatTheOneAtATimeCheckSays(lists: list[tuple[list[int], int]]) -> None:
    """The chunk-wide check of the auditor's entries against the per-tensor one: every list alone,
    whatever its neighbours (a list that starts below where the last one ended is still in order)."""
    positions = [torch.tensor(p, dtype=torch.int64) for p, _ in lists]
    counts = [c for _, c in lists]
    want = [
        p.numel() == 0 or cuda_kernels._ordered_in_range(p, c) for p, c in zip(positions, counts, strict=True)
    ]
    assert cuda_deferred.entries_fit(positions, counts) == want


# ---- whole steps ------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every Triton launch of the rounding kernels, per tensor and per group kernel."""
    count: Counter[str] = Counter()

    class Counted:
        def __init__(self, kind: str, name: str, kernel: Any) -> None:
            self.kind, self.name, self.kernel = kind, name, kernel

        def __getitem__(self, grid: Any) -> Any:
            count[self.kind] += 1
            count[f"{self.kind} {self.name}"] += 1
            return self.kernel[grid]

    for kind, table in (("tensor", cuda_kernels.KERNELS), ("group", cuda_groups.GROUP_KERNELS)):
        for name, kernel in list(table.items()):
            monkeypatch.setitem(table, name, Counted(kind, name, kernel))
    return count


@pytest.mark.parametrize("interceptor", INTERCEPTORS)
@pytest.mark.parametrize("preset", ["mlp-digits", "gpt-shakespeare"])
def test_groupedSteps_equalImmediateOnes_inFewerLaunches(
    preset: str, interceptor: str, launches: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer and auditor steps with the groups equal the immediate steps (leaves, log bytes,
    corrections) and the deferred steps without groups, and launch fewer kernels: the optimizer's
    foreach ops (SGD with momentum; AdamW) are a launch or two each, not one a parameter. Through
    the C++ front (where it is built: the default) and through the Python mode alike."""
    deferring, immediate = _engines(preset)
    noisy = StepEngine(deferring.cfg, get_profile("noisy"))  # a trainer whose log needs corrections
    s_noisy = noisy.init_state()
    chunks = [noisy.run_step(s_noisy, step, mode="record").log for step in (1, 2)]
    spec = deferring.cfg.spec_hash()

    def run(engine: StepEngine) -> list[Any]:
        s_rec, s_aud = engine.init_state(), engine.init_state()
        got = []
        for step, chunk in enumerate(chunks, start=1):
            rec = engine.run_step(s_rec, step, mode="record")
            assert rec.log is not None
            aud = engine.run_step(s_aud, step, mode="replay", log=chunk)
            got.append((rec.leaf, rec.log.encode(step, spec), aud.leaf, aud.corrections))
        return got

    runs: dict[str, Any] = {}
    with front.disabled() if interceptor == "python" else contextlib.nullcontext():
        for groups in ("1", "0"):
            monkeypatch.setenv(cuda_groups.SWITCH, groups)
            launches.clear()
            runs[groups] = run(deferring), Counter(launches)
            assert deferring.last_mode is not None and deferring.last_mode.via_front is (
                interceptor == "front"
            )
    want = run(immediate)
    assert runs["0"][0] == want, "deferred without groups"
    assert runs["1"][0] == want, "deferred with groups"
    (_, grouped), (_, single) = runs["1"], runs["0"]
    assert grouped["group"] > 0 and single["group"] == 0
    assert sum(r[3] for r in runs["1"][0]) > 0  # the auditor corrected something
    assert grouped["tensor"] + grouped["group"] < single["tensor"] * 0.75
