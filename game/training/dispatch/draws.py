"""Served draws: where the randomness vgame serves in place of torch's generator comes from, and the
table of torch functions it serves.

Why: a stock ``nn.Dropout`` or ``torch.rand`` draws from torch's generator, whose bits depend on the
device (CUDA runs other kernels, even other ops: ``native_dropout`` where the CPU runs
``bernoulli_``), so an auditor replaying a step on other hardware drew other bits and saw "log
tampering". Vgame serves these calls itself, from the counter RNG (:mod:`~game.training.numerics.rng`),
at the level of the torch *function* (``F.dropout``, ``torch.rand``, ``Tensor.bernoulli_``,
``F.scaled_dot_product_attention``...), above autograd, so that forward and backward run the same
ATen ops on every device. Handlers register here with :func:`serves`; a step's micro-batch serves them
through :class:`~game.training.dispatch.stockops.StockOps`, a model's construction through
:class:`~game.training.dispatch.initmode.InitMode`.

Keying (DETrain: a draw belongs to its example, not to its position in the batch). Each served draw
of a context takes the next ``ordinal`` (0, 1, ... in call order; a call that draws nothing, such as
dropout in eval mode, takes none) and the purpose ``f"{prefix}/{ordinal}/{name}"``, ``name`` being the
torch function's ``__name__`` (``dropout``, ``rand``, ``bernoulli_``, ``scaled_dot_product_attention``):

* when the drawn tensor's first dimension equals the number of the micro-batch's example ids, row
  ``i`` is example id ``i``'s stream (``rng``'s example axis), so a mask follows its example whatever
  the batch layout or the split between workers: rows 0..7 at once give the bits of 0..3 and 4..7;
* otherwise the draw is one stream, of example id 0, and the micro-batch index joins the purpose
  (``f"{prefix}/{ordinal}/{name}/micro{index}"``): such a draw depends on the micro-batch's layout,
  which is part of the task.

A step's prefix is ``torch`` at the step's own number; a model's construction draws ``init/...`` at
step 0 with no examples. ``randperm`` is always one stream (a permutation is not per row). Values: a
keep mask or a Bernoulli draw takes one word per element and keeps it when ``word < ceil(p * 2**32)``
(:func:`rng.bernoulli_mask`); a uniform takes ``k = bits - 8`` bits (the grid's significand, 24 on
float32's) as ``(word >> (32 - k)) * 2**-k``, on the grid by construction and below 1 (a rounded
53-bit uniform could round up to 1.0), or :func:`rng.uniform`'s 53 bits where nothing is rounded (a
construction); a normal is Irwin-Hall (:func:`rng.irwin_hall`: twelve words, exact integer sums, no
transcendental function), then rounded to the grid; an integer below ``n`` (``n < 2**31``) is
``(word * n) >> 32``. These standard values are made with the dispatch modes suspended (integer
arithmetic, the same everywhere); what a function makes of them (``x * mask``, ``mean + std * z``)
runs as ordinary ops under the step's interceptor, which rounds them as any others. One exception,
for speed: dropout's scaled mask ``keep * 1/(1-p)`` is made suspended too (:meth:`Draws.scaled_mask`),
as 0 or the scale rounded to the grid, the values the interceptor's rounding gives; dropout's own
(:meth:`Draws.scaled`) comes from the words in one pass (:func:`rng.scaled_keep`).

A ``generator=`` argument is ignored: every served draw comes from the counter RNG. Calls made while
a ``__torch_dispatch__`` runs (the interceptor's own work: the ``noisy`` profile's perturbation,
calibration's random inputs) are never served, whatever module makes them and however the mode came
to be on there: they belong to the machine, not to the model, and must not take ordinals. (Torch
pops a function mode while it handles each torch call, so the ops an interceptor meets mostly run
without it; :func:`beneath_dispatch` makes it a rule, at the cost of a walk up the stack per served
call only.)
"""

from __future__ import annotations

import functools
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from game.errors import ConfigError, UnsupportedOpError, VGameError
from game.training.dispatch import widen
from game.training.numerics import rng, rounding

#: A served function's handler: (the context's draws, the function, its args, its kwargs) -> result.
Handler = Callable[["Draws", Any, tuple[Any, ...], dict[str, Any]], Any]

#: Every served torch function (the object the function mode receives) -> its handler.
SERVED: dict[Any, Handler] = {}


def serves(*funcs: Any) -> Callable[[Handler], Handler]:
    """Register a handler for these torch functions (a function torch lacks is skipped)."""

    def register(handler: Handler) -> Handler:
        for func in funcs:
            if func is not None:
                SERVED[func] = handler
        return handler

    return register


def named_args(names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A served call's arguments by name, ``names`` in order (the first, ``self`` or ``input``, as
    ``self``), keywords as given."""
    given = dict(zip(names, args, strict=False)) | kwargs
    if "input" in given:
        given["self"] = given.pop("input")
    return given


def name_of(func: Any) -> str:
    """The name a served function's draws are keyed by (``F.dropout`` -> ``dropout``)."""
    return str(getattr(func, "__name__", func))


class Draws:
    """One context's served randomness: a micro-batch of a step, or a model's construction.

    ``bits``: the task's grid (uniforms of ``bits - 8`` bits, normals rounded to it); None where
    nothing is rounded (construction: 53-bit uniforms, exact Irwin-Hall values).
    """

    def __init__(
        self,
        seed: int,
        step: int,
        prefix: str,
        *,
        micro_batch: int | None = None,
        example_ids: Tensor | None = None,
        bits: int | None = None,
    ) -> None:
        if bits is not None and not 16 <= bits <= 32:
            raise ConfigError(f"bits: {bits} is outside 16..32")
        self.seed = seed
        self.step = step
        self.prefix = prefix
        self.micro_batch = micro_batch
        self.example_ids = example_ids
        self.rows = -1 if example_ids is None else int(example_ids.numel())
        self.bits = bits
        self.ordinal = 0  # served draws so far

    def key(
        self, name: str, shape: Sequence[int], *, per_example: bool = True
    ) -> tuple[str, Tensor | None, tuple[int, ...]]:
        """The next draw's purpose, example ids (None: one stream) and per-row shape (module docstring)."""
        purpose = f"{self.prefix}/{self.ordinal}/{name}"
        self.ordinal += 1
        shape = tuple(int(s) for s in shape)
        if per_example and shape and shape[0] == self.rows:
            return purpose, self.example_ids, shape[1:]
        if self.micro_batch is not None:
            purpose = f"{purpose}/micro{self.micro_batch}"
        return purpose, None, shape

    def mask(self, name: str, shape: Sequence[int], p_keep: float, device: torch.device) -> Tensor:
        """A bool keep mask of ``shape``: True with probability ``ceil(p_keep * 2**32) / 2**32``."""
        with suspended():
            return self._keep(name, shape, p_keep, device)

    def _keep(self, name: str, shape: Sequence[int], p_keep: float, device: torch.device) -> Tensor:
        """:meth:`mask`'s draw, for a caller that has suspended the interceptors."""
        purpose, ids, rest = self.key(name, shape)
        return rng.bernoulli_mask(self.seed, self.step, purpose, ids, rest, p_keep, device).reshape(shape)

    def scaled(
        self,
        name: str,
        shape: Sequence[int],
        p_keep: float,
        device: torch.device,
        scale: float,
        dtype: torch.dtype,
    ) -> Tensor:
        """:meth:`scaled_mask`'s scaled mask alone (dropout's, which does not need the keep mask),
        made from the words in one pass where it is rounded float64 (:func:`rng.scaled_keep`:
        the same values)."""
        value = self._scale_on_grid(scale, dtype)
        if value is None:
            return self.scaled_mask(name, shape, p_keep, device, scale, dtype)[1]
        purpose, ids, rest = self.key(name, shape)
        return rng.scaled_keep(self.seed, self.step, purpose, ids, rest, p_keep, value, device).reshape(shape)

    def scaled_mask(
        self,
        name: str,
        shape: Sequence[int],
        p_keep: float,
        device: torch.device,
        scale: float,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`mask`'s keep mask, and ``keep.to(dtype) * scale`` as a rounding step computes it
        (0, or ``scale`` rounded to the grid's nearest), both made with the interceptor suspended.

        Why: dropout's scaled mask was two rounded ops a draw (the conversion and the product), each
        a Python call of the interceptor and, on a GPU, a kernel launch: 74 of a GPT-2-shape step's
        632 (issue 46). The product of 0 or 1 by the rounded scale is exact, so the values are the
        ones the step's rounding gave. Where nothing is rounded (``bits`` None), ``dtype`` is not
        the step's float64, or the scale is past the grid's range (its rounding says so), the
        product runs under the interceptor as written.
        """
        value = self._scale_on_grid(scale, dtype)
        with suspended():
            keep = self._keep(name, shape, p_keep, device)
            if value is not None:
                return keep, keep.to(dtype).mul_(value)
        return keep, keep.to(dtype) * scale

    def _scale_on_grid(self, scale: float, dtype: torch.dtype) -> float | None:
        """A mask's scale rounded to the grid's nearest, where the step rounds a float64 mask;
        None where it does not, or where the scale is past the grid's range."""
        return _on_grid(scale, self.bits) if self.bits is not None and dtype == torch.float64 else None

    def words(self, name: str, shape: Sequence[int], device: torch.device) -> Tensor:
        """One uint32 word per element (int64), for draws that compare against a tensor."""
        purpose, ids, rest = self.key(name, shape)
        with suspended():
            return rng.random_u32(self.seed, self.step, purpose, ids, rest, device).reshape(shape)

    def uniform(self, name: str, shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> Tensor:
        """Uniform in ``[0, 1)``: ``bits - 8`` bits (on the grid), or 53 where nothing is rounded."""
        purpose, ids, rest = self.key(name, shape)
        with suspended():
            if self.bits is None:
                u = rng.uniform(self.seed, self.step, purpose, ids, rest, device)
            else:
                k = self.bits - 8
                w = rng.random_u32(self.seed, self.step, purpose, ids, rest, device) >> (32 - k)
                u = w.to(torch.float64) * 2.0**-k
            return u.reshape(shape).to(dtype)

    def open_uniform(
        self, name: str, shape: Sequence[int], device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """Uniform in ``(0, 1)``, never 0 nor 1, so that its logarithm is finite and not 0: the
        midpoints ``(2w + 1) * 2**-k`` of :meth:`uniform`'s steps (``k`` its bits, ``w`` its word
        less its last bit), on the grid."""
        u = self.uniform(name, shape, device, torch.float64)
        k = 53 if self.bits is None else self.bits - 8
        with suspended():  # IEEE-exact: a product by a power of two, a floor, a sum of two k-bit values
            return (torch.floor(u * 2.0 ** (k - 1)) * 2.0 ** -(k - 1) + 2.0**-k).to(dtype)

    def normal(self, name: str, shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> Tensor:
        """Approximately standard normal: Irwin-Hall (exact integer sums), rounded to the grid."""
        purpose, ids, rest = self.key(name, shape)
        with suspended():
            z = rng.irwin_hall(self.seed, self.step, purpose, ids, rest, device)
            if self.bits is not None:
                z = rounding.rnd(z, self.bits)
            return z.reshape(shape).to(dtype)

    def below(self, name: str, shape: Sequence[int], n: int, device: torch.device) -> Tensor:
        """Integers in ``[0, n)`` (int64), ``n < 2**31``."""
        if not 1 <= n < 2**31:
            fix = "draw from a range of 1 .. 2**31-1 values (or combine two draws)"
            raise UnsupportedOpError(f"{name}: a range of {n} values is not served: {fix}", op=name, fix=fix)
        purpose, ids, rest = self.key(name, shape)
        with suspended():
            return rng.randbelow(self.seed, self.step, purpose, ids, rest, n, device).reshape(shape)

    def permutation(self, name: str, n: int, device: torch.device) -> Tensor:
        """A random permutation of ``range(n)``: a stable argsort of 53-bit keys, one stream."""
        purpose, _, _ = self.key(name, (n,), per_example=False)
        with suspended():
            keys = rng.uniform_int53(self.seed, self.step, purpose, None, (n,), device)
            return torch.sort(keys, stable=True).indices


#: Neither the dispatch modes, the C++ front nor any function mode see the ops inside (a draw's
#: standard values are integer arithmetic on explicit devices); one level deep however nested.
suspended = rng.suspended


@functools.cache
def _on_grid(scale: float, bits: int) -> float | None:
    """``scale`` rounded half-to-even onto the ``bits`` grid (:func:`rounding.rnd`, the rule an
    exact op's result is rounded by); None where it is not finite or not below the grid's largest
    value (the interceptor's rounding then speaks for it)."""
    if not (math.isfinite(scale) and abs(scale) < rounding.grid_max(bits)):
        return None
    with suspended():
        return float(rounding.rnd(torch.tensor([scale], dtype=torch.float64), bits)[0])


def beneath_dispatch() -> bool:
    """Whether a ``__torch_dispatch__`` (or the front's call into Python) is running below this
    frame: its calls are the interceptor's, never the model's (the module docstring)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in ("__torch_dispatch__", "_front_op"):
            return True
        frame = frame.f_back
    return False


def _writes(func: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a torch call writes a tensor it is given (an in-place method, ``x[i] = v``, ``out=``)."""
    name = getattr(func, "__name__", "")
    in_place = name.endswith("_") and not name.endswith("__")
    return in_place or name.startswith("__i") or name == "__setitem__" or "out" in kwargs


class ServingMode(TorchFunctionMode):
    """The function mode: a dict lookup per torch call; a served one goes to its handler with the
    context's :class:`Draws`, every other straight through. ``handled`` counts the served calls by
    name (also those that drew nothing, such as dropout in eval mode).

    A call that raises and takes float32 (or bfloat16) tensors beside float64 ones
    (:func:`~game.training.dispatch.widen.mixed`) runs again on float64 copies of them: torch
    checks some mixes in its composite code, above the dispatch, where the interceptors'
    own retry of such a call cannot reach (a convolution's bias, ``F.bilinear``, ``F.prelu``). The
    copies are made here, above autograd, so the gradient reaches the float32 tensor through the
    copy. A call that writes a tensor it is given is left to the interceptors' retry, which hands
    the written values back."""

    def __init__(self, draws: Draws) -> None:
        super().__init__()
        self.draws = draws
        self.handled: Counter[str] = Counter()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Off again; but an interrupt (Ctrl-C, SIGTERM, SIGHUP: the CLI raises them as
        ``KeyboardInterrupt``) that lands while torch has this mode popped to handle a call
        (``_pop_mode_temporarily``, in Python, before its ``try``) leaves it off already, and the
        pop would raise "empty mode stack" over the interrupt, which the CLI reports cleanly."""
        if exc_type is not None and self not in _get_current_function_mode_stack():
            return
        super().__exit__(exc_type, exc_value, traceback)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        handler = SERVED.get(func)
        if handler is None or beneath_dispatch():
            try:
                return func(*args, **(kwargs or {}))
            except Exception as exc:  # raised again below unless the call mixes
                kw = kwargs or {}
                if (
                    isinstance(exc, VGameError)
                    or _writes(func, kw)
                    or not widen.mixed(args, kw)
                    or beneath_dispatch()
                ):
                    raise
                wide_args, wide_kwargs = widen.widened(args, kw, widen.MIXED)
                try:
                    return func(*wide_args, **wide_kwargs)
                except Exception:  # torch's first words are the model's call's
                    raise exc from None
        self.handled[name_of(func)] += 1
        return handler(self.draws, func, args, kwargs or {})


__all__ = [
    "SERVED",
    "Draws",
    "Handler",
    "ServingMode",
    "beneath_dispatch",
    "name_of",
    "named_args",
    "serves",
    "suspended",
]
