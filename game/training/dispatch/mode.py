"""The TorchDispatchMode that rounds (and logs or corrects) every op result of a training step.

The paper's code rounds at ``nn.Module`` boundaries and so misses functional ops, parameter gradients,
optimizer state and BatchNorm running stats. A dispatch mode sits below autograd and sees every ATen
op that forward, backward and ``optimizer.step()`` run, whatever Python code called it. Each op's
class comes from the op table (:mod:`~game.training.dispatch.optable`): ``MOVE`` ops pass, ``EXACT``
ones are rounded without a log entry, ``INEXACT`` ones with the log; an inexact op on float32 tensors
is rounded by way of its float64 twin (:mod:`~game.training.dispatch.widen`).

The trainer *records* trits, the auditor *replays* them (``rev`` corrections); ``round`` rounds
without a log (to show divergence) and ``plain`` does not round at all (baselines). A hardware
profile's emulation (split-K order, noise) is applied to inexact ops before rounding in every mode.
What each role does with a tensor is in :mod:`~game.training.dispatch.roles`, this step's state in
:mod:`~game.training.dispatch.modestate`.

With a profile that emulates nothing, the C++ front (``native/front.cpp``) stands in for
``__torch_dispatch__``, on CPU and on a GPU: ops that round nothing skip Python, the rest come to
:meth:`RoundingMode._front_op` (see :meth:`RoundingMode.__enter__` and
:mod:`~game.training.dispatch.frontmode`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from game.training.dispatch import front, widen
from game.training.dispatch.frontmode import FrontMode
from game.training.dispatch.modestate import DeferredChecksFailed
from game.training.dispatch.opplan import OpPlan, conditional_class, plan_of, touched_by
from game.training.dispatch.optable import OpClass, refusal, refuse_unrounded
from game.training.dispatch.roles import RoleKernels


class RoundingMode(FrontMode):
    """Round every float64 result of the ops run inside it; record or replay the rounding log.

    One instance serves one training step: ``op_index`` counts the logged tensors of that step.
    """

    def __enter__(self) -> RoundingMode:
        """Push the mode; or, with a profile that emulates nothing (``compute`` is the op itself, no
        noise) and where the C++ front loads, switch the front on instead: the same classes,
        rounding and log, without a Python call for an op that rounds nothing. A subclass that
        changes ``__torch_dispatch__`` keeps the mode. A step on a device, or one that defers its
        checks, shares its session with autograd's device thread, which runs a GPU step's backward
        pass (``front.cpp`` says how)."""
        cls = type(self)
        self._groups = (
            self._defer is not None
            and cls._round_exact is RoleKernels._round_exact
            and cls._round_inexact is RoleKernels._round_inexact
        )
        if (
            self.role.rounds
            and cls.__torch_dispatch__ is RoundingMode.__torch_dispatch__
            and self.profile.interceptor() == "front"
        ):
            row_for = functools.partial(front.row_for, where=f"step {self.step}: ")
            shared = self._defer is not None or torch.device(self.profile.device).type != "cpu"
            front.enter(row_for, self._front_op, self._front_kernels(), shared=shared)
            self._front = self.via_front = True
            return self
        super().__enter__()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if not self._front:
            super().__exit__(exc_type, exc_val, exc_tb)
            return
        self._front = False
        left = front.leave()
        self._front_sync(left.op_index, left.cursor, left.records)
        self.corrections += left.corrections
        self.free += left.free
        self.front_kernel_tensors = left.tensors
        self._add_tallies()  # an earlier session's, if any: this one's are added when read
        self._tallies = left

    @property
    def ops(self) -> frozenset[str]:
        """Names (``str(func)``) of every op that ran."""
        return frozenset(self.classes)

    def finish(self) -> None:
        """Check a replayed log was used up exactly (a longer log is as wrong as a shorter one);
        with deferred checks, read them back first and write the log (:class:`DeferredChecksFailed`
        when one failed: the step must run again without deferral)."""
        if self.deferred_failed():
            raise DeferredChecksFailed(
                f"step {self.step}: a deferred check failed; run the step without deferral", self.failed_calls
            )
        if self._cursor is not None:
            self._cursor.finish()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        plan = plan_of(func)
        cls = plan.fixed if plan.fixed is not None else conditional_class(func, args, kwargs)
        name = plan.name
        if cls is OpClass.REFUSED:  # always fixed but for GRADIENT_REFUSED's, whose calls differ
            raise refusal(func, f"step {self.step}: ")
        if name not in self._classes:  # an op's first call in the step: nothing here for the others
            self._classes[name] = cls
        if cls is OpClass.MOVE:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                return self._mixed(func, plan, cls, args, kwargs, exc)
        if cls is OpClass.EXACT:
            try:
                out = func(*args, **kwargs)
            except Exception as exc:
                return self._mixed(func, plan, cls, args, kwargs, exc)
            if self.role.rounds:
                self._round_results(True, touched_by(plan, args, kwargs, out), name)
            return out
        if self.role.rounds and widen.narrow_inputs(args, kwargs, widen.IN_STEP):
            return self._widened(func, plan, args, kwargs)
        try:
            out = self.profile.compute(func, args, kwargs)
        except Exception as exc:
            return self._mixed(func, plan, cls, args, kwargs, exc)
        touched = touched_by(plan, args, kwargs, out)
        if self.role.rounds:
            if widen.defaulted(touched) and not plan.written and plan.hidden is None:  # writes none twice
                return self._defaulted(func, plan, args, kwargs, out, touched)
            refuse_unrounded(name, touched, f"step {self.step}: ")
        self._round_results(False, touched, name)
        return out

    def _widened(self, func: Any, plan: OpPlan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An inexact op on float32, half or bfloat16 tensors (:mod:`~game.training.dispatch.widen`,
        ``IN_STEP``): run as it is,
        and again on its arguments widened to float64 under the profile's emulation; the twin's
        float64 results are rounded (and logged) as the op's, then written into its results."""
        twin = widen.widened(args, kwargs, widen.IN_STEP)  # before the op: an in-place op's start
        wide_args, wide_kwargs = widen.writes_apart(plan.written, plan.hidden, (args, kwargs), twin)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            return self._mixed(func, plan, OpClass.INEXACT, args, kwargs, exc)
        wide_out = self.profile.compute(func, wide_args, wide_kwargs)
        self._round_twin(
            plan, touched_by(plan, args, kwargs, out), touched_by(plan, wide_args, wide_kwargs, wide_out)
        )
        return out

    def _mixed(
        self,
        func: Any,
        plan: OpPlan,
        cls: OpClass,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        exc: Exception,
    ) -> Any:
        """A call torch refused (``exc``) that takes float32 tensors beside float64 ones
        (:func:`~game.training.dispatch.widen.mixed`): run as its float64 twin, whose results are the
        op's, rounded as its class says; a float32 tensor it writes takes its twin's values. Any
        other refused call raises ``exc``, as torch words it."""
        if not widen.mixed(args, kwargs):
            raise exc
        wide_args, wide_kwargs = widen.widened(args, kwargs, widen.MIXED)
        compute = self.profile.compute if cls is OpClass.INEXACT else _call
        out = compute(func, wide_args, wide_kwargs)
        if cls is OpClass.INEXACT or (cls is OpClass.EXACT and self.role.rounds):
            touched = touched_by(plan, wide_args, wide_kwargs, out)
            if self.role.rounds:
                refuse_unrounded(plan.name, touched, f"step {self.step}: ")
            self._round_results(cls is OpClass.EXACT, touched, plan.name)
        # the tensors it writes (no output: ``touched_by`` then lists those alone), beside their copies
        back = list(
            zip(
                touched_by(plan, args, kwargs, None),
                touched_by(plan, wide_args, wide_kwargs, None),
                strict=True,
            )
        )
        widen.write_back(back)
        return widen.unaliased(out, back)

    def _defaulted(
        self,
        func: Any,
        plan: OpPlan,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        touched: list[torch.Tensor],
    ) -> Any:
        """An inexact op with a float32 result in torch's default dtype and no float32 argument
        (:func:`~game.training.dispatch.widen.default_twin`): its twin runs under a float64 default
        and is rounded as the op's, as :meth:`_widened`'s is."""
        wide_out = widen.default_twin(lambda: self.profile.compute(func, args, kwargs))
        self._round_twin(plan, touched, touched_by(plan, args, kwargs, wide_out))
        return out

    def _round_twin(self, plan: OpPlan, touched: list[torch.Tensor], twins: list[torch.Tensor]) -> None:
        """Round (and log) an op's float64 twin's results as the op's, then write them into its own."""
        name, where = plan.name, f"step {self.step}: "
        found = widen.pairs(name, touched, twins, where, widen.IN_STEP)
        rounded = [w for _, w in found]
        refuse_unrounded(name, rounded, where)
        self._round_results(False, rounded, name)
        widen.write_back(found)


def _call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


__all__ = ["RoundingMode"]
