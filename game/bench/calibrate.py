"""Calibrating the divergence bands (the seed paper's Algorithm 4, which its released code lacks).

For every rounded (inexact) op a preset runs, measure how far the float64 results of different
hardware profiles lie apart *on the same inputs*, which is exactly the situation of the rounding log
(every input of a rounded op is on the grid and identical for trainer and auditor). Two sources of
inputs, as the issue asks:

* real training activations: a few training steps run on the reference profile; inside each inexact
  op the arguments are cloned and the op is recomputed under every other profile;
* random inputs: the same op called again with every float64 argument replaced by random grid values
  of the same shape and scale (so shapes the real run does not stress, and cancellation, get tried).

Per op and per value, the difference ``d`` is recorded against the value's binade ``2**e(x)``,
bucketed by how far below the tensor's top binade ``e(S)`` the value lies. The band
(:class:`~game.training.numerics.bandfile.Band`) is then ``rel`` from the values within 8 binades of the top and
``abs`` from whatever the residual of the smaller values needs (outputs that cancel); both are
raised to powers of two, floored at a few float64 ulps (libraries differ by that much even where our
profiles agree) and multiplied by the safety margin (16 by default).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from game.errors import ConfigError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.opplan import classify, touched_tensors
from game.training.dispatch.optable import OpClass, op_name
from game.training.dispatch.profiles import Profile, get_profile
from game.training.engine.step import StepEngine
from game.training.numerics import rounding
from game.training.numerics.bandfile import MAX_EXP, MIN_EXP, Band, BandsOrigin, BandTable
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: Values within this many binades of their tensor's top set ``rel``; smaller ones may set ``abs``.
REL_SPAN = 8
#: Buckets of "binades below the top" (the last one also holds exact zeros).
_BUCKETS = 64
#: Floors of the measured exponents before the margin: 4 float64 ulps (libm and BLAS builds differ
#: by that much on ops our CPU profiles compute identically).
MIN_REL = -50
MIN_ABS = -50
DEFAULT_MARGIN = 16
MIN_MARGIN = 16

ProgressFn = Callable[[str], None]


@dataclass
class OpStats:
    """What was measured for one op: per-bucket maxima of ``d / 2**e(x)`` and counts."""

    name: str
    calls: int = 0
    values: int = 0
    differing: int = 0  # values whose float64 results differed between some pair
    flips: int = 0  # values that would round to another grid point at bits 32 without a log
    bucket_max: list[float] = field(default_factory=lambda: [0.0] * _BUCKETS)
    zero_max: float = 0.0  # d / 2**e(S) where the reference result is exactly zero

    def add(self, ref: Tensor, alt: Tensor) -> None:
        """Fold in one pair of results of the same op on the same inputs."""
        ref = ref.detach().reshape(-1).to("cpu", torch.float64)
        alt = alt.detach().reshape(-1).to("cpu", torch.float64)
        ok = torch.isfinite(ref) & torch.isfinite(alt)
        if not bool(ok.all()):
            ref, alt = ref[ok], alt[ok]
        if ref.numel() == 0:
            return
        self.values += ref.numel()
        d = (ref - alt).abs()
        self.differing += int((d > 0).sum())
        self.flips += int((rounding.rnd(ref, 32) != rounding.rnd(alt, 32)).sum())
        if not bool((d > 0).any()):
            return
        top = float(ref.abs().max())
        if top == 0.0:
            self.zero_max = max(self.zero_max, float(d.max()))
            return
        e_top = math.frexp(top)[1] - 1
        nz = ref != 0
        if not bool(nz.all()):
            self.zero_max = max(self.zero_max, float(d[~nz].max()) * 2.0**-e_top)
            ref, d = ref[nz], d[nz]
        e_x = torch.frexp(ref)[1].to(torch.int64) - 1
        ratio = torch.ldexp(d, -e_x)  # d / 2**e(x), exact
        gap = (e_top - e_x).clamp(0, _BUCKETS - 1)
        best = torch.zeros(_BUCKETS, dtype=torch.float64).scatter_reduce(0, gap, ratio, "amax")
        self.bucket_max = [max(a, b) for a, b in zip(self.bucket_max, best.tolist(), strict=True)]

    def band(self, margin: int) -> Band:
        """The band with its margin (exponents rounded up to powers of two)."""
        rel_measured = max(self.bucket_max[: REL_SPAN + 1])
        rel = max(_ceil_log2(rel_measured), MIN_REL)
        residual = self.zero_max
        for k in range(REL_SPAN + 1, _BUCKETS):
            residual = max(residual, max(0.0, self.bucket_max[k] - 2.0**rel) * 2.0**-k)
        abs_ = max(_ceil_log2(residual), MIN_ABS)
        extra = _ceil_log2(float(margin))
        return Band(min(rel + extra, MAX_EXP), min(abs_ + extra, MAX_EXP))

    def to_dict(self, margin: int) -> dict[str, Any]:
        band = self.band(margin)
        return {
            "op": self.name,
            "calls": self.calls,
            "values": self.values,
            "differing": self.differing,
            "flips_at_32": self.flips,
            "max_rel_log2": _log2_or_none(max(self.bucket_max[: REL_SPAN + 1])),
            "max_rel_all_log2": _log2_or_none(max(self.bucket_max)),
            "band": band.to_list(),
        }


def _ceil_log2(v: float) -> int:
    if v <= 0.0 or not math.isfinite(v):
        return MIN_EXP
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
    return e - 1 if m == 0.5 else e


def _log2_or_none(v: float) -> float | None:
    return math.log2(v) if v > 0 else None


# --------------------------------------------------------------------------------------------------
# The measuring mode
# --------------------------------------------------------------------------------------------------


def _clone(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach().clone()
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    return x


def _randomised(x: Any, bits: int, gen: torch.Generator) -> Any:
    """Float64 tensors replaced by random grid values of the same shape and RMS scale."""
    if isinstance(x, Tensor) and x.dtype == torch.float64 and x.numel():
        scale = float(x.detach().abs().mean()) or 1.0
        r = torch.randn(x.shape, dtype=torch.float64, generator=gen).to(x.device) * scale
        return rounding.rnd(r, bits)
    if isinstance(x, list):
        return [_randomised(v, bits, gen) for v in x]
    if isinstance(x, tuple):
        return tuple(_randomised(v, bits, gen) for v in x)
    return _clone(x)


def _float64_pairs(a: list[Tensor], b: list[Tensor]) -> Iterator[tuple[Tensor, Tensor]]:
    for x, y in zip(a, b, strict=False):
        if x.dtype == torch.float64 and y.dtype == torch.float64 and x.shape == y.shape:
            yield x, y


class CalibrationMode(RoundingMode):
    """Runs a step like ``round`` mode on the reference profile, measuring every inexact op against the others.

    The other keyword arguments are :class:`RoundingMode`'s (the step engine passes them).
    """

    def __init__(
        self,
        *,
        others: Sequence[Profile],
        stats: dict[str, OpStats],
        random_inputs: bool,
        gen: torch.Generator,
        **rounding: Any,
    ) -> None:
        super().__init__(**rounding)
        self.others = list(others)
        self.stats = stats
        self.random_inputs = random_inputs
        self.gen = gen
        self._noise_of = {p.name: p.noise_generator() for p in self.others}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if classify(func, args, kwargs) is not OpClass.INEXACT:
            return super().__torch_dispatch__(func, types, args, kwargs)
        name = op_name(func)
        st = self.stats.setdefault(name, OpStats(name))
        st.calls += 1
        saved = (_clone(args), _clone(kwargs))
        self._measure(func, *saved, st)
        if self.random_inputs:
            rand_args = _randomised(saved[0], self.bits, self.gen)
            rand_kwargs = _randomised(saved[1], self.bits, self.gen)
            try:
                self._measure(func, rand_args, rand_kwargs, st)
            except (RuntimeError, ValueError, IndexError) as exc:  # an op that refuses random inputs
                log.debug("calibration: %s refused random inputs: %s", name, exc)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _measure(self, func: Any, args: Any, kwargs: dict[str, Any], st: OpStats) -> None:
        a_ref, k_ref = _clone(args), _clone(kwargs)
        out_ref = self.profile.compute(func, a_ref, k_ref)
        ref = touched_tensors(func, a_ref, k_ref, out_ref)
        for p in self.others:
            a_alt, k_alt = _clone(args), _clone(kwargs)
            with p.apply():
                out_alt = p.compute(func, a_alt, k_alt)
            alt = touched_tensors(func, a_alt, k_alt, out_alt)
            noise = self._noise_of[p.name]
            for x, y in _float64_pairs(ref, alt):
                if noise is not None:
                    noise.perturb(y)
                st.add(x, y)


# --------------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The result: the band table and what it was derived from."""

    preset: str
    profiles: tuple[str, ...]
    steps: int
    margin: int
    random_inputs: bool
    table: BandTable
    ops: tuple[dict[str, Any], ...]
    model: dict[str, Any]  # the model sizes the bands were measured at (bands depend on them)
    batch_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "model": dict(self.model),
            "batch_size": self.batch_size,
            "profiles": list(self.profiles),
            "steps": self.steps,
            "margin": self.margin,
            "random_inputs": self.random_inputs,
            "bands": self.table.to_dict(),
            "ops": list(self.ops),
        }

    def to_toml(self, task_source: str | None = None) -> str:
        """The bands file; ``task_source``: how the command was given the task (``--config
        task.toml``), where not ``--preset NAME``, so that its header is the command that ran."""
        sizes = ",".join(f"{k}={v}" for k, v in self.model.items())
        comment = (
            f"Divergence bands calibrated by `vgame calibrate {task_source or '--preset ' + self.preset} --profiles "
            f"{','.join(self.profiles)} --steps {self.steps} --margin {self.margin}`,\n"
            f"for task {self.preset} at model sizes {sizes} and batch size {self.batch_size}.\n"
            "Per op: [rel, abs] exponents: |x_a - x_b| <= 2**rel * 2**e(x) + 2**abs * 2**e(max |tensor|),\n"
            f"margin {self.margin}x included. Part of the task config (and so of its spec hash)."
        )
        origin = BandsOrigin(preset=self.preset, model=self.model, batch_size=self.batch_size)
        return self.table.to_toml(comment=comment, origin=origin)


def calibrate(
    cfg: TaskConfig,
    profiles: Sequence[str],
    *,
    steps: int = 10,
    margin: int = DEFAULT_MARGIN,
    random_inputs: bool = True,
    seed: int = 0,
    progress: ProgressFn | None = None,
) -> Calibration:
    """Measure every inexact op of ``cfg``'s preset under ``profiles`` (the first is the reference)."""
    if len(profiles) < 2:
        raise ConfigError("calibration needs at least two profiles to compare")
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < MIN_MARGIN:
        raise ConfigError(
            f"margin: {margin!r} must be an integer >= {MIN_MARGIN} (the sparse log's rules assume bands of "
            f"at least {MIN_MARGIN}x the real divergence)"
        )
    resolved = [get_profile(p) for p in profiles]
    for p in resolved:
        p.require()
    if not 1 <= steps <= cfg.steps:
        raise ConfigError(f"steps: {steps} is outside 1..{cfg.steps} (the task's steps)")
    reference, others = resolved[0], resolved[1:]
    stats: dict[str, OpStats] = {}
    gen = torch.Generator().manual_seed(seed)

    class Measuring(CalibrationMode):
        def __init__(self, **rounding: Any) -> None:
            super().__init__(others=others, stats=stats, random_inputs=random_inputs, gen=gen, **rounding)

    class MeasuringEngine(StepEngine):
        mode_class: type[RoundingMode] = Measuring

    engine = MeasuringEngine(cfg, reference)
    state = engine.init_state()
    for step in range(1, steps + 1):
        engine.run_step(state, step, mode="round")  # the reference's own step, every inexact op measured
        if progress is not None:
            progress(f"step {step}/{steps}: {len(stats)} ops measured")
    bands = {name: st.band(margin) for name, st in stats.items()}
    default = Band(MIN_EXP, MIN_EXP)
    for b in bands.values():
        default = default.widest(b)
    table = BandTable(default=default, ops=bands)
    table.validate()
    return Calibration(
        preset=cfg.preset,
        profiles=tuple(p.name for p in resolved),
        steps=steps,
        margin=margin,
        random_inputs=random_inputs,
        table=table,
        ops=tuple(stats[n].to_dict(margin) for n in sorted(stats)),
        model=cfg.to_dict()["model"],
        batch_size=cfg.batch_size,
    )


__all__ = ["DEFAULT_MARGIN", "Calibration", "CalibrationMode", "OpStats", "calibrate"]
