"""Activation checkpointing in a step: the forward it recomputes in the backward pass draws what the
forward drew, from the counter RNG.

Why: ``torch.utils.checkpoint`` (and Hugging Face's ``gradient_checkpointing_enable()``, which calls
it) runs a segment's forward again inside autograd's backward. ``Tensor.backward`` is a torch
function, so torch pops the step's :class:`~game.training.dispatch.draws.ServingMode` while it runs,
and the recomputed dropout reached ATen's ``bernoulli_`` and was refused. Checkpointing itself
keeps the recomputed draws equal to the forward's by restoring torch's generator; the served draws
come from the counter RNG instead, keyed by their ordinal, so the ordinal is what must be restored.

Inside :class:`ServedCheckpoint` the recomputed segment runs with the mode pushed again and the
ordinal set back to where the segment's forward began, then put back where the backward pass had
it: every recomputed draw is the forward's, and the draws after it are unchanged. Its ops are
rounded and logged as any op of the backward pass, on every machine alike. A segment with no
draw gives the same states checkpointed or not (its recomputed forward is the forward, op for
op).

How: ``checkpoint`` looks up ``CheckpointFunction`` (``use_reentrant=True``, Hugging Face's
default) and ``_checkpoint_without_reentrant_generator`` (``use_reentrant=False``) in its module
when it is called, so they are swapped for the step, for wrappers that hand torch the segment's
function wrapped; a function captured before the step (``functools.partial(checkpoint, ...)``) is
served too. The swap is process-wide, as the global generators' seeding is (:mod:`.stockops`); the
wrapper pushes the mode only inside a backward pass (autograd's graph task), so another thread's
forward through a checkpoint at that moment is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.overrides import _get_current_function_mode_stack

from game.training.dispatch.draws import ServingMode


class _Segment:
    """A checkpointed segment's function, whose calls past the first are its recomputation."""

    def __init__(self, mode: ServingMode, function: Callable[..., Any], start: int) -> None:
        self.mode = mode
        self.function = function
        self.start = start  # the draws' ordinal where the segment's forward began

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(m is self.mode for m in _get_current_function_mode_stack()):
            return self.function(*args, **kwargs)  # the forward: the mode serves it already
        if torch._C._current_graph_task_id() == -1:  # not in a backward pass: no recomputation of
            return self.function(*args, **kwargs)  # this step's (another thread's own checkpoint)
        draws = self.mode.draws
        resume = draws.ordinal
        draws.ordinal = self.start
        try:
            with self.mode:
                return self.function(*args, **kwargs)
        finally:
            draws.ordinal = resume


#: What ``torch.utils.checkpoint.checkpoint`` looks up in its module when called: swapped for a step.
SWAPPED = ("CheckpointFunction", "_checkpoint_without_reentrant_generator")


class ServedCheckpoint:
    """Serve ``torch.utils.checkpoint`` for one micro-batch (module docstring). It stands in for
    ``CheckpointFunction`` itself (its ``apply``), made once with the micro-batch's mode: a class
    defined on every entry cost some 10 us a micro-batch."""

    def __init__(self, mode: ServingMode) -> None:
        self.mode = mode
        self._saved: dict[str, Any] = {}

    def apply(self, function: Callable[..., Any], preserve: bool, *args: Any) -> Any:
        """``CheckpointFunction.apply`` with the segment's function wrapped."""
        reentrant = self._saved[SWAPPED[0]]
        return reentrant.apply(_Segment(self.mode, function, self.mode.draws.ordinal), preserve, *args)

    def non_reentrant(self, function: Callable[..., Any], *rest: Any, **kwargs: Any) -> Iterator[None]:
        """``_checkpoint_without_reentrant_generator`` with the segment's function wrapped: called
        just before checkpoint() runs the forward itself, so the ordinal here is its start."""
        generator = self._saved[SWAPPED[1]]
        gen: Iterator[None] = generator(
            _Segment(self.mode, function, self.mode.draws.ordinal), *rest, **kwargs
        )
        return gen

    def __enter__(self) -> ServedCheckpoint:
        self._saved = {name: getattr(torch_checkpoint, name) for name in SWAPPED}
        for name, served in zip(SWAPPED, (self, self.non_reentrant), strict=True):
            setattr(torch_checkpoint, name, served)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(torch_checkpoint, name, original)
        self._saved = {}


__all__ = ["SWAPPED", "ServedCheckpoint"]
