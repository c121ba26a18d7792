"""Values a model's construction computes inexactly, allowed while nothing of them is kept.

Why: a model that runs a throwaway input through its layers to learn a size (``n =
self.features(torch.zeros(1, 3, 32, 32)).numel()``, the usual way to size the first linear layer
after convolutions, or to materialise a lazy module) was refused at the first convolution, though
the values never reach its state; only the model's state must be the same on every machine.

The rule (:class:`Provisional`, kept by :class:`~game.training.dispatch.initmode.InitMode`): an
inexact op that construction does not serve runs as this machine computes it, and its results are
*provisional*; so is every result of an op that reads a provisional tensor, and every tensor an op
writes with one. A tensor is known by its storage, so a view, an alias made by ``.data`` and a write
into a slice are the same tensor (a write into part of a storage makes all of it provisional). When
construction ends, a parameter, buffer or tensor attribute of the model whose storage is
provisional (and not overwritten whole since, from values that are not: ``zero_``, ``fill_``,
``copy_``) refuses the model, naming the op and the tensor (BatchNorm's running statistics after
a throwaway pass in training mode: run it in eval mode); a provisional value that leaves torch
(``item()``, ``tolist()``, a comparison in Python) refuses it at once, since it could shape the
model, and so does one still alive elsewhere once the factory has returned (a closure, a cache).
The storages are held until construction ends, so no address is reused under the rule.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from game.errors import UnsupportedOpError
from game.training.dispatch.initrules import COMPLEX_INIT_FIX, INIT_FIX, WHERE

#: Tensor methods that hand a tensor's values to Python without an ATen op (``item()`` and the
#: conversions run ``aten._local_scalar_dense``, checked where ops are).
LEAKS = frozenset({Tensor.tolist, Tensor.numpy})

#: The ATen op that turns one value into a Python number (``item()``, ``bool()``, ``int()``, ``float()``).
SCALAR = "aten._local_scalar_dense.default"

#: In-place ops whose result does not depend on what their first argument held: they overwrite it.
OVERWRITES = frozenset({"aten.fill_.Scalar", "aten.fill_.Tensor", "aten.zero_.default", "aten.copy_.default"})


#: Library functions known to compute inexactly at construction, by the name of their Python
#: function, with the switch that builds the model without that: said first where one of them is on
#: the stack when the refusal comes.
KNOWN: dict[str, str] = {
    "_init_added_embeddings_weights_with_mean": (
        "transformers' resize_token_embeddings draws the added rows around the old rows' mean and "
        "covariance, which another machine computes otherwise: call it with mean_resizing=False "
        "(the added rows then take the model's own initialiser, served the same everywhere)"
    ),
}

#: PEFT's adapter initialisations that decompose the base model's weights (SVD, QR), fit them
#: (LoftQ, LoRA-GA) or fit data (EVA): the ``init_lora_weights`` value (as it begins) that asks for
#: one, and the PEFT function that computes it while the factory wraps the model (EVA's runs later,
#: called by the factory itself). In the factory they would work from weights that ``init_weights``
#: then replaces, so the functions are refused at once (their own dtype check refuses float64
#: first), and :func:`~game.training.task.adapters.initialised_from_base` refuses the values where
#: weights are given.
PEFT_FROM_BASE: dict[str, str | None] = {
    "pissa": "pissa_init",
    "corda": "corda_init",
    "olora": "olora_init",
    "mica": "mica_init",
    "loftq": "loftq_init",
    "lora_ga": "lora_ga_init",
    "eva": None,
}
PEFT_FROM_BASE_FIX = (
    "PEFT computes such adapters from the base model's weights (PiSSA, OLoRA, CorDA and LoftQ "
    "decompose them, DoRA takes their norms), which vgame puts in only after the model factory "
    "has run, and a decomposition is the machine's own: wrap the base model once outside vgame "
    "(load its weights, then get_peft_model), save the wrapped model's state_dict, and give that "
    "as init_weights to a factory that wraps it alike but with init_lora_weights=True (the names "
    "are the wrapped model's own, so base layers and adapters are filled as saved)"
)
KNOWN.update((f, PEFT_FROM_BASE_FIX) for f in PEFT_FROM_BASE.values() if f is not None)


def known_fix() -> str:
    """The switch for the first :data:`KNOWN` function on the caller's stack, with a separator; or ''."""
    frame = sys._getframe(1)
    while frame is not None:
        found = KNOWN.get(frame.f_code.co_name)
        if found is not None:
            return found + "; otherwise, "
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def known_cause(tb: TracebackType | None) -> str | None:
    """The fix for the innermost :data:`KNOWN` function an exception passed through (its
    traceback ``tb``), or None: a model factory's own error then says why and what to do."""
    found = None
    while tb is not None:
        found = KNOWN.get(tb.tb_frame.f_code.co_name, found)
        tb = tb.tb_next
    return found


def _storage(t: Tensor) -> Any | None:
    """``t``'s storage, or None where it has none that holds values (meta, sparse)."""
    if t.is_meta or t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


class Provisional:
    """Construction's provisional storages, each with the op whose inexact result it holds."""

    def __init__(self) -> None:
        self._origin: dict[int, tuple[str, Any]] = {}  # storage address -> (op, the storage, held)
        self._tensors: WeakIdKeyDictionary = WeakIdKeyDictionary()  # provisional tensors -> op, while alive

    def __bool__(self) -> bool:
        return bool(self._origin)

    def origin(self, tensors: Iterable[Tensor]) -> str | None:
        """The op behind the first provisional tensor of ``tensors``, or None."""
        if not self._origin:
            return None
        for t in tensors:
            st = _storage(t)
            if st is not None and (found := self._origin.get(st._cdata)) is not None:
                return found[0]
        return None

    def mark(self, tensors: Iterable[Tensor], origin: str) -> None:
        """Make the storages of ``tensors`` provisional, from ``origin``."""
        for t in tensors:
            st = _storage(t)
            if st is not None:
                self._origin.setdefault(st._cdata, (origin, st))
                self._tensors[t] = origin

    def release(self, t: Tensor) -> None:
        """``t`` was overwritten whole from values that are not provisional (``zero_``, ``fill_``,
        ``copy_``): where it spans its storage, that storage is not provisional any more (BatchNorm's
        statistics reset after a throwaway pass in training mode)."""
        st = _storage(t)
        if st is None or not self._origin:
            return
        whole = t.is_contiguous() and t.storage_offset() == 0 and t.numel() * t.element_size() == st.nbytes()
        if whole and self._origin.pop(st._cdata, None) is not None:
            self._tensors.pop(t, None)

    def refuse_leak(self, origin: str, how: str) -> UnsupportedOpError:
        fix = known_fix() + INIT_FIX
        return UnsupportedOpError(
            f"{WHERE}a value computed by {origin}, which is not exact (its float64 result may differ on "
            f"another machine), leaves torch by {how}: it could make the model otherwise there. A "
            f"throwaway forward pass may compute anything, as long as only shapes leave it: {fix}",
            op=origin,
            fix=fix,
        )

    def check_model(self, model: nn.Module) -> None:
        """Refuse ``model`` where a tensor of its state (or held as a module's attribute) is provisional."""
        if not self._origin:
            return
        for name, t in _held(model):
            origin = self.origin([t])
            if origin is not None:
                fix = COMPLEX_INIT_FIX if t.is_complex() else INIT_FIX
                raise UnsupportedOpError(
                    f"{WHERE}{origin} is not exact (its float64 result may differ on another machine) and "
                    f"its result reached {name}, so the model's initial state would differ there (a "
                    "throwaway forward pass at construction is fine, but nothing of it may be kept: "
                    f"BatchNorm's running statistics are, in training mode; run it in eval mode): {fix}",
                    op=origin,
                    fix=fix,
                )
        gc.collect()  # what the factory dropped in a reference cycle goes now
        for _, origin in self._tensors.items():  # still alive once the factory has returned: kept
            raise UnsupportedOpError(
                f"{WHERE}{origin} is not exact (its float64 result may differ on another machine) and its "
                "result is kept outside the model's parameters, buffers and tensor attributes (in a "
                "closure, a cache or an object the model holds), where it could still reach training: "
                f"{INIT_FIX}",
                op=origin,
                fix=INIT_FIX,
            )

    def clear(self) -> None:
        self._origin.clear()
        self._tensors = WeakIdKeyDictionary()


def _held(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Every tensor a module and its submodules hold: parameters, buffers, and tensors kept as
    attributes (alone, or in a list, tuple or dict), by name."""
    for prefix, module in model.named_modules():
        dotted = f"{prefix}." if prefix else ""
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers"):
                for key, t in value.items():
                    if isinstance(t, Tensor):
                        yield dotted + key, t
            elif isinstance(value, Tensor):
                yield dotted + attr, value
            elif isinstance(value, (list, tuple)):
                yield from ((f"{dotted}{attr}[{i}]", t) for i, t in enumerate(value) if isinstance(t, Tensor))
            elif isinstance(value, dict) and not attr.startswith("_"):
                yield from ((f"{dotted}{attr}[{k!r}]", t) for k, t in value.items() if isinstance(t, Tensor))


class LeakGuard(TorchFunctionMode):
    """Refuses :data:`LEAKS` of a provisional tensor (the function-level half of the rule)."""

    def __init__(self, provisional: Provisional) -> None:
        super().__init__()
        self.provisional = provisional

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func in LEAKS and self.provisional and args and isinstance(args[0], Tensor):
            origin = self.provisional.origin([args[0]])
            if origin is not None:
                raise self.provisional.refuse_leak(origin, f"Tensor.{func.__name__}()")
        return func(*args, **(kwargs or {}))


__all__ = [
    "KNOWN",
    "LEAKS",
    "OVERWRITES",
    "PEFT_FROM_BASE",
    "PEFT_FROM_BASE_FIX",
    "SCALAR",
    "LeakGuard",
    "Provisional",
    "known_cause",
    "known_fix",
]
