"""Calibrated divergence bands: how far two machines' float64 results of one op can lie apart.

Every input of a rounded op is on the grid and identical for every party (the previous results were
rounded with the log), so trainer and auditor differ only by the op's own float64 error. A band
bounds that difference for one op type, as two powers of two::

    |x_trainer - x_auditor|  <=  2**rel * 2**e(x)  +  2**abs * 2**e(S)

where ``e(x)`` is the binary exponent of the value and ``e(S)`` the exponent of the largest
magnitude in the same output tensor (the floor covers outputs that cancel: a small dot product of
large terms carries an error of the terms' scale, not its own). Bands do not depend on the grid
width ``bits``: they describe float64 arithmetic. ``vgame calibrate`` measures them (with a safety
margin already added); the table is part of the task config and so of the spec hash, which makes
trainer, auditor and judge use the same numbers.

Only values whose distance to a rounding midpoint is inside the band can round differently on two
machines, so only those need a log entry (the sparse log), and a logged direction that moves a value
outside its band is a lie (the band check). The rules with their slack are in :mod:`rounding`.

This module imports no torch, so configs can be read and hashed cheaply.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from game.errors import ConfigError

#: Bands are powers of two with exponents in this range (2**-60 is far below a float64 ulp's
#: meaning for a band; 2**-2 is a quarter of a value's binade, i.e. everything).
MIN_EXP = -60
MAX_EXP = -2

#: Format tag of a bands file.
BANDS_FORMAT = "vgame-bands-v1"


@dataclass(frozen=True, order=True)
class Band:
    """One op's band: ``2**rel`` relative to the value's binade plus ``2**abs`` of the tensor's top binade."""

    rel: int
    abs: int

    def validate(self, where: str) -> None:
        for name, value in (("rel", self.rel), ("abs", self.abs)):
            if isinstance(value, bool) or not isinstance(value, int) or not MIN_EXP <= value <= MAX_EXP:
                raise ConfigError(
                    f"{where}.{name}: expected an integer exponent in {MIN_EXP}..{MAX_EXP}, got {value!r}"
                )

    def widest(self, other: Band) -> Band:
        """The band that covers both."""
        return Band(max(self.rel, other.rel), max(self.abs, other.abs))

    def to_list(self) -> list[int]:
        return [self.rel, self.abs]


@dataclass(frozen=True)
class BandTable:
    """Per-op bands (keyed by the ATen op name in the log, e.g. ``aten.mm.default``) and a default.

    ``default`` serves ops the calibration never saw: it is the widest band measured, so a new op is
    never trusted with a narrower band than the worst known one.
    """

    default: Band
    ops: Mapping[str, Band] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Keep the mapping immutable and ordered, whatever the caller passed.
        object.__setattr__(self, "ops", dict(sorted(self.ops.items())))

    def validate(self) -> None:
        self.default.validate("bands.default")
        for name, band in self.ops.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"bands.ops: op names must be non-empty strings, got {name!r}")
            band.validate(f"bands.ops.{name!r}")

    def band(self, op_name: str) -> Band:
        """The band of an op (the default for an op the table does not list)."""
        return self.ops.get(op_name, self.default)

    def __hash__(self) -> int:
        return hash((self.default, tuple(self.ops.items())))

    # ---- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"default": [rel, abs], "ops": {name: [rel, abs]}}``: what the canonical JSON holds."""
        return {"default": self.default.to_list(), "ops": {k: v.to_list() for k, v in self.ops.items()}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "bands") -> BandTable:
        """Strict inverse of :meth:`to_dict`; ConfigError naming the key on anything else."""
        if isinstance(data, BandTable):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a table with 'default' and 'ops', got {data!r}")
        unknown = set(data) - {"default", "ops", "format", "margin", "measured"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (valid: default, ops)")
        if "default" not in data:
            raise ConfigError(f"{where}.default: missing")
        ops_raw = data.get("ops", {})
        if not isinstance(ops_raw, Mapping):
            raise ConfigError(f"{where}.ops: expected a table of op name -> [rel, abs]")
        table = cls(
            default=_band_from(data["default"], f"{where}.default"),
            ops={str(k): _band_from(v, f"{where}.ops.{k!r}") for k, v in ops_raw.items()},
        )
        table.validate()
        return table

    def to_toml(self, *, comment: str = "", origin: BandsOrigin | None = None) -> str:
        """A bands file (``[bands]`` table) that :func:`load_bands` and task configs read; ``origin``
        adds the ``[calibrated]`` table saying which task the bands were measured on."""
        lines = [f"# {line}" if line else "#" for line in comment.splitlines()] if comment else []
        lines += [f'format = "{BANDS_FORMAT}"', ""]
        if origin is not None:
            lines += [*origin.toml_lines(), ""]
        lines += [
            "[bands]",
            f"default = {self.default.to_list()}",
            "",
            "[bands.ops]",
        ]
        lines += [f'"{name}" = {band.to_list()}' for name, band in self.ops.items()]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BandsOrigin:
    """What a bands file was calibrated on: the preset, its model sizes and the batch size.

    Bands measured on one model say little about another's ops (sums over other lengths, other
    ops), and bands narrower than the real divergence let an honest trainer lose a dispute: so a
    task refuses a file of another preset and warns about one of other sizes
    (:meth:`TaskConfig.check_bands_origin`). Files written before this table have no origin.
    """

    preset: str
    model: Mapping[str, int | str]
    batch_size: int

    def toml_lines(self) -> list[str]:
        return [
            "[calibrated]",
            f"preset = {json.dumps(self.preset)}",
            f"batch_size = {self.batch_size}",
            "model = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.model.items()) + " }",
        ]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BandsOrigin:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}.calibrated: expected a table with preset, model and batch_size")
        preset, model, batch = data.get("preset"), data.get("model"), data.get("batch_size")
        if not isinstance(preset, str):
            raise ConfigError(f"{where}.calibrated.preset: expected a preset name, got {preset!r}")
        if not isinstance(model, Mapping) or not all(
            isinstance(v, int | str) and not isinstance(v, bool) for v in model.values()
        ):
            raise ConfigError(f"{where}.calibrated.model: expected a table of model sizes, got {model!r}")
        if isinstance(batch, bool) or not isinstance(batch, int):
            raise ConfigError(f"{where}.calibrated.batch_size: expected an integer, got {batch!r}")
        return cls(preset=preset, model=dict(model), batch_size=batch)

    def describe(self) -> str:
        sizes = ",".join(f"{k}={v}" for k, v in self.model.items())
        return f"{self.preset} at {sizes}, batch size {self.batch_size}"


def _band_from(value: Any, where: str) -> Band:
    if isinstance(value, Band):
        band = value
    elif isinstance(value, list | tuple) and len(value) == 2:
        band = Band(*value)
    elif isinstance(value, Mapping) and set(value) == {"rel", "abs"}:
        band = Band(value["rel"], value["abs"])
    else:
        raise ConfigError(f"{where}: expected [rel, abs] (two integer exponents), got {value!r}")
    band.validate(where)
    return band


def loads_bands(text: str, where: str = "bands file") -> BandTable:
    """Parse a bands file (the output of ``vgame calibrate``)."""
    return loads_bands_file(text, where)[0]


def loads_bands_file(text: str, where: str = "bands file") -> tuple[BandTable, BandsOrigin | None]:
    """Parse a bands file: its table, and what it was calibrated on (None for a file without it)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from exc
    fmt = doc.get("format", BANDS_FORMAT)
    if fmt != BANDS_FORMAT:
        raise ConfigError(f"{where}: format {fmt!r} is not {BANDS_FORMAT!r}")
    if "bands" not in doc:
        raise ConfigError(f"{where}: no [bands] table")
    origin = BandsOrigin.from_dict(doc["calibrated"], where) if "calibrated" in doc else None
    return BandTable.from_dict(doc["bands"], "bands"), origin


def load_bands(path: str | Path) -> BandTable:
    """Read a bands file from disk."""
    return load_bands_file(path)[0]


def load_bands_file(path: str | Path) -> tuple[BandTable, BandsOrigin | None]:
    """Read a bands file from disk: its table and what it was calibrated on."""
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"bands file {str(p)!r}: {exc.strerror or exc}") from exc
    return loads_bands_file(text, f"bands file {str(p)!r}")


def preset_bands(preset: str) -> BandTable:
    """The calibrated bands shipped for a preset (``game/training/task/calibrated/<preset>.toml``)."""
    path = resources.files("game.training").joinpath("task", "calibrated", f"{preset}.toml")
    if not path.is_file():
        raise ConfigError(f"no calibrated bands are shipped for preset {preset!r}: run `vgame calibrate`")
    return loads_bands(path.read_text("utf-8"), f"bands of preset {preset!r}")


__all__ = [
    "BANDS_FORMAT",
    "MAX_EXP",
    "MIN_EXP",
    "Band",
    "BandTable",
    "BandsOrigin",
    "load_bands",
    "load_bands_file",
    "loads_bands",
    "loads_bands_file",
    "preset_bands",
]
