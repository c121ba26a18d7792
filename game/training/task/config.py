"""The task config: every number training depends on, and its canonical spec hash.

The client posts ``spec_hash()`` on-chain, so two parties agree on a task only if they agree on every
byte of :meth:`TaskConfig.canonical_json`: the config fields, the preset's model sizes, a format
version and the SHA-256 of the packaged data file. This module imports no torch, so the CLI and the
agents can read and hash a config cheaply.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from game.errors import ConfigError
from game.training.log import LOG_FORMATS
from game.training.numerics.bandfile import BandsOrigin, BandTable, load_bands_file, preset_bands
from game.training.task.catalog import (
    PRESET_NAMES,
    CNNShape,
    GPTShape,
    MLPShape,
    ModelShape,
    check_int_range,
    dataset_sha256,
    preset_info,
)

log = logging.getLogger(__name__)

#: Bumped whenever the meaning or layout of the canonical JSON changes, including what computation a
#: config stands for: v3 runs the optimizers as foreach ops, whose rounding log differs from v2's;
#: v4 commits to leaves of format ``vgame-leaf-v2`` (``leafhash.py``: chunked, so a GPU computes
#: them in parallel), where v3's were ``sha256(canonical bytes)``.
SPEC_FORMAT = "vgame-task-v4"

#: Counter words of the RNG are 32 bits wide (see ``rng.py``): steps and example ids must fit.
MAX_STEPS = 2**32 - 1
MAX_EXAMPLES = 2**32

OPTIMIZERS = ("sgd", "adamw")


# --------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskConfig:
    """One training task. Field order is irrelevant to the hash (keys are sorted)."""

    preset: str  # one of PRESET_NAMES: model, data and loss
    model: ModelShape  # the preset's sizes
    seed: int = 0  # task seed: keys every random draw (init, data order, dropout); 0 <= seed < 2**64
    steps: int = 100  # training steps S; the run has S + 1 state leaves (step 0 is init)
    batch_size: int = 32  # examples per step
    optimizer: str = "sgd"  # "sgd" (torch.optim.SGD) or "adamw" (torch.optim.AdamW)
    lr: float = 0.1  # learning rate, constant
    momentum: float = 0.0  # SGD momentum (ignored by AdamW)
    weight_decay: float = 0.0  # SGD L2 / AdamW decoupled decay (AdamW: matrices only)
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    dropout: float = 0.0  # dropout probability (models that have dropout)
    bits: int = 32  # rounding grid: float32 with the low 32 - bits mantissa bits zero; 16..32
    tau: float = 0.25  # log threshold as a fraction of the grid ulp; 0 <= tau < 0.5
    checkpoint_interval: int = 10  # k: the trainer keeps a full checkpoint every k steps
    log_format: str = "sparse"  # "sparse" (in-band values only) or "packed" (a trit per value, the paper's)
    bands: BandTable | None = None  # calibrated divergence bands per op; None: the preset's shipped ones

    def __post_init__(self) -> None:
        if self.bands is None:
            object.__setattr__(self, "bands", preset_bands(self.preset))
        self.validate()

    @property
    def band_table(self) -> BandTable:
        """The bands (always set after construction)."""
        assert self.bands is not None
        return self.bands

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def for_preset(cls, name: str, **overrides: Any) -> TaskConfig:
        """The preset's defaults with ``overrides``; ``model`` may be a dict of size overrides."""
        return cls.from_dict({"preset": name, **overrides}, partial=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, partial: bool = False) -> TaskConfig:
        """Strict inverse of :meth:`to_dict`; ``partial`` fills missing keys from the preset defaults.

        Unknown keys and badly typed values raise ConfigError naming the key.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: expected a table, got {type(data).__name__}")
        if "preset" not in data:
            raise ConfigError("preset: missing (valid: " + ", ".join(PRESET_NAMES) + ")")
        name = data["preset"]
        if not isinstance(name, str):
            raise ConfigError(f"preset: expected a string, got {name!r}")
        info = preset_info(name)
        known = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"{key}: unknown config key (valid: {', '.join(sorted(known))})")
        values: dict[str, Any] = {"preset": name}
        for fname, f in known.items():
            if fname in ("preset", "model"):
                continue
            if fname == "bands":
                if fname in data:
                    values[fname] = BandTable.from_dict(data[fname])
                elif not partial:
                    raise ConfigError("bands: missing")
                continue
            if fname in data:
                values[fname] = _coerce(fname, data[fname], f.type)
            elif not partial:
                raise ConfigError(f"{fname}: missing")
            elif fname in info.defaults:
                values[fname] = info.defaults[fname]
        if "model" in data and not partial:
            values["model"] = _shape_from(info.shape, data["model"], partial=False)
        elif "model" in data:
            values["model"] = _shape_from(info.shape, data["model"], partial=True)
        elif partial:
            values["model"] = info.shape()
        else:
            raise ConfigError("model: missing")
        return cls(**values)

    # ---- validation --------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value is out of range."""
        info = preset_info(self.preset)
        if not isinstance(self.model, info.shape):
            raise ConfigError(
                f"model: preset {self.preset!r} needs {info.shape.__name__}, got {type(self.model).__name__}"
            )
        self.model.validate()
        check_int_range("seed", self.seed, 0, 2**64 - 1)
        check_int_range("steps", self.steps, 1, MAX_STEPS)
        check_int_range("batch_size", self.batch_size, 1, 1 << 20)
        if self.steps * self.batch_size >= MAX_EXAMPLES:
            raise ConfigError("steps: steps * batch_size must stay below 2**32 (example ids are 32-bit)")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer: {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        _check_float("lr", self.lr, 0.0, math.inf, lo_open=True)
        _check_float("momentum", self.momentum, 0.0, 1.0, hi_open=True)
        _check_float("weight_decay", self.weight_decay, 0.0, math.inf)
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2):
            raise ConfigError(f"betas: expected two numbers, got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            _check_float(f"betas[{i}]", beta, 0.0, 1.0, hi_open=True)
        _check_float("eps", self.eps, 0.0, math.inf, lo_open=True)
        _check_float("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_int_range("bits", self.bits, 16, 32)
        _check_float("tau", self.tau, 0.0, 0.5, hi_open=True)
        check_int_range("checkpoint_interval", self.checkpoint_interval, 1, MAX_STEPS)
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format: {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        if not isinstance(self.bands, BandTable):
            raise ConfigError(f"bands: expected a band table, got {type(self.bands).__name__}")
        self.bands.validate()

    # ---- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-able dict (model as a sub-dict, betas as a list)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model":
                value = _shape_dict(value)
            elif f.name == "bands":
                value = self.band_table.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @property
    def dataset(self) -> str:
        """File name of the preset's data under game/data/."""
        return preset_info(self.preset).dataset

    def canonical_json(self) -> bytes:
        """The bytes the spec hash covers: sorted keys, no whitespace, floats as Python repr.

        Python's float repr is the shortest string that round-trips, identical on every platform.
        """
        doc = {
            "format": SPEC_FORMAT,
            "config": self.to_dict(),
            "dataset": {"name": self.dataset, "sha256": dataset_sha256(self.dataset)},
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")

    def spec_hash(self) -> bytes:
        """SHA-256 of :meth:`canonical_json` (32 bytes; the value the client posts on-chain)."""
        return hashlib.sha256(self.canonical_json()).digest()

    @property
    def num_leaves(self) -> int:
        """The state leaves a run of this task has, step 0 (the initialisation) included: steps + 1.
        The client posts it on-chain with the task, and the contract refuses a commitment of any
        other size (the trainer's tree: :attr:`Manifest.num_leaves`)."""
        return self.steps + 1

    def replace(self, **changes: Any) -> TaskConfig:
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)

    def check_bands_origin(self, origin: BandsOrigin | None, where: str) -> None:
        """Refuse bands calibrated on another preset; warn about bands measured at other sizes.

        Bands narrower than the real divergence can cost an honest trainer its dispute, and
        another preset's file is a mix-up, never a choice (its ops are other ops). Other sizes may
        be a choice (a calibration at a smaller, cheaper size), so they are only warned about.
        """
        if origin is None:
            return
        if origin.preset != self.preset:
            raise ConfigError(
                f"{where} was calibrated on preset {origin.preset!r}, not {self.preset!r}: "
                f"calibrate this task (`vgame calibrate --preset {self.preset} --out FILE`) or leave "
                "the bands out to take the preset's shipped ones"
            )
        try:
            same_model = _shape_from(type(self.model), origin.model, partial=True) == self.model
        except ConfigError:
            same_model = False
        if not same_model or origin.batch_size != self.batch_size:
            sizes = ",".join(f"{k}={v}" for k, v in _shape_dict(self.model).items())
            log.warning(
                "%s was calibrated on %s; this task is %s at %s, batch size %d. Divergence grows "
                "with sizes: calibrate at the task's (`vgame calibrate --preset %s --model %s "
                "--batch-size %d`)",
                where,
                origin.describe(),
                self.preset,
                sizes,
                self.batch_size,
                self.preset,
                sizes,
                self.batch_size,
            )


def load_config(path: str | Path) -> TaskConfig:
    """Read a TOML task config; keys left out take the preset's defaults."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r}: invalid TOML: {exc}") from exc
    origin = None
    if isinstance(data.get("bands"), str):  # a bands file written by `vgame calibrate`, beside the config
        bands_path = p.parent / data["bands"]
        data["bands"], origin = load_bands_file(bands_path)
    cfg = TaskConfig.from_dict(data, partial=True)
    if origin is not None:
        cfg.check_bands_origin(origin, f"bands file {str(bands_path)!r}")
    return cfg


def example_config(name: str) -> TaskConfig:
    """The example task shipped for preset ``name`` (``game/training/task/presets/<name>.toml``)."""
    preset_info(name)
    text = resources.files("game.training.task").joinpath("presets", f"{name}.toml").read_text("utf-8")
    return loads_config(text)


def loads_config(text: str) -> TaskConfig:
    """Parse a TOML task config from a string (see :func:`load_config`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: invalid TOML: {exc}") from exc
    return TaskConfig.from_dict(data, partial=True)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _shape_from(
    shape_cls: type[MLPShape] | type[CNNShape] | type[GPTShape], data: Any, *, partial: bool
) -> ModelShape:
    if isinstance(data, shape_cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"model: expected a table of sizes, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(shape_cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"model.{key}: unknown size for this preset (valid: {', '.join(sorted(fields))})"
            )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _coerce(f"model.{name}", data[name], f.type)
        elif not partial and not f.metadata.get("omit_if_default"):
            raise ConfigError(f"model.{name}: missing")
    return shape_cls(**values)


def _shape_dict(shape: ModelShape) -> dict[str, Any]:
    """The shape as a plain dict, less the ``OMIT_IF_DEFAULT`` fields that hold their default."""
    return {
        f.name: getattr(shape, f.name)
        for f in dataclasses.fields(shape)
        if not (f.metadata.get("omit_if_default") and getattr(shape, f.name) == f.default)
    }


def _coerce(key: str, value: Any, type_name: Any) -> Any:
    """Check a raw TOML/JSON value against the field's annotation (a string: annotations are lazy)."""
    t = str(type_name)
    if t == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if t == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if t == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if t == "tuple[float, float]":
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(f"{key}: expected a list of two numbers, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", v, "float") for i, v in enumerate(value))
    raise ConfigError(f"{key}: cannot be set here")  # pragma: no cover - every field is handled


def _check_float(
    key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, float):
        raise ConfigError(f"{key}: expected a float, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{key}: {value} is not finite")
    if value < lo or (lo_open and value == lo) or value > hi or (hi_open and value == hi):
        lb = "(" if lo_open or math.isinf(lo) else "["
        rb = ")" if hi_open or math.isinf(hi) else "]"
        raise ConfigError(f"{key}: {value} is outside {lb}{lo}, {hi}{rb}")


__all__ = [
    "LOG_FORMATS",
    "MAX_EXAMPLES",
    "MAX_STEPS",
    "OPTIMIZERS",
    "SPEC_FORMAT",
    "TaskConfig",
    "example_config",
    "load_config",
    "loads_config",
]
