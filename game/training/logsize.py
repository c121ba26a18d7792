"""Size of the rounding log per step, packed and compressed, per grid width (issue 5, item 2).

For each ``bits`` the trainer records ``steps`` steps on ``cpu-1t``; every chunk is measured as
written (header, records and trits packed 5 per byte) and after the standard library's zlib
(level 9) and lzma, each chunk compressed alone as a chunk file would be. A ``noisy`` auditor then
replays every chunk and its ``rev`` corrections are counted (its leaves must match the trainer's).
"""

from __future__ import annotations

import logging
import lzma
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from game.errors import ConfigError, TrainingError
from game.training.config import TaskConfig
from game.training.profiles import get_profile
from game.training.roundlog import bits_per_value, decode_chunk, packed_size
from game.training.step import StepEngine

log = logging.getLogger(__name__)

TRAINER_PROFILE = "cpu-1t"
AUDITOR_PROFILE = "noisy"
DEFAULT_BITS: tuple[int, ...] = (32, 28, 26)
MIN_BITS, MAX_BITS = 16, 32

#: Paper figures (seed, ANCHORS.md). Zipped bits/value are 1.6 x (zipped MB / packed MB).
PAPER: dict[str, Any] = {
    "packed_bits_per_value": 1.6,
    "zip_bits_per_value_b32": {"resnet50": 1.6 * 96 / 105, "gpt2": 1.6 * 20 / 22},
    "zip_bits_per_value_b26": {"resnet50": 1.6 * 91 / 105, "gpt2": 1.6 * 18 / 22},
    "corrections_per_step_b32": {"resnet50": 25, "gpt2": "2-3"},
    "corrections_per_step_b27_or_less": 0,
}

ProgressFn = Callable[[str], None]


def check_bits(values: Sequence[int]) -> list[int]:
    """The grid widths to measure; every one must lie in 16..32."""
    out = list(values)
    if not out:
        raise ConfigError("bits: give at least one grid width")
    bad = [b for b in out if not MIN_BITS <= b <= MAX_BITS]
    if bad:
        raise ConfigError(f"bits: {bad} outside {MIN_BITS}..{MAX_BITS}")
    return out


@dataclass(frozen=True)
class LogSizeRow:
    """Totals over the measured steps for one ``bits`` (per-step figures are derived)."""

    bits: int
    steps: int
    values: int  # logged values (trits) over all steps
    packed_bytes: int  # chunk bytes as written
    header_bytes: int  # of which header and records (the rest is trits, 5 per byte)
    zlib_bytes: int
    lzma_bytes: int
    directed: int  # trits that are 0 or 2 (a direction, not "ignore")
    corrections: int  # rev moves of the noisy auditor

    def to_dict(self) -> dict[str, Any]:
        s = self.steps
        return {
            "bits": self.bits,
            "steps": s,
            "values_per_step": self.values / s,
            "packed_bytes_per_step": self.packed_bytes / s,
            "zlib_bytes_per_step": self.zlib_bytes / s,
            "lzma_bytes_per_step": self.lzma_bytes / s,
            "header_bytes_per_step": self.header_bytes / s,
            "bits_per_value_packed": bits_per_value(self.packed_bytes, self.values),
            "bits_per_value_trits": bits_per_value(self.packed_bytes - self.header_bytes, self.values),
            "bits_per_value_zlib": bits_per_value(self.zlib_bytes, self.values),
            "bits_per_value_lzma": bits_per_value(self.lzma_bytes, self.values),
            "directed_fraction": self.directed / self.values if self.values else 0.0,
            "corrections_per_step": self.corrections / s,
            "totals": {
                "values": self.values,
                "packed_bytes": self.packed_bytes,
                "header_bytes": self.header_bytes,
                "zlib_bytes": self.zlib_bytes,
                "lzma_bytes": self.lzma_bytes,
                "directed": self.directed,
                "corrections": self.corrections,
            },
        }


def measure_row(cfg: TaskConfig, bits: int, steps: int) -> LogSizeRow:
    """Record ``steps`` steps at ``bits`` and replay them with a noisy auditor."""
    cfg = cfg.replace(bits=bits, steps=max(cfg.steps, steps))
    spec = cfg.spec_hash()
    trainer = StepEngine(cfg, get_profile(TRAINER_PROFILE))
    auditor = StepEngine(cfg, get_profile(AUDITOR_PROFILE))
    t_state, a_state = trainer.init_state(), auditor.init_state()
    values = packed = header = zbytes = xbytes = directed = corrections = 0
    for step in range(1, steps + 1):
        res = trainer.run_step(t_state, step, mode="record")
        assert res.log is not None  # record mode returns its log
        chunk = res.log.encode(step, spec)
        trits = res.log.all_trits()
        values += trits.numel()
        directed += int((trits != 1).sum())
        packed += len(chunk)
        header += len(chunk) - packed_size(trits.numel())
        zbytes += len(zlib.compress(chunk, 9))
        xbytes += len(lzma.compress(chunk))
        rep = auditor.run_step(a_state, step, mode="replay", log=decode_chunk(chunk, spec, step))
        if rep.leaf != res.leaf:
            raise TrainingError(f"bits {bits}, step {step}: the noisy auditor's replay differs")
        corrections += rep.corrections
    log.info("log size %s bits=%d: %d values, %d packed bytes", cfg.preset, bits, values, packed)
    return LogSizeRow(bits, steps, values, packed, header, zbytes, xbytes, directed, corrections)


def measure_log_size(
    cfg: TaskConfig, bits: Sequence[int] = DEFAULT_BITS, *, steps: int = 5, progress: ProgressFn | None = None
) -> list[LogSizeRow]:
    """One :class:`LogSizeRow` per grid width."""
    if steps < 1:
        raise TrainingError("log size: steps must be >= 1")
    rows = []
    for b in check_bits(bits):
        if progress is not None:
            progress(f"bits {b}: {steps} steps")
        rows.append(measure_row(cfg, b, steps))
    return rows


def report_dict(preset: str, rows: Sequence[LogSizeRow], config: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` document of ``vgame bench log``."""
    return {
        "preset": preset,
        "trainer_profile": TRAINER_PROFILE,
        "auditor_profile": AUDITOR_PROFILE,
        "rows": [r.to_dict() for r in rows],
        "paper": PAPER,
        "config": config,
    }


__all__ = [
    "DEFAULT_BITS",
    "PAPER",
    "LogSizeRow",
    "check_bits",
    "measure_log_size",
    "measure_row",
    "report_dict",
]
