"""Dishonest trainers: how a trainer departs from its task (the deviations of the demo's scenarios).

Each changes exactly one step ``S``, or every step from ``S`` on, so an honest auditor's first
divergent leaf, and therefore the step the game pins, is ``S``:

* :class:`Poison`: the trainer swaps the batch of step ``S`` for the preset's poisoned batch
  (flipped labels for the digits, injected text for Shakespeare);
* :class:`SkipStep`: step ``S`` is not computed (the state only advances its step counter);
* :class:`WrongLR`: from step ``S`` on the optimizer runs with ``lr * factor``;
* :class:`TamperedLog`: the published log chunk of step ``S`` says the other direction for its
  logged values (packed: down/up trits swapped; sparse: every in-band value listed where it was
  not and unlisted where it was, all inside the band), so replaying it
  (auditor, judge) does not reproduce the trainer's leaf ``S``;
* :class:`SteeredLog`: in step ``S`` the trainer rounds a few values of every rounded tensor to the
  other grid neighbour although they lie far outside their op's band, and logs those directions:
  a log that "explains" a nudged state. The band check catches it (the judge never rules for it).

A trainer is handed one as its ``deviation`` (:class:`game.training.session.Deviation`, the hook
on the product side); :data:`DEVIATIONS` names them for the scenarios.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from game.errors import ConfigError
from game.registry import Registry
from game.training.engine.train import Deviation

if TYPE_CHECKING:
    from torch import Tensor

    from game.training.dispatch.mode import RoundingMode
    from game.training.engine.step import StepEngine, StepResult
    from game.training.log.formats import ChunkLog
    from game.training.numerics.bandfile import Band
    from game.training.state.tensors import TrainState
    from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: Trit values of the rounding log (docs/architecture.md): round down, no entry, round up.
TRIT_DOWN, TRIT_IGNORE, TRIT_UP = 0, 1, 2


# ----------------------------------------------------------------------------------------------
# Deviations
# ----------------------------------------------------------------------------------------------


class Poison(Deviation):
    """Train step ``step`` on the task's poisoned batch (same shapes and example ids)."""

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        _check_step(cfg, step, "poison")
        self.cfg = cfg
        self.step = step

    def batch(self, step: int) -> Any | None:
        if step != self.step:
            return None
        from game.training.engine.runtime import runtime_for

        runtime = runtime_for(self.cfg)
        return runtime.poison(runtime.batch(step), step)


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
    from game.training.engine.step import StepEngine

    class WrongLREngine(StepEngine):
        def run_step(self, state: TrainState, step: int, **kwargs: Any) -> StepResult:
            for group in state.optimizer.param_groups:
                group["lr"] = lr
            return super().run_step(state, step, **kwargs)

    return WrongLREngine(honest.cfg, honest.profile, check_grid=honest.check_grid)


class TamperedLog(Deviation):
    """Publish the log of step ``step`` with the other direction for every value it could speak for.

    The trainer computes the step honestly (its leaf ``step`` is the honest one); only the log lies,
    so whoever replays it lands elsewhere. Packed log: every down trit made up and every up trit
    down. Sparse log: every value within its band of a midpoint listed where it was not and unlisted
    where it was, so each goes to the other neighbour; all these entries lie inside the band (the
    band check passes): it is the state, not the log, that gives this trainer away.
    """

    def __init__(self, cfg: TaskConfig, step: int) -> None:
        _check_step(cfg, step, "tampered-log")
        self.step = step
        self.flipped = 0  # directions swapped (set when the chunk of ``step`` is written)
        self._engines: dict[int, StepEngine] = {}

    def engine(self, step: int, honest: StepEngine) -> StepEngine:
        if step != self.step or honest.cfg.log_format != "sparse":
            return honest
        eng = self._engines.get(id(honest))
        if eng is None:
            eng = self._engines[id(honest)] = _mode_engine(honest, _flip_zone, self)
        return eng

    def tamper_log(self, step: int, step_log: ChunkLog) -> ChunkLog:
        from game.training.log.packed import StepLog

        if step != self.step or not isinstance(step_log, StepLog):
            if step == self.step and self.flipped == 0:
                log.warning("tampered-log: step %d has no value near a boundary; nothing to swap", step)
            return step_log
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


class SteeredLog(Deviation):
    """In step ``step``, round up to ``per_tensor`` values of every rounded tensor the other way although
    they lie far outside their op's band (farther from a midpoint than any auditor accepts: some 33
    bands, ``numerics.reach``), and log those directions.

    The trainer's leaf ``step`` is the steered state and its log replays it exactly, so only the band
    check tells it from an honest log: the auditor rejects the chunk (tampering, naming step, op and
    value) and the judge rules against the trainer.
    """

    def __init__(self, cfg: TaskConfig, step: int, per_tensor: int = 2) -> None:
        _check_step(cfg, step, "steer")
        if per_tensor < 1:
            raise ConfigError(f"steer: per_tensor must be >= 1, got {per_tensor}")
        self.step = step
        self.per_tensor = per_tensor
        self.steered = 0  # values rounded against the rules (set when step ``step`` runs)
        self._engines: dict[int, StepEngine] = {}

    def steer(self, step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band) -> None:
        """Round some values of ``r`` (the rounding of ``x``) the other way and log it."""
        _steer_values(step_log, x, r, bits, band, self)

    def engine(self, step: int, honest: StepEngine) -> StepEngine:
        if step != self.step:
            return honest
        eng = self._engines.get(id(honest))
        if eng is None:
            eng = self._engines[id(honest)] = _mode_engine(honest, _steer_by, self)
        return eng


def _mode_engine(honest: StepEngine, rewrite: _Rewrite, dev: TamperedLog | SteeredLog) -> StepEngine:
    """A StepEngine of the same task whose recording interceptor lets ``rewrite`` change each op's
    rounding and log record right after the honest kernel ran."""
    from game.training.dispatch.mode import RoundingMode
    from game.training.engine.step import StepEngine

    class RewritingMode(RoundingMode):
        round_in_place = False  # the rewrite reads the unrounded values

        def _record(
            self, t: Tensor, index: int, name: str, band: Band, top: float | None, where: str
        ) -> Tensor:
            r = super()._record(t, index, name, band, top, where)
            rewrite(self.log, t, r, self.bits, band, dev)
            return r

    class RewritingEngine(StepEngine):
        mode_class: type[RoundingMode] = RewritingMode

    return RewritingEngine(honest.cfg, honest.profile, check_grid=honest.check_grid)


_Rewrite = Callable[["ChunkLog | None", "Tensor", "Tensor", int, "Band", Any], None]


def _flip_zone(step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band, dev: Any) -> None:
    """Sparse log: swap listed and unlisted among the values within one band of a midpoint."""
    from game.training.log.sparse import SparseStepLog
    from game.training.numerics import bandcheck, rounding

    assert isinstance(step_log, SparseStepLog)
    xf = rounding._int_view(x.detach()).reshape(-1)
    zone, _ = bandcheck.within(xf, bits, band, 0, bandcheck.top_binade(xf))
    last = step_log.pop()
    listed = last.positions.to(zone.device)
    keep = listed[~torch.isin(listed, zone)]  # listed outside the zone: the auditor rounds those right anyway
    flipped_in = zone[~torch.isin(zone, listed)]
    step_log.append(
        last.record.op_index,
        last.record.op_name,
        last.record.count,
        torch.cat([keep, flipped_in]).sort().values,
    )
    dev.flipped += int(zone.numel())


def _steer_by(step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band, dev: Any) -> None:
    dev.steer(step_log, x, r, bits, band)


def _steer_values(step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band, dev: Any) -> None:
    dev.steered += _steer(step_log, x, r, bits, band, dev.per_tensor)


def _steer(step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band, k: int) -> int:
    """Move up to ``k`` out-of-band values of ``r`` (the rounding of ``x``) to their other neighbour
    and rewrite the op's last log record to match; returns how many moved."""
    from game.training.log.packed import StepLog
    from game.training.log.sparse import SparseStepLog
    from game.training.numerics import bandcheck, logtrits, rounding
    from game.training.numerics.reach import reach

    xf = rounding._int_view(x.detach()).reshape(-1)
    geo = bandcheck.geometry(xf, bits, band)
    # past what any auditor accepts (numerics.reach), so that every auditor disputes the step
    far = geo.off & (geo.distance > reach(geo.band, 4, "audit"))
    flat = r.view(-1)
    if isinstance(step_log, SparseStepLog):
        cand = far.nonzero().squeeze(1)
        even, odd = bandcheck._neighbours(xf, cand, bits)
        at_even = flat.index_select(0, cand).view(torch.int64) == even.view(torch.int64)
        pick = cand[at_even][:k]
        if pick.numel() == 0:
            return 0
        flat.index_copy_(0, pick, odd[at_even][:k])
        last = step_log.pop()
        positions = torch.cat([last.positions, pick.to(last.positions.device)]).unique()
        step_log.append(last.record.op_index, last.record.op_name, last.record.count, positions)
        return int(pick.numel())
    assert isinstance(step_log, StepLog)
    record, trits = step_log.pop()
    t = trits.clone()
    pick = (far & (t != TRIT_IGNORE).to(far.device)).nonzero().squeeze(1)[:k]
    if pick.numel():
        t[pick] = TRIT_UP - t[pick]  # 0 <-> 2: the other side
        moved, _ = logtrits.round_with_log(xf.view(torch.float64).index_select(0, pick), bits, t[pick])
        flat.index_copy_(0, pick, moved)
    step_log.append(record.op_index, record.op_name, t)
    return int(pick.numel())


def _check_step(cfg: TaskConfig, step: int, what: str) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= cfg.steps:
        raise ConfigError(
            f"{what}: the deviating step must be in 1..{cfg.steps} (the task's steps), got {step}"
        )


#: A deviation made for a task, at its deviating step ``S``.
DeviationFactory: TypeAlias = Callable[["TaskConfig", int], Deviation]

#: Every deviation by the name a scenario gives it (its class name).
DEVIATIONS: Registry[DeviationFactory] = Registry(
    "deviation", [(cls.__name__, cls) for cls in (Poison, SkipStep, WrongLR, TamperedLog, SteeredLog)]
)


__all__ = [
    "DEVIATIONS",
    "TRIT_DOWN",
    "TRIT_IGNORE",
    "TRIT_UP",
    "DeviationFactory",
    "Poison",
    "SkipStep",
    "SteeredLog",
    "TamperedLog",
    "WrongLR",
]
