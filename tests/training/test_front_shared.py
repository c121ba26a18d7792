"""The C++ front's shared session: on a GPU, autograd runs a step's backward pass on a device thread
of its own, which carries the front's key but not the thread that entered the session. A shared
session (a step on a device, or one that defers its checks) serves that thread; these tests move
``Tensor.backward`` onto such a thread on any machine and hold the step to the one-thread step's
bits, log and corrections, and check the two cases the front refuses to guess.

Without a GPU the deferring steps run on CPU tensors in Triton's interpreter (as in
``test_cuda_kernels``, which sets the switch before the kernels' modules are first imported).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from game.training.dispatch import front as session
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.engine.step import StepEngine
from game.training.native import front, library
from game.training.numerics import rounding
from game.training.state.tensors import OffGridError

from .test_cuda_kernels import _engines

if not torch.cuda.is_available():  # as test_cuda_kernels, whichever module is collected first
    os.environ["TRITON_INTERPRET"] = "1"

from game.training.numerics import cuda_kernels  # after the switch

pytestmark = pytest.mark.skipif(
    not (library.available() and front.available() and cuda_kernels.available()),
    reason="needs the C++ front and Triton",
)


def _on_a_thread(body: Callable[[], Any], *, key: bool) -> BaseException | None:
    """Run ``body`` on a fresh thread, with the front's key included there when ``key`` (as
    autograd's engine carries the caller's dispatch keys to its device thread); what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        module = front.compiled()
        if key:
            module.set_included(True)
        try:
            body()
        except BaseException as exc:  # handed to the caller
            raised.append(exc)
        finally:
            if key:
                module.set_included(False)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


@pytest.fixture
def backward_elsewhere(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every ``Tensor.backward`` runs on a thread of its own that has the front's key where the
    caller's front is on, and no session: where a GPU step's backward pass runs. Lists, per call,
    whether the caller's front was on."""
    calls: list[bool] = []
    real = torch.Tensor.backward

    def elsewhere(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        calls.append(front.active())
        raised = _on_a_thread(lambda: real(self, *args, **kwargs), key=calls[-1])
        if raised is not None:
            raise raised

    monkeypatch.setattr(torch.Tensor, "backward", elsewhere)
    return calls


def _steps(engine: StepEngine, chunks: list[Any]) -> list[tuple[bytes, bytes, bytes, int]]:
    """Trainer and auditor steps from fresh states: each step's leaves, log bytes and corrections."""
    spec = engine.cfg.spec_hash()
    s_rec, s_aud = engine.init_state(), engine.init_state()
    got = []
    for step, chunk in enumerate(chunks, start=1):
        rec = engine.run_step(s_rec, step, mode="record")
        assert rec.log is not None and engine.last_mode is not None and engine.last_mode.via_front
        aud = engine.run_step(s_aud, step, mode="replay", log=chunk)
        assert engine.last_mode.via_front
        got.append((rec.leaf, rec.log.encode(step, spec), aud.leaf, aud.corrections))
    return got


@pytest.mark.parametrize("preset", ["mlp-digits", "gpt-shakespeare"])
def test_sharedSession_servesTheBackwardThread(preset: str, request: pytest.FixtureRequest) -> None:
    """A deferring step (the GPU path) whose backward pass runs on another thread gives the leaves,
    log and corrections of the immediate step on one thread. A CPU step's
    session is not shared: there the other thread's ops pass unrounded and unlogged (so the
    backward really moved). The immediate step runs where the deferring one does; on a GPU that
    is a device step, whose session is shared too, so the unshared control is a CPU step."""
    deferring, immediate = _engines(preset)
    on_cpu = StepEngine(deferring.cfg, get_profile("cpu-1t"))
    on_cpu.defer = False
    noisy = StepEngine(deferring.cfg, get_profile("noisy"))  # a trainer whose log needs corrections
    s_noisy = noisy.init_state()
    chunks = [noisy.run_step(s_noisy, step, mode="record").log for step in (1, 2)]
    want = _steps(immediate, chunks)  # test_cuda_groups holds the deferring step on one thread to it
    assert sum(r[3] for r in want) > 0
    logged = _logged_in_step_1(on_cpu)
    moved = request.getfixturevalue("backward_elsewhere")
    assert _steps(deferring, chunks) == want
    assert moved and all(moved)
    assert _logged_in_step_1(on_cpu) < logged  # not shared: the backward's ops were not rounded


def _logged_in_step_1(engine: StepEngine) -> int:
    """The tensors a first record step logged (its state may leave the grid, which raises after)."""
    with contextlib.suppress(OffGridError):
        engine.run_step(engine.init_state(), 1, mode="record")
    assert engine.last_mode is not None
    return engine.last_mode.op_index


def _enter_shared(on_op: Callable[..., tuple[int, int]] | None = None) -> None:
    g = rounding._grid(32)
    session.enter(
        session.row_for,
        on_op or (lambda row, kind, tensors, index, cursor, records: (index, cursor)),
        session.Kernels(k0=g.k0, max_finite=g.max_finite),
        shared=True,
    )


def test_twoSharedSessions_aThreadOfNeither_raises() -> None:
    """With two shared sessions open (two GPU steps in one process), an op on a thread with the
    key and no session could be either's: the front raises rather than log it in one of them."""
    entered, done = threading.Barrier(3), threading.Event()

    def owner() -> None:
        _enter_shared()
        try:
            entered.wait()
            done.wait()
        finally:
            session.leave()

    owners = [threading.Thread(target=owner) for _ in range(2)]
    for t in owners:
        t.start()
    try:
        entered.wait()
        assert front.compiled().shared_open() == 2
        raised = _on_a_thread(lambda: torch.ones(3, dtype=torch.float64) / 3.0, key=True)
        assert isinstance(raised, RuntimeError) and "two shared sessions" in str(raised)
        assert _on_a_thread(lambda: torch.ones(3, dtype=torch.float64) / 3.0, key=False) is None
    finally:
        done.set()
        for t in owners:
            t.join()
    assert front.compiled().shared_open() == 0


def test_sharedSession_twoThreadsAtOnce_raises() -> None:
    """Ops of one step on two threads at once would log in an order set by timing: while the
    owner's op is in the front (here, in its Python call), another thread's op raises, and the
    owner's session is whole afterwards."""
    seen: list[BaseException | None] = []
    calls: list[int] = []

    def on_op(
        row: int, kind: int, tensors: list[torch.Tensor], index: int, cursor: int, records: Any
    ) -> tuple[int, int]:
        calls.append(len(tensors))
        seen.append(_on_a_thread(lambda: torch.ones(3, dtype=torch.float64) * 7.0, key=True))
        return index + len(tensors), cursor

    _enter_shared(on_op)
    try:
        torch.ones(3, dtype=torch.float64) / 3.0  # inexact: the front calls on_op
        assert front.compiled().shared_open() == 1
    finally:
        left = session.leave()
    assert calls == [1] and left.op_index == 1
    (raised,) = seen
    assert isinstance(raised, RuntimeError) and "two threads" in str(raised)
    assert front.compiled().shared_open() == 0


class _Boom(Exception):
    pass


def test_sharedSession_anErrorOnTheBackwardThread_reachesTheCaller(
    backward_elsewhere: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error raised in the front's Python call on the backward pass's thread reaches the step's
    caller as itself, and the step's shared session is closed after it."""
    owner = threading.get_ident()
    real = RoundingMode._front_op

    def fails_elsewhere(self: RoundingMode, *args: Any) -> tuple[int, int]:
        if threading.get_ident() != owner:
            raise _Boom("on the backward thread")
        return real(self, *args)

    monkeypatch.setattr(RoundingMode, "_front_op", fails_elsewhere)
    deferring, _ = _engines("mlp-digits")
    with pytest.raises(_Boom, match="on the backward thread"):
        deferring.run_step(deferring.init_state(), 1, mode="record")
    assert backward_elsewhere == [True]
    assert not front.active() and front.compiled().shared_open() == 0
