"""Deterministic construction of a user's model at step 0: leaf 0 from the seed and the code alone.

A stock factory (``lambda: MyNet()``, a transformers ``GPT2LMHeadModel(GPT2Config(...))``) sets its
parameters with torch's generator (``kaiming_uniform_``, ``normal_``) and sometimes with inexact
arithmetic (``erfinv``, QR, ``sin`` for a sinusoidal table): another machine, or another thread
count, would build another model. Inside :class:`InitMode`:

* floating tensors are float64 (the default dtype is set for the duration);
* every random draw a torch function makes is served from the counter RNG at step 0 with purpose
  ``init/{ordinal}/{name}`` (:mod:`~game.training.dispatch.draws`: the same functions and values
  as in a step, with 53-bit uniforms and unrounded Irwin-Hall normals, since nothing is rounded);
* data movement and IEEE-exact ops pass (fills, copies, ``zero_``, multiplies by Python numbers);
* an inexact op of IEEE arithmetic or libm (``pow``, ``exp``, ``sin``: a sinusoid or rotary table),
  in float32 or float64, is rounded to nearest float32, the same on every machine (in float16 or
  bfloat16, that float32 value converted: Apertus builds its activation's parameters so);
  ``torch.linspace``, a 2-norm (a weight norm's), matrix products (a spectral norm's), a QR
  factorisation (``orthogonal_``'s) and running sums and products (``cumprod``: a diffusion
  model's noise schedule) are served by rules of their own, the same bits on every machine
  (:mod:`~game.training.dispatch.initrules`);
* any other op that produces or changes a floating tensor runs as this machine computes it, and its
  results are provisional (:mod:`~game.training.dispatch.provisional`): a throwaway forward pass
  that sizes a layer passes, and the model is refused, naming the op, where such a value reaches
  its state or leaves torch (``item()``). An op that still draws from torch's generator raises
  :class:`~game.errors.UnsupportedOpError` at once, naming it. Arithmetic on Python floats
  (``math.sqrt`` for a bound) is not an op and is the same everywhere (IEEE), so it passes.

So the constructed model is bit-identical on every machine and thread count, and depends on nothing
but the seed and the factory's code. Integer and boolean results pass whatever the op (a causal
mask made with ``tril`` is exact).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from game.errors import ConfigError, TaskCodeError, VGameError
from game.training.dispatch import nearest, stockops, torchrandom, widen
from game.training.dispatch.draws import Draws, ServingMode
from game.training.dispatch.initrules import INIT_FIX, SERVED, WHERE
from game.training.dispatch.opplan import classify, plan_of, touched_tensors
from game.training.dispatch.optable import OpClass, op_name, refusal
from game.training.dispatch.provisional import OVERWRITES, SCALAR, LeakGuard, Provisional, known_cause

#: A call's arguments: positional and keyword.
Call = tuple[tuple[Any, ...], dict[str, Any]]

#: In-place draws served where they reach ATen at construction (ATen name -> the served fill): a
#: library that wraps ``nn.init``'s functions (transformers guards them against a second
#: initialisation) calls them from inside its own torch function, where the function mode cannot
#: see the draw; construction always runs on the CPU, so the ATen op is the same on every machine.
#: The dispatcher leaves out trailing arguments equal to their defaults (T5 draws ``normal_(w,
#: mean=0.0, std=1.0)``, which arrives as ``normal_(w)``), so they are filled in here.
_FILLS: dict[str, Any] = {
    "aten.normal_.default": lambda d, a: torchrandom.fill_normal(d, "normal_", a[0], *_given(a, 0.0, 1.0)),
    "aten.uniform_.default": lambda d, a: torchrandom.fill_uniform(d, "uniform_", a[0], *_given(a, 0.0, 1.0)),
}


def _given(args: tuple[Any, ...], *defaults: float) -> list[float]:
    """An in-place draw's two parameters after its tensor, the defaults where they were left out."""
    return [float(args[1 + i]) if len(args) > 1 + i else d for i, d in enumerate(defaults)]


class _ExactOnly(TorchDispatchMode):
    """Lets data movement and exact ops through, and any op on meta tensors (no values); serves an
    in-place normal or uniform draw (:data:`_FILLS`); refuses an inexact op that produced or changed
    a floating tensor, and any other op that draws from torch's generator."""

    def __init__(self, draws: Draws) -> None:
        super().__init__()
        self.draws = draws
        self.provisional = Provisional()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        cls = classify(func, args, kwargs)
        came = None  # the op behind a provisional argument (provisional.py)
        if self.provisional:
            name = op_name(func)
            overwrite = (
                name in OVERWRITES
                and cls in (OpClass.MOVE, OpClass.EXACT)
                and bool(args)
                and isinstance(args[0], Tensor)
            )
            read = tree_leaves((args[1:], kwargs) if overwrite else (args, kwargs))
            came = self.provisional.origin(t for t in read if isinstance(t, Tensor))
            if came is not None and name == SCALAR:
                raise self.provisional.refuse_leak(came, "item(), bool(), int() or float()")
            if overwrite and came is None:
                out = func(*args, **kwargs)
                self.provisional.release(args[0])
                return out
        fill = _FILLS.get(op_name(func)) if cls is OpClass.REFUSED else None
        if fill is not None and not kwargs and len(args) <= 3:
            return fill(self.draws, args)
        rule = SERVED.get(op_name(func)) if cls is OpClass.INEXACT else None
        if rule is not None and (served := rule(args, kwargs)) is not None:
            return self._kept(func, args, kwargs, served, came)
        given = (
            nearest.before(func, args, kwargs)
            if cls is OpClass.INEXACT and nearest.rounds_to_nearest(func)
            else None
        )
        narrow = widen.AT_CONSTRUCTION
        wide = (
            widen.writes_apart(*_writes(func), (args, kwargs), widen.widened(args, kwargs, narrow))
            if given is not None and widen.narrow_inputs(args, kwargs, narrow)
            else None
        )
        out = func(*args, **kwargs)
        if cls is OpClass.MOVE or cls is OpClass.EXACT:
            return self._kept(func, args, kwargs, out, came)
        touched = touched_tensors(func, args, kwargs, out)
        if all(t.is_meta for t in touched):  # no values (a model built on "meta"): nothing can differ
            return out
        if cls is OpClass.REFUSED:
            raise refusal(func, WHERE)
        if given is not None and self._to_nearest(func, touched, wide, given):
            return self._kept(func, args, kwargs, out, came)
        if any(t.is_floating_point() or t.is_complex() for t in touched):
            # this machine's own result: allowed while nothing of it is kept (provisional.py)
            self.provisional.mark(touched, came or op_name(func))
        elif came is not None:
            self.provisional.mark(touched, came)
        return out

    def _kept(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, came: str | None
    ) -> Any:
        """``out``, its tensors and those the op wrote made provisional where an argument was."""
        if came is not None:
            self.provisional.mark(touched_tensors(func, args, kwargs, out), came)
        return out

    @staticmethod
    def _to_nearest(func: Any, touched: list[Any], wide: Call | None, given: Call) -> bool:
        """An op of :data:`~game.training.dispatch.nearest.NEAREST`: its results rounded to
        nearest float32 (:func:`~game.training.dispatch.nearest.to_nearest`, working values near a
        boundary out again from ``given``, the arguments before the op), a float32, float16 or
        bfloat16 result by way of the op's float64 twin (``wide``: its arguments widened, see
        :data:`~game.training.dispatch.widen.AT_CONSTRUCTION`; a half-precision result takes that
        float32 value by IEEE conversion), a float64 one from its own values. False where a result
        is of another floating dtype, or none of its twin's is float64 (refused by the caller)."""
        name = op_name(func)
        if wide is None:
            found = [(t, t) for t in touched]
        else:
            args, kwargs = wide
            twins = touched_tensors(func, args, kwargs, func(*args, **kwargs))
            found = widen.pairs(name, touched, twins, narrow=widen.AT_CONSTRUCTION)
        floating = [(t, w) for t, w in found if t.is_floating_point() or t.is_complex()]
        if any(
            t.dtype not in (*widen.AT_CONSTRUCTION, torch.float64) or w.dtype != torch.float64
            for t, w in floating
        ):
            return False
        nearest.to_nearest(func, floating, given)
        return True


def _writes(func: Any) -> tuple[tuple[tuple[int, str, bool], ...], tuple[tuple[int, ...], int] | None]:
    """The arguments an op writes (its plan's ``written`` and ``hidden``)."""
    plan = plan_of(func)
    return plan.written, plan.hidden


class InitMode:
    """The context in which a model is built deterministically from ``seed`` (module docstring).

    ``served``: the served calls by function name, as in a step's :class:`~game.training.dispatch.stockops.StockOps`.
    """

    def __init__(self, seed: int) -> None:
        assert stockops.HANDLERS  # the handlers are registered
        self.draws = Draws(seed, 0, "init")
        self._serving = ServingMode(self.draws)
        self._exact = _ExactOnly(self.draws)
        self._leaks = LeakGuard(self._exact.provisional)
        self._dtype = torch.get_default_dtype()

    @property
    def served(self) -> Counter[str]:
        return self._serving.handled

    def check(self, model: nn.Module) -> None:
        """Refuse ``model`` where a tensor it holds has a value an inexact op computed here
        (:meth:`~game.training.dispatch.provisional.Provisional.check_model`)."""
        self._exact.provisional.check_model(model)

    def __enter__(self) -> InitMode:
        self._dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        self._exact.__enter__()
        self._leaks.__enter__()
        self._serving.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._serving.__exit__(*exc)
            self._leaks.__exit__(*exc)
            self._exact.__exit__(*exc)
        finally:
            torch.set_default_dtype(self._dtype)


def init_module(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``factory()`` inside :class:`InitMode`, with every floating parameter and buffer then made
    float64 (exact: a widening). The same module, bit for bit, on every machine."""
    with InitMode(seed) as mode:
        try:
            model = factory()
        except VGameError:
            raise
        except Exception as exc:  # the task's own code (a model's constructor): one line
            cause = known_cause(exc.__traceback__)  # a library call vgame knows, with its fix
            raise TaskCodeError(
                f"the task's model factory raised {type(exc).__name__}: {exc} "
                + (f"({cause})" if cause else "(run with VGAME_DEBUG=1 for the traceback)")
            ) from exc
        if not isinstance(model, nn.Module):
            raise ConfigError(f"the model factory returned a {type(model).__name__}, not an nn.Module")
        lazy = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if is_lazy(t)]
        if lazy:
            raise ConfigError(
                f"the model's {', '.join(lazy)} {'is' if len(lazy) == 1 else 'are'} not materialised yet (a lazy "
                "module, nn.LazyLinear and kin): leaf 0 holds the model's state as built, so run a throwaway "
                "forward pass in the model factory (model = Net(); model(example); return model), which "
                "construction allows"
            )
        mode.check(model)
    return model.to(torch.float64)


__all__ = ["INIT_FIX", "InitMode", "init_module"]
