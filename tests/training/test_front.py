"""The C++ dispatch front: every step it runs gives the bits, log, corrections and op counts of the
Python dispatch mode it stands in for, and its errors are the mode's."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch

from game.errors import NonFiniteError
from game.training.dispatch import front as session
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.optable import LOG_NAMES, OpClass
from game.training.dispatch.profiles import get_profile
from game.training.engine.step import StepEngine
from game.training.log.formats import new_step_log
from game.training.log.sparse import SparseStepLog
from game.training.native import front, library
from game.training.numerics.bandfile import Band, BandTable
from tests.training.test_step import SMALL, small_cfg

pytestmark = pytest.mark.skipif(
    not (library.available() and front.available()), reason="no C/C++ toolchain: there is no front"
)


def _counts(mode: RoundingMode | None) -> tuple[object, ...]:
    assert mode is not None
    return dict(mode.classes), dict(mode.logged), dict(mode.rounded), mode.op_index


def _same_work(fast: RoundingMode | None, slow: RoundingMode | None) -> None:
    """The same tensors logged per op and rounded in all, and every op both ran has one class.
    (Autograd sums some gradients in place under the front, ``add_``, where under the Python mode it
    makes a new tensor, ``add``: the same exact op on the same values, so only the names differ.)"""
    assert fast is not None and slow is not None
    assert fast.logged == slow.logged and fast.op_index == slow.op_index
    assert fast.rounded.total() == slow.rounded.total()
    assert all(fast.classes[op] is slow.classes[op] for op in fast.classes.keys() & slow.classes.keys())


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
@pytest.mark.parametrize("preset", list(SMALL))
def test_front_equalsThePythonMode(preset: str, log_format: str) -> None:
    """Record, replay (of a noisy trainer's log) and round without a log, through the front and
    through the mode: the same leaves, chunk bytes and corrections, and the same work op by op."""
    cfg = small_cfg(preset, log_format=log_format)
    spec = cfg.spec_hash()
    fast, slow = StepEngine(cfg, get_profile("cpu-1t")), StepEngine(cfg, get_profile("cpu-1t"))
    noisy = StepEngine(cfg, get_profile("noisy"))
    sf, ss, sn, af, as_ = (e.init_state() for e in (fast, slow, noisy, fast, slow))
    for step in range(1, 4):
        rf = fast.run_step(sf, step)
        assert fast.last_mode is not None and fast.last_mode.via_front
        with front.disabled():
            rs = slow.run_step(ss, step)
        assert slow.last_mode is not None and not slow.last_mode.via_front
        assert rf.log is not None and rs.log is not None
        assert rf.leaf == rs.leaf and rf.log.encode(step, spec) == rs.log.encode(step, spec)
        _same_work(fast.last_mode, slow.last_mode)
        rn = noisy.run_step(sn, step)
        ra = fast.run_step(af, step, mode="replay", log=rn.log)
        assert fast.last_mode.via_front
        with front.disabled():
            rb = slow.run_step(as_, step, mode="replay", log=rn.log)
        assert ra.leaf == rb.leaf == rn.leaf
        assert ra.corrections == rb.corrections and ra.corrections > 0
        _same_work(fast.last_mode, slow.last_mode)
    rounded = fast.run_step(sf, 4, mode="round")
    assert fast.last_mode is not None and fast.last_mode.via_front
    # without a log the kernels round every tensor, inexact ones included: no Python call
    assert fast.last_mode.front_kernel_tensors == fast.last_mode.rounded.total() > 0
    with front.disabled():
        assert slow.run_step(ss, 4, mode="round").leaf == rounded.leaf
    _same_work(fast.last_mode, slow.last_mode)


def test_front_bandsKnownAhead_areEachTablesOwn() -> None:
    """The front takes the bands it has met before at ``enter``, kept by band table and grid: steps
    with the preset's bands, then with every op's band one binade wider (a longer sparse log), then
    the first again, each the Python mode's, row by row (the first step with none known ahead, so
    the front asks for each). A band kept for the wrong table would list
    another set of values."""
    base = small_cfg("gpt-shakespeare")
    table = base.band_table
    wider = BandTable(
        default=Band(table.default.rel + 1, table.default.abs + 1),
        ops={name: Band(b.rel + 1, b.abs + 1) for name, b in table.ops.items()},
    )
    spec = base.spec_hash()
    logs = []
    session._bands.clear()  # the first step asks band_for for every row
    session._bands_last = None
    for cfg in (base, base.replace(bands=wider), base):
        fast, slow = StepEngine(cfg, get_profile("cpu-1t")), StepEngine(cfg, get_profile("cpu-1t"))
        sf, ss = fast.init_state(), slow.init_state()
        for step in (1, 2):
            rf = fast.run_step(sf, step)
            mode = fast.last_mode
            assert mode is not None and mode.via_front
            known = mode._known_bands()
            assert known is not None and known.shape[0] > 0
            assert [tuple(row) for row in known.tolist()] == [
                mode._front_band(r) for r in range(known.shape[0])
            ]
            with front.disabled():
                rs = slow.run_step(ss, step)
            assert rf.log is not None and rs.log is not None
            assert rf.leaf == rs.leaf and rf.log.encode(step, spec) == rs.log.encode(step, spec)
        logs.append(rf.log.encode(2, spec))
    assert logs[0] == logs[2] and len(logs[1]) > len(logs[0])


def _ops(kind: str) -> list[torch.Tensor]:
    """Ops whose class depends on their arguments, each way they can go; in-place and foreach ops;
    a batch norm that writes its running stats without saying so in its schema."""
    a = torch.linspace(-3, 3, 12, dtype=torch.float64).reshape(3, 4)
    b = torch.linspace(1, 2, 12, dtype=torch.float64).reshape(3, 4)
    out = [a.add(b)]  # alpha 1: exact
    out.append(a.add(b, alpha=0.3))  # fused: inexact
    out.append(a.sub(b, alpha=1.0))  # a float 1: exact
    out.append(torch.rsub(a, b, alpha=2))
    out.append(a / b)  # real divisor: exact
    out.append(a / 3.0)  # scalar divisor: inexact
    out.append(torch.div(a, b, rounding_mode="floor"))
    c = a.clone()
    c.index_put_((torch.tensor([0, 2]),), torch.ones(2, 4, dtype=torch.float64))  # a move
    c.index_put_((torch.tensor([0, 0]),), b[:2], accumulate=True)  # inexact
    c.mul_(0.1)  # in place, returns self
    xs = [a.clone(), b.clone()]
    torch._foreach_mul_(xs, 0.7)  # foreach, in place: no return
    torch._foreach_div_(xs, [b, a + 5])
    torch._foreach_div_(xs, [2.0, 3.0])
    out.append(torch.scatter(a, 1, torch.zeros(3, 1, dtype=torch.int64), b[:, :1], reduce="add"))
    out += [a.round(), a.round(decimals=2)]
    x = torch.linspace(0, 1, 2 * 3 * 5, dtype=torch.float64).reshape(2, 3, 5)
    mean, var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    out.append(torch.nn.functional.batch_norm(x, mean, var, training=kind == "train", momentum=0.3))
    out.append(torch.nn.functional.batch_norm(x, mean, var, training=False))
    out += [*a.max(dim=1), a.float() * 2.0, torch.cat([a, b]).sum()]  # a tuple; float32 exact; a move
    # a float32 result asked for by a dtype argument (a factory's, a sum's): rounded by way of its
    # float64 twin; the front read the argument's schema type as int and refused the result
    out += [torch.arange(0.0, 1.0, 0.1, dtype=torch.float32), a.sum(dim=0, dtype=torch.float32)]
    out.append(torch.eye(2, 3))  # a factory of 0s and 1s in the default dtype (Nystromformer's): a move
    # float32 results in the default dtype from no float32 argument (Phimoe's router, a true
    # division of integers, a factory): their twins run under a float64 default, as in Python
    mask = a > 0
    out += [
        torch.add(0.3333, mask, alpha=0.6667),
        torch.arange(12).reshape(3, 4) / 7,
        torch.arange(0.0, 1.0, 0.1),
    ]
    # composites that ask for fewer results where no Python mode is on (optable.FULL_CALLS): the
    # same calls through both, the singular vectors and eigenvectors too
    out += [torch.linalg.svdvals(a), torch.linalg.eigvalsh(a @ a.T), torch.linalg.matrix_norm(a, ord=2)]
    return [*out, c, *xs, mean, var]


def test_front_withTwoTorchThreads_equalsThePythonMode() -> None:
    """cpu-2t sums in parallel on torch's worker threads: the same bits and log through the front."""
    cfg = small_cfg("gpt-shakespeare")
    fast, slow = StepEngine(cfg, get_profile("cpu-2t")), StepEngine(cfg, get_profile("cpu-2t"))
    sf, ss = fast.init_state(), slow.init_state()
    for step in range(1, 4):
        rf = fast.run_step(sf, step)
        with front.disabled():
            rs = slow.run_step(ss, step)
        assert fast.last_mode is not None and fast.last_mode.via_front
        assert rf.log is not None and rs.log is not None and rf.leaf == rs.leaf
        assert rf.log.encode(step, cfg.spec_hash()) == rs.log.encode(step, cfg.spec_hash())
        _same_work(fast.last_mode, slow.last_mode)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("kind", ["train", "eval"])
def test_front_classifiesAndTouchesLikeTheMode(kind: str) -> None:
    """Outside a training step, op by op: the same classes, the same tensors rounded and logged,
    and the same values."""
    runs = []
    for use_front in (True, False):
        log = SparseStepLog()
        mode = RoundingMode(bits=32, tau=0.25, mode="record", profile=get_profile("cpu-1t"), step=1, log=log)
        with contextlib.nullcontext() if use_front else front.disabled(), mode:
            values = _ops(kind)
        assert mode.via_front is use_front
        runs.append((_counts(mode), log.encode(1, bytes(32)), values))
    (counts, data, values), (counts2, data2, values2) = runs
    assert counts == counts2 and data == data2
    assert len(values) == len(values2) and all(
        torch.equal(u, v) for u, v in zip(values, values2, strict=True)
    )
    classes = counts[0]
    assert isinstance(classes, dict)
    assert classes["aten.add.Tensor"] is OpClass.EXACT  # the first call's class
    assert classes["aten.index_put_.default"] is OpClass.MOVE
    assert classes["aten._foreach_div_.ScalarList"] is OpClass.INEXACT
    assert classes["aten._foreach_div_.List"] is OpClass.EXACT
    assert classes["aten.eye.m"] is OpClass.MOVE


def _interleaved() -> list[torch.Tensor]:
    """Inexact ops whose outputs the C kernels take, and between them ones they refuse (float32
    subnormals are rare lanes, for the torch kernels): the front's log records and Python's
    interleave, as do the exact ops' roundings."""
    a = torch.linspace(0.1, 3.0, 300, dtype=torch.float64)
    tiny = a * 1e-39  # exact, subnormal in float32: Python rounds it
    out = [a / 3.0, tiny / 3.0, torch.exp(a), tiny / 7.0, a / 7.0, a.t() / 9.0]
    out += torch._foreach_div([tiny, a, tiny], 3.0)  # one op: refused, taken, refused
    out.append(torch.linspace(0.1, 3.0, (1 << 20) + 3, dtype=torch.float64) / 3.0)  # past the scratch
    b = torch.linspace(-2.0, 2.0, 300, dtype=torch.float64).reshape(20, 15)
    out += [b.t() / 3.0, (b.t() / 3.0).contiguous(), torch.exp(b)[:, ::2] / 5.0]  # strided: Python
    return out


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_front_kernels_interleaveWithPython(log_format: str) -> None:
    """Record and replay through the front, with its own kernel calls and without, and through the
    mode: the same values, log bytes, corrections and counts; the kernels took some tensors, Python
    the others."""

    def switch(how: str) -> contextlib.AbstractContextManager[None]:
        if how == "front":
            return contextlib.nullcontext()
        return library.disabled() if how == "front, no kernels" else front.disabled()

    runs = []
    for how in ("front", "front, no kernels", "mode"):
        log = new_step_log(log_format, 1)
        rec = RoundingMode(bits=32, tau=0.25, mode="record", profile=get_profile("cpu-1t"), step=1, log=log)
        with switch(how), rec:
            values = _interleaved()
        replay = RoundingMode(
            bits=32, tau=0.25, mode="replay", profile=get_profile("cpu-1t"), step=1, log=log, count_free=True
        )
        with switch(how), replay:
            again = _interleaved()
        replay.finish()
        assert rec.via_front is replay.via_front is (how != "mode")
        assert all(torch.equal(u, v) for u, v in zip(values, again, strict=True))
        runs.append((rec, replay, log.encode(1, bytes(32)), values))
    (rec, replay, data, values), *others = runs
    total = rec.logged.total() + rec.rounded.total()
    assert 0 < rec.front_kernel_tensors < total and 0 < replay.front_kernel_tensors < total
    assert rec.op_index == replay.op_index > 0
    for rec2, replay2, data2, values2 in others:
        assert rec2.front_kernel_tensors == replay2.front_kernel_tensors == 0
        assert data2 == data and _counts(rec2) == _counts(rec) and _counts(replay2) == _counts(replay)
        assert (replay2.corrections, replay2.free) == (replay.corrections, replay.free)
        assert all(torch.equal(u, v) for u, v in zip(values, values2, strict=True))
    assert replay.free > 0 or log_format == "packed"  # a packed replay counts no free values


@pytest.mark.parametrize("mode_name", ["record", "round"])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_front_raisesTheModesErrors(where: str, mode_name: str) -> None:
    """An error raised in the front's Python call, in the forward pass or in autograd's backward,
    reaches the caller as the mode's own exception, and the front is off afterwards (with a log,
    and without one, where the kernel leaves the overflowing tensor to Python)."""
    a = torch.tensor([[1e-200]], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([[1e30]], dtype=torch.float64)
    log = SparseStepLog() if mode_name == "record" else None
    mode = RoundingMode(bits=32, tau=0.25, mode=mode_name, profile=get_profile("cpu-1t"), step=7, log=log)
    with (
        pytest.raises(NonFiniteError, match=r"overflow at step 7, op #\d+ aten\.mm\.default") as caught,
        mode,
    ):
        out = torch.mm(a, b)  # op #0: 1e-170, which rounds to 0
        if where == "forward":
            torch.mm(b, b)  # 1e60: past float32's range
        out.backward(torch.full_like(out, 1e30))  # grad of a: 1e30 * 1e30
    assert mode.via_front and not front.active()
    assert caught.type is NonFiniteError
    failed = re.search(r"op #(\d+)", str(caught.value))
    assert failed is not None and mode.op_index == int(failed.group(1)) + 1  # as the mode counts
    logged = mode.op_index
    torch.mm(a.detach(), b)  # the front is off: nothing more reaches the mode
    assert mode.op_index == logged


class _OwnDispatch(RoundingMode):
    """A subclass that changes ``__torch_dispatch__`` (as calibration's mode does)."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return super().__torch_dispatch__(func, types, args, kwargs)


class _OwnDispatchEngine(StepEngine):
    mode_class = _OwnDispatch


def test_front_isNotUsedWhereItCannotStandIn() -> None:
    """Emulating profiles (split-K order, noise) and subclasses that change dispatch keep the mode."""
    cfg = small_cfg("mlp-digits")
    for engine in (
        StepEngine(cfg, get_profile("splitk-16")),
        StepEngine(cfg, get_profile("noisy")),
        _OwnDispatchEngine(cfg, get_profile("cpu-1t")),
    ):
        engine.run_step(engine.init_state(), 1)
        assert engine.last_mode is not None and not engine.last_mode.via_front


def test_builtFront_loadsDespiteALockFileLeftByAKilledRun(tmp_path: Any) -> None:
    """A run killed while loading the front (``kill -9`` in its first step) used to leave torch's
    builder lock file in the shared build directory, and every later run waited on it for ever.
    A built front is imported from its file, whatever else the directory holds."""
    built = front.build_dir()
    where = tmp_path / "native" / built.name
    where.mkdir(parents=True)
    for lib in built.glob("*.so"):
        shutil.copy2(lib, where / lib.name)
    (where / "lock").touch()  # what the killed run left
    code = "from game.training.native import front; assert front.load() is not None"
    env = {**os.environ, "VGAME_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "compiling" not in done.stderr  # the built library, not a new build


@pytest.mark.parametrize(
    ("table", "names", "positions"),
    [
        ([[0, 1, 10, 0]], ["aten.mm.default"], []),  # a name id past the names
        ([[0, 0, 10, 3]], ["aten.mm.default"], [1, 2]),  # more entries than positions
        ([[0, 0, 10, -1]], ["aten.mm.default"], [1]),  # a negative entry count
    ],
)
def test_front_refusesSparseEntriesThatDoNotHold(
    table: list[list[int]], names: list[str], positions: list[int]
) -> None:
    entries = session.SparseEntries(
        torch.tensor(table, dtype=torch.int64), names, torch.tensor(positions, dtype=torch.int64)
    )
    kernels = session.Kernels(replay=library.address("vg_round_with_entries"), entries=entries)
    with pytest.raises(RuntimeError, match="sparse entries"):
        session.enter(lambda *a: None, lambda *a: None, kernels)  # type: ignore[arg-type,return-value]
    assert not front.active()


def test_front_refusesASparseReplayWhoseEntriesAreNotColumns() -> None:
    kernels = session.Kernels(
        replay=library.address("vg_round_with_entries"),
        entries=[(0, "aten.mm.default", 10, torch.tensor([1], dtype=torch.int64))],
    )
    with pytest.raises(RuntimeError, match="takes them as columns"):
        session.enter(lambda *a: None, lambda *a: None, kernels)  # type: ignore[arg-type,return-value]
    assert not front.active()


def _indexing_backward(case: str) -> torch.Tensor:
    """A parameter read by advanced indexing, whose gradient autograd's formula accumulates with an
    in-place op where no Python mode is on (``_index_put_impl_``, ``scatter_add_``, ``index_add_``,
    ``put_``, ``index_fill_``) and an out-of-place one where one is."""
    w = torch.linspace(0.1, 1.0, 20, dtype=torch.float64).reshape(4, 5).requires_grad_()
    idx = torch.tensor([1, 3, 3])
    picked = {
        "index": lambda: w[idx],
        "gather": lambda: w.gather(1, torch.tensor([[0, 1], [2, 2], [1, 0], [4, 4]])),
        "index_select": lambda: w.index_select(0, idx),
        "take": lambda: w.take(torch.tensor([0, 7, 7, 12])),
        "trace": lambda: torch.trace(w).reshape(1),
    }[case]()
    (
        picked * torch.linspace(0.3, 0.9, picked.numel(), dtype=torch.float64).reshape(picked.shape)
    ).sum().backward()
    assert w.grad is not None
    return w.grad


@pytest.mark.parametrize("case", ["index", "gather", "index_select", "take", "trace"])
@pytest.mark.parametrize("recorder", ["front", "mode"])
def test_theBackwardOfIndexing_recordedByOneInterceptor_replaysThroughTheOther(
    case: str, recorder: str
) -> None:
    """The same kernel under two names (optable.LOG_NAMES) is one op in the log: a trainer on the
    front and an auditor or judge on the Python mode (an emulating profile, or ``VGAME_FRONT=0``)
    agree; the log named them apart, and the honest trainer's audit failed."""
    log = SparseStepLog()
    modes = []
    grads = []
    for i, mode_name in enumerate(("record", "replay")):
        use_front = (recorder == "front") == (i == 0)
        mode = RoundingMode(bits=32, tau=0.25, mode=mode_name, profile=get_profile("cpu-1t"), step=1, log=log)
        with contextlib.nullcontext() if use_front else front.disabled(), mode:
            grads.append(_indexing_backward(case))
        assert mode.via_front is use_front
        mode.finish()
        modes.append(mode)
    assert torch.equal(grads[0], grads[1])
    _same_work(modes[0], modes[1])
    assert set(LOG_NAMES.values()) & set(modes[0].logged)  # the accumulation, by its one name
    assert not set(LOG_NAMES) & (set(modes[0].logged) | set(modes[1].logged))


@pytest.mark.parametrize("use_front", [True, False], ids=["front", "mode"])
def test_aProductThatWouldBeDifferentiated_isRefusedByBothInterceptors_andOtherwisePasses(
    use_front: bool,
) -> None:
    """PyTorch computes prod's and cumprod's gradients by another formula under a Python dispatch
    mode (cumulative products) than without (a division): the two interceptors would compute and
    log different ops. Such a call is refused by name under either; one without a gradient passes."""
    from game.errors import UnsupportedOpError

    x = torch.linspace(0.5, 1.5, 12, dtype=torch.float64).reshape(3, 4)
    for call, name in (
        (lambda t: t.prod(1), "aten.prod.dim_int"),
        (lambda t: t.cumprod(1), "aten.cumprod.default"),
    ):
        mode = RoundingMode(
            bits=32, tau=0.25, mode="record", profile=get_profile("cpu-1t"), step=2, log=SparseStepLog()
        )
        with contextlib.nullcontext() if use_front else front.disabled(), mode:
            with pytest.raises(
                UnsupportedOpError, match=rf"step 2: {re.escape(name)} is refused where it is differentiated"
            ):
                call(x.clone().requires_grad_())
            with torch.no_grad():
                call(x.clone().requires_grad_())
            call(x)  # no gradient asked for
            call(torch.arange(1, 7).reshape(2, 3))  # integers
        assert mode.via_front is use_front
