"""How a dishonest trainer departs from its task: the deviations of the demo's scenarios.

Each changes exactly one step ``S``, or every step from ``S`` on, so an honest auditor's first
divergent leaf, and therefore the step the game pins, is ``S``:

* :class:`Poison`: the trainer swaps the batch of step ``S`` for the preset's poisoned batch
  (flipped labels for the digits, injected text for Shakespeare);
* :class:`SkipStep`: step ``S`` is not computed (the state only advances its step counter);
* :class:`WrongLR`: from step ``S`` on the optimizer runs with ``lr * factor``;
* :class:`TamperedLog`: the published log chunk of step ``S`` has its down/up trits swapped, so
  replaying it (auditor, judge) does not reproduce the trainer's leaf ``S``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from game.errors import ConfigError
from game.training.session import Deviation

if TYPE_CHECKING:
    from game.training.config import TaskConfig
    from game.training.roundlog import StepLog
    from game.training.state import TrainState
    from game.training.step import StepEngine, StepResult

log = logging.getLogger(__name__)

#: Trit values of the rounding log (docs/architecture.md): round down, no entry, round up.
TRIT_DOWN, TRIT_IGNORE, TRIT_UP = 0, 1, 2


# ----------------------------------------------------------------------------------------------
# Deviations
# ----------------------------------------------------------------------------------------------


class Poison(Deviation):
    """Train step ``step`` on the preset's poisoned batch (same shapes and example ids)."""

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        _check_step(cfg, step, "poison")
        self.cfg = cfg
        self.step = step

    def batch(self, step: int) -> Any | None:
        if step != self.step:
            return None
        from game.training.presets import get_preset

        preset = get_preset(self.cfg.preset)
        return preset.poison(self.cfg, preset.batch(self.cfg, step), step)


class SkipStep(Deviation):
    """Do not compute step ``step``: the weights stay as they were and its log chunk is empty."""

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        _check_step(cfg, step, "skip-step")
        self.step = step

    def skip(self, step: int) -> bool:
        return step == self.step


class WrongLR(Deviation):
    """From step ``step`` on, run the optimizer with ``lr * factor`` (a cheaper, wrong schedule).

    The optimizer lives in the training state (built from the config's lr), so the engine used from
    ``step`` on sets the learning rate of every parameter group before running the step.
    """

    def __init__(self, cfg: TaskConfig, step: int, factor: float = 10.0) -> None:
        _check_step(cfg, step, "wrong-lr")
        if factor <= 0 or factor == 1.0:
            raise ConfigError(f"wrong-lr: factor must be positive and not 1, got {factor}")
        self.step = step
        self.lr = cfg.lr * factor
        self._engines: dict[int, StepEngine] = {}

    def engine(self, step: int, honest: StepEngine) -> StepEngine:
        if step < self.step:
            return honest
        wrong = self._engines.get(id(honest))
        if wrong is None:
            wrong = self._engines[id(honest)] = _wrong_lr_engine(honest, self.lr)
        return wrong


def _wrong_lr_engine(honest: StepEngine, lr: float) -> StepEngine:
    """A StepEngine of the same task and profile whose steps run with learning rate ``lr``."""
    from game.training.step import StepEngine

    class WrongLREngine(StepEngine):
        def run_step(self, state: TrainState, step: int, **kwargs: Any) -> StepResult:
            for group in state.optimizer.param_groups:
                group["lr"] = lr
            return super().run_step(state, step, **kwargs)

    return WrongLREngine(honest.cfg, honest.profile, check_grid=honest.check_grid)


class TamperedLog(Deviation):
    """Publish the log chunk of step ``step`` with every down trit made up and every up trit down.

    The trainer computed the step honestly (its leaf ``step`` is the honest one); whoever replays
    the published chunk rounds the logged near-boundary values the other way and lands elsewhere.
    Swapping all of them (not one) makes sure at least one swapped value reaches the state.
    """

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        _check_step(cfg, step, "tampered-log")
        self.step = step
        self.flipped = 0  # trits swapped (set when the chunk of ``step`` is written)

    def tamper_log(self, step: int, step_log: StepLog) -> StepLog:
        if step != self.step:
            return step_log
        from game.training.roundlog import StepLog

        out = StepLog(step_log.step)
        flipped = 0
        for record, trits in step_log.entries():
            t = trits.detach().to("cpu", torch.uint8).reshape(-1)
            swapped = t.clone()
            swapped[t == TRIT_DOWN] = TRIT_UP
            swapped[t == TRIT_UP] = TRIT_DOWN
            flipped += int((t != TRIT_IGNORE).sum())
            out.append(record.op_index, record.op_name, swapped)
        self.flipped = flipped
        if flipped == 0:
            log.warning("tampered-log: step %d logged no near-boundary value; nothing to swap", step)
        return out


def _check_step(cfg: TaskConfig, step: int, what: str) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= cfg.steps:
        raise ConfigError(
            f"{what}: the deviating step must be in 1..{cfg.steps} (the task's steps), got {step}"
        )


__all__ = ["TRIT_DOWN", "TRIT_IGNORE", "TRIT_UP", "Poison", "SkipStep", "TamperedLog", "WrongLR"]
