"""Per-step cost of verifiable training against plain training (issue 5, item 1).

Four variants of the same task run side by side in one process, each on its own state, on one
fixed profile (``cpu-1t`` unless another is named, e.g. ``cuda``), so the ratios compare like with
like:

* ``fp32``: plain float32 training (the model in float32, no rounding, no log);
* ``fp64``: plain float64 training (same model, same data order, no rounding);
* ``trainer``: float64 with rounding and logging (``record``), then the chunk encoded, hashed
  and written to disk (tmp file, fsync, rename: :class:`~game.training.roundlog.LogWriter`),
  plus the state hash;
* ``auditor``: the trainer's chunk read from disk and decoded, the step replayed with it
  (``replay``), plus the state hash.

The variants are interleaved: for each step index the four run in turn (the order rotates with
the step so none always runs first), so drifts of the machine's speed hit all four alike. The
first ``warmup`` steps of each repeat are not timed. Medians over every timed step of every
repeat are reported; ratios are ratios of those medians. Caveat: :meth:`StepEngine.run_step`
hashes the float32 state too (it has canonical bytes), so the ``fp32`` baseline includes one
state hash per step. On a CUDA profile the device is synchronised before and after every timed
step, so a step's time includes its kernels, not only their launch.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from game.errors import TrainingError
from game.training.config import TaskConfig
from game.training.profiles import Profile, get_profile
from game.training.roundlog import LogReader, LogWriter
from game.training.state import TrainState
from game.training.step import StepEngine

log = logging.getLogger(__name__)

#: The variants, in the order they are reported.
VARIANTS: tuple[str, ...] = ("fp32", "fp64", "trainer", "auditor")
#: The profile every variant runs on unless another is named.
OVERHEAD_PROFILE = "cpu-1t"
#: Paper (seed, ANCHORS.md): trainer and auditor time over plain training (ResNet-50, GPT-2).
PAPER_TRAINER = (1.17, 1.38)
PAPER_AUDITOR = (1.29, 1.69)
#: Issue 5's targets, as ratios over plain float64 training on the same machine in the same run.
TARGET_TRAINER = 1.15
TARGET_AUDITOR = 1.25

#: ``progress(message)`` after every timed step.
ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class OverheadReport:
    """Median seconds per step of each variant and the ratios between them."""

    preset: str
    profile: str
    steps: int  # timed steps per repeat
    warmup: int  # untimed steps at the start of each repeat
    repeats: int
    medians: dict[str, float]  # variant -> median seconds per step
    samples: dict[str, list[float]]  # variant -> every timed step's seconds
    config: dict[str, Any]

    @property
    def ratios(self) -> dict[str, float]:
        m = self.medians
        return {
            "trainer_over_fp64": m["trainer"] / m["fp64"],
            "auditor_over_fp64": m["auditor"] / m["fp64"],
            "trainer_over_fp32": m["trainer"] / m["fp32"],
            "fp32_over_fp64": m["fp32"] / m["fp64"],
        }

    @property
    def targets(self) -> dict[str, dict[str, Any]]:
        r = self.ratios
        return {
            "trainer_over_fp64": {
                "value": r["trainer_over_fp64"],
                "target": TARGET_TRAINER,
                "reached": r["trainer_over_fp64"] <= TARGET_TRAINER,
                "paper": list(PAPER_TRAINER),
            },
            "auditor_over_fp64": {
                "value": r["auditor_over_fp64"],
                "target": TARGET_AUDITOR,
                "reached": r["auditor_over_fp64"] <= TARGET_AUDITOR,
                "paper": list(PAPER_AUDITOR),
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "profile": self.profile,
            "steps": self.steps,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "median_seconds": dict(self.medians),
            "samples": {k: len(v) for k, v in self.samples.items()},
            "ratios": self.ratios,
            "paper": {"trainer_over_plain": list(PAPER_TRAINER), "auditor_over_plain": list(PAPER_AUDITOR)},
            "targets": self.targets,
            "config": self.config,
        }


class _Variants:
    """The four states and the work of one step of each; built fresh for every repeat."""

    def __init__(self, cfg: TaskConfig, workdir: Path, profile: Profile) -> None:
        self.cfg = cfg
        self.spec = cfg.spec_hash()
        self.engine = StepEngine(cfg, profile)
        self.states: dict[str, TrainState] = {
            "fp32": self.engine.init_state(precision="fp32"),
            "fp64": self.engine.init_state(),
            "trainer": self.engine.init_state(),
            "auditor": self.engine.init_state(),
        }
        self.writer = LogWriter(workdir)
        self.reader = LogReader(workdir, self.spec)
        self.trainer_leaf: bytes | None = None

    def run(self, variant: str, step: int) -> None:
        state, engine = self.states[variant], self.engine
        if variant == "fp32":
            engine.run_step(state, step, mode="plain", precision="fp32")
        elif variant == "fp64":
            engine.run_step(state, step, mode="plain")
        elif variant == "trainer":
            res = engine.run_step(state, step, mode="record")
            assert res.log is not None  # record mode returns its log
            self.writer.write_chunk(step, res.log, self.spec)  # encode + atomic write + chunk hash
            self.trainer_leaf = res.leaf
        else:
            chunk = self.reader.read(step)  # read + decode + check
            res = engine.run_step(state, step, mode="replay", log=chunk)
            if self.trainer_leaf is not None and res.leaf != self.trainer_leaf:
                raise TrainingError(f"step {step}: the auditor's replay differs from the trainer's state")


def measure_overhead(
    cfg: TaskConfig,
    *,
    steps: int = 5,
    repeats: int = 3,
    warmup: int = 1,
    profile: str = OVERHEAD_PROFILE,
    progress: ProgressFn | None = None,
) -> OverheadReport:
    """Time ``steps`` steps (after ``warmup`` untimed ones) of all four variants, ``repeats`` times."""
    if steps < 1 or repeats < 1 or warmup < 0:
        raise TrainingError("overhead: steps and repeats must be >= 1 and warmup >= 0")
    prof = get_profile(profile)
    if prof.emulates:
        raise TrainingError(
            f"overhead: profile {profile!r} emulates other hardware in Python; time a real one "
            "(cpu-1t, cpu-2t or cuda)"
        )
    sync = torch.cuda.synchronize if prof.device.startswith("cuda") else _no_sync
    cfg = cfg.replace(steps=max(cfg.steps, warmup + steps))
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(repeats):
        with tempfile.TemporaryDirectory(prefix="vgame-overhead-") as tmp:
            variants = _Variants(cfg, Path(tmp), prof)
            for step in range(1, warmup + steps + 1):
                for name in _step_order(step):
                    sync()
                    t0 = time.perf_counter()
                    variants.run(name, step)
                    sync()
                    dt = time.perf_counter() - t0
                    if step > warmup:
                        samples[name].append(dt)
                if progress is not None and step > warmup:
                    progress(f"repeat {rep + 1}/{repeats}, step {step - warmup}/{steps}")
    medians = {v: statistics.median(samples[v]) for v in VARIANTS}
    log.info("overhead %s: medians %s", cfg.preset, medians)
    return OverheadReport(
        preset=cfg.preset,
        profile=prof.name,
        steps=steps,
        warmup=warmup,
        repeats=repeats,
        medians=medians,
        samples=samples,
        config=cfg.to_dict(),
    )


def _no_sync() -> None:
    """A CPU profile's steps are done when they return."""


def _step_order(step: int) -> list[str]:
    """The four variants for ``step``: rotated by the step, the auditor always after the trainer."""
    k = step % len(VARIANTS)
    rotated = [*VARIANTS[k:], *VARIANTS[:k]]
    if rotated.index("auditor") < rotated.index("trainer"):
        rotated.remove("auditor")
        rotated.insert(rotated.index("trainer") + 1, "auditor")
    return rotated


__all__ = ["OVERHEAD_PROFILE", "VARIANTS", "OverheadReport", "measure_overhead"]
