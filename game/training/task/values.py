"""Reading and checking a config's values: a raw TOML/JSON value against its field's type, a float
against its range, and a task's sizes from a ``[model]`` table (a preset's dataclass, or the
:class:`~.declaration.Table` a user's task declares). No torch here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from game.errors import ConfigError
from game.registry import did_you_mean
from game.training.task.catalog import ModelShape
from game.training.task.declaration import Declaration, Table


def model_from(decl: Declaration, data: Any, *, partial: bool) -> ModelShape | Table:
    """The task's sizes from a ``[model]`` table: its dataclass (a preset's) or a Table."""
    if decl.shape is None:
        if isinstance(data, Table):
            data = dict(data)
        return decl.table("model", data, partial=partial)
    return shape_from(decl.shape, data, partial=partial)


def shape_from(shape_cls: type[ModelShape], data: Any, *, partial: bool) -> ModelShape:
    if isinstance(data, shape_cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"model: expected a table of sizes, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(shape_cls)}
    for key in data:
        if key not in fields:
            hint = did_you_mean(key, fields)
            raise ConfigError(
                f"model.{key}: unknown size for this preset{hint} (valid: {', '.join(sorted(fields))})"
            )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            values[name] = coerce(f"model.{name}", data[name], f.type)
        elif not partial and not f.metadata.get("omit_if_default"):
            raise ConfigError(f"model.{name}: missing")
    return shape_cls(**values)


def shape_dict(shape: ModelShape | Table) -> dict[str, Any]:
    """The sizes as a plain dict, less the ``OMIT_IF_DEFAULT`` fields that hold their default."""
    if isinstance(shape, Table):
        return shape.to_dict()
    return {
        f.name: getattr(shape, f.name)
        for f in dataclasses.fields(shape)
        if not (f.metadata.get("omit_if_default") and getattr(shape, f.name) == f.default)
    }


def coerce(key: str, value: Any, type_name: Any) -> Any:
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
        return tuple(coerce(f"{key}[{i}]", v, "float") for i, v in enumerate(value))
    raise ConfigError(f"{key}: cannot be set here")  # pragma: no cover - every field is handled


def check_float(
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


__all__ = ["check_float", "coerce", "model_from", "shape_dict", "shape_from"]
