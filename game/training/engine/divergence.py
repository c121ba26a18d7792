"""How far two profiles drift apart with and without the rounding log (the paper's Figure 5).

:func:`divergence` trains the same task on two profiles three ways (plain float32, float64 rounded
to the grid without the log, and with the trainer's log replayed by the auditor) and records the
L2 distance between the two parties' weights after every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from game.training.engine.step import engine_for
from game.training.engine.train import ProgressFn
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig

#: Names of the three series of :func:`divergence`, in plot order.
SERIES_FP32 = "fp32"
SERIES_ROUND = "fp64+rounding, no log"
SERIES_LOG = "fp64+rounding, with log"


@dataclass(frozen=True)
class DivergenceResult:
    """Per-step L2 distance between the two parties' weights; index i is after step i (0 = init)."""

    preset: str
    steps: int
    trainer_profile: str
    auditor_profile: str
    series: dict[str, list[float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "steps": self.steps,
            "trainer_profile": self.trainer_profile,
            "auditor_profile": self.auditor_profile,
            "series": {name: list(values) for name, values in self.series.items()},
        }


def _weights_distance(a: TrainState, b: TrainState) -> float:
    """L2 distance over all parameters (float64 accumulation of float64 differences); the two states
    may live on different devices (a CPU trainer, a CUDA auditor)."""
    total = 0.0
    pa, pb = a.parameters(), b.parameters()
    for name, ta in pa.items():
        tb = pb[name].detach().to(device=ta.device, dtype=torch.float64)
        d = (ta.detach().double() - tb).reshape(-1)
        total += float((d * d).sum())
    return math.sqrt(total)


def divergence(
    cfg: TaskConfig,
    steps: int,
    trainer_profile: str,
    auditor_profile: str,
    *,
    progress: ProgressFn | None = None,
) -> DivergenceResult:
    """Train the same task on two profiles three ways and record the weight distance every step."""
    cfg = cfg.replace(steps=steps)
    trainer, auditor = engine_for(cfg, trainer_profile), engine_for(cfg, auditor_profile)
    series: dict[str, list[float]] = {}
    plans: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (SERIES_FP32, {"mode": "plain", "precision": "fp32"}, {"mode": "plain", "precision": "fp32"}),
        (SERIES_ROUND, {"mode": "round"}, {"mode": "round"}),
        (SERIES_LOG, {"mode": "record"}, {"mode": "replay"}),
    ]
    total = 3 * steps
    done = 0
    for name, t_kw, a_kw in plans:
        precision = t_kw.get("precision", "fp64")
        st, sa = trainer.init_state(precision=precision), auditor.init_state(precision=precision)
        values = [_weights_distance(st, sa)]
        for step in range(1, steps + 1):
            rt = trainer.run_step(st, step, **t_kw)
            if a_kw["mode"] == "replay":
                auditor.run_step(sa, step, mode="replay", log=rt.log)
            else:
                auditor.run_step(sa, step, **a_kw)
            values.append(_weights_distance(st, sa))
            done += 1
            if progress is not None:
                progress(done, total)
        series[name] = values
    return DivergenceResult(
        preset=cfg.preset,
        steps=steps,
        trainer_profile=trainer_profile,
        auditor_profile=auditor_profile,
        series=series,
    )


__all__ = ["SERIES_FP32", "SERIES_LOG", "SERIES_ROUND", "DivergenceResult", "divergence"]
