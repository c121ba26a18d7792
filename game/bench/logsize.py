"""Size of the rounding log per step, packed and sparse, per grid width (issues 5 and 6).

For each ``bits`` two trainers record ``steps`` steps on ``cpu-1t`` from the same start: one writes
the packed format (a trit per rounded value, 116 in 23 bytes), the other the sparse format (only
the in-band values rounded to the odd neighbour, positions delta-coded, lzma). Their states are the
same (both round to nearest); only the logs differ. Every packed chunk is also compressed alone with
zlib (level 9) and lzma; every sparse chunk is also measured without compression (``stored``) and
with zlib. A ``noisy`` auditor replays each format's chunks (its leaves must match the trainer's),
counting its corrections, and, for the sparse log, the values within 16 bands of a midpoint: the
only values whose side a trainer could choose and still pass the band check ("bits of freedom").
"""

from __future__ import annotations

import logging
import lzma
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from game.errors import ConfigError, TrainingError
from game.training.dispatch.profiles import get_profile
from game.training.engine.step import StepEngine
from game.training.log.formats import bits_per_value, decode_chunk
from game.training.log.trits import packed_size
from game.training.task.config import TaskConfig

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
    values: int  # rounded (inexact) values over all steps: the denominator of bits per value
    packed_bytes: int  # packed chunk bytes as written
    header_bytes: int  # of which header and record table (the rest is trits, 116 in 23 bytes)
    zlib_bytes: int  # packed chunks, zlib-9
    lzma_bytes: int  # packed chunks, lzma
    directed: int  # packed trits that are 0 or 2 (a direction, not "ignore")
    corrections: int  # corrections of the noisy auditor replaying the packed log
    sparse_bytes: int  # sparse chunks as written (the smaller of zlib and lzma inside)
    sparse_stored_bytes: int  # the same chunks without compression
    sparse_zlib_bytes: int  # the same chunks with zlib-9 inside
    entries: int  # sparse entries (in-band values rounded to the odd neighbour)
    sparse_corrections: int  # corrections of the noisy auditor replaying the sparse log
    free: int  # values within 16 bands of a midpoint, as the noisy auditor saw them

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
            "sparse_bytes_per_step": self.sparse_bytes / s,  # as written: the smaller of zlib and lzma
            "sparse_stored_bytes_per_step": self.sparse_stored_bytes / s,
            "sparse_zlib_bytes_per_step": self.sparse_zlib_bytes / s,
            "bits_per_value_packed": bits_per_value(self.packed_bytes, self.values),
            "bits_per_value_trits": bits_per_value(self.packed_bytes - self.header_bytes, self.values),
            "bits_per_value_zlib": bits_per_value(self.zlib_bytes, self.values),
            "bits_per_value_lzma": bits_per_value(self.lzma_bytes, self.values),
            "bits_per_value_sparse": bits_per_value(self.sparse_bytes, self.values),
            "bits_per_value_sparse_stored": bits_per_value(self.sparse_stored_bytes, self.values),
            "bits_per_value_sparse_zlib": bits_per_value(self.sparse_zlib_bytes, self.values),
            "directed_fraction": self.directed / self.values if self.values else 0.0,
            "entries_per_step": self.entries / s,
            "corrections_per_step": self.corrections / s,
            "sparse_corrections_per_step": self.sparse_corrections / s,
            "free_bits_per_step": self.free / s,
            "totals": {
                "values": self.values,
                "packed_bytes": self.packed_bytes,
                "header_bytes": self.header_bytes,
                "zlib_bytes": self.zlib_bytes,
                "lzma_bytes": self.lzma_bytes,
                "directed": self.directed,
                "corrections": self.corrections,
                "sparse_bytes": self.sparse_bytes,
                "sparse_stored_bytes": self.sparse_stored_bytes,
                "sparse_zlib_bytes": self.sparse_zlib_bytes,
                "entries": self.entries,
                "sparse_corrections": self.sparse_corrections,
                "free": self.free,
            },
        }


def measure_row(cfg: TaskConfig, bits: int, steps: int) -> LogSizeRow:
    """Record ``steps`` steps at ``bits`` in both formats and replay them with a noisy auditor."""
    from game.training.log.sparse import SparseStepLog

    base = cfg.replace(bits=bits, steps=max(cfg.steps, steps))
    packed_cfg, sparse_cfg = base.replace(log_format="packed"), base.replace(log_format="sparse")
    engines = {
        "packed": (StepEngine(packed_cfg, get_profile(TRAINER_PROFILE)), StepEngine(packed_cfg, get_profile(AUDITOR_PROFILE))),
        "sparse": (StepEngine(sparse_cfg, get_profile(TRAINER_PROFILE)), StepEngine(sparse_cfg, get_profile(AUDITOR_PROFILE))),
    }  # fmt: skip
    engines["sparse"][1].count_free = True
    states = {k: (t.init_state(), a.init_state()) for k, (t, a) in engines.items()}
    n: dict[str, int] = dict.fromkeys(LogSizeRow.__dataclass_fields__, 0)
    for step in range(1, steps + 1):
        leaves = {}
        for fmt, (trainer, auditor) in engines.items():
            t_state, a_state = states[fmt]
            c = packed_cfg if fmt == "packed" else sparse_cfg
            spec = c.spec_hash()
            res = trainer.run_step(t_state, step, mode="record")
            assert res.log is not None  # record mode returns its log
            chunk = res.log.encode(step, spec)
            if isinstance(res.log, SparseStepLog):
                n["sparse_bytes"] += len(chunk)
                n["entries"] += res.log.total_entries
                for codec, key in (("stored", "sparse_stored_bytes"), ("zlib", "sparse_zlib_bytes")):
                    res.log.codec = codec
                    n[key] += len(res.log.encode(step, spec))
            else:
                trits = res.log.all_trits()
                n["values"] += trits.numel()
                n["directed"] += int((trits != 1).sum())
                n["packed_bytes"] += len(chunk)
                n["header_bytes"] += len(chunk) - packed_size(trits.numel())
                n["zlib_bytes"] += len(zlib.compress(chunk, 9))
                n["lzma_bytes"] += len(lzma.compress(chunk))
            rep = auditor.run_step(a_state, step, mode="replay", log=decode_chunk(chunk, spec, step))
            if rep.leaf != res.leaf:
                raise TrainingError(
                    f"bits {bits}, step {step}: the noisy auditor's replay of the {fmt} log differs"
                )
            n["corrections" if fmt == "packed" else "sparse_corrections"] += rep.corrections
            if fmt == "sparse":
                assert auditor.last_mode is not None
                n["free"] += auditor.last_mode.free
            leaves[fmt] = res.leaf
        if leaves["packed"] == leaves["sparse"]:
            continue
        raise TrainingError(f"bits {bits}, step {step}: the packed and sparse trainers' states differ")
    n["bits"], n["steps"] = bits, steps
    log.info(
        "log size %s bits=%d: %d values, %d packed, %d sparse bytes",
        cfg.preset,
        bits,
        n["values"],
        n["packed_bytes"],
        n["sparse_bytes"],
    )
    return LogSizeRow(**n)


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
