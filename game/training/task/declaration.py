"""What a task declares of its config: its model sizes, its own hyper-parameters, and defaults.

A task (a built-in preset or a user's, :mod:`.api`) names the sizes its ``[model]`` table may hold
and the extra keys its config may set, each with a default whose type is the key's type. The config
layer (:mod:`.config`) reads the declaration to fill defaults, refuse unknown keys (a typo in
``--model hiden=128`` is an error, not a silently ignored size) and check types, all without
building anything. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from game.errors import ConfigError
from game.registry import did_you_mean

#: A value a table may hold: what TOML and JSON both write the same way.
Scalar = bool | int | float | str


def _freeze(key: str, value: Any) -> Any:
    """A JSON-able scalar, or a tuple of them for a list; anything else is a ConfigError."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(f"{key}[{i}]", v) for i, v in enumerate(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value} is not finite")
    if isinstance(value, bool | int | float | str):
        return value
    raise ConfigError(f"{key}: expected a number, a string, a boolean or a list of them, got {value!r}")


class Table(Mapping[str, Any]):
    """An immutable table of named scalars (a task's ``[model]`` sizes, or its own hyper-parameters),
    read as ``t["hidden"]`` or ``t.hidden``. Hashable and comparable, so a config holding one is."""

    __slots__ = ("_items",)

    def __init__(self, values: Mapping[str, Any] | None = None, *, where: str = "table") -> None:
        items = {str(k): _freeze(f"{where}.{k}", v) for k, v in (values or {}).items()}
        object.__setattr__(self, "_items", tuple(sorted(items.items())))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"no {key!r} here (keys: {', '.join(self) or 'none'})") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a Table is immutable")

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Table):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Table({dict(self._items)!r})"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, lists for tuples (JSON and TOML)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._items}


@dataclass(frozen=True)
class Declaration:
    """A task's declared config keys. ``shape`` is a frozen dataclass of sizes (the built-in presets')
    or None, in which case ``model`` lists the sizes and their defaults as a :class:`Table`."""

    model: Mapping[str, Any] = field(default_factory=dict)  # size -> default (when shape is None)
    params: Mapping[str, Any] = field(default_factory=dict)  # own hyper-parameter -> default
    defaults: Mapping[str, Any] = field(default_factory=dict)  # TaskConfig field -> default
    shape: type | None = None  # a built-in preset's sizes dataclass
    data_file: str | None = None  # a built-in preset's packaged data file (game/data/)

    def table(self, kind: str, given: Mapping[str, Any], *, partial: bool) -> Table:
        """The ``model`` or ``params`` table from ``given`` checked against the declaration: every
        key declared, each value of its default's type (an integer where a float is declared is
        taken as the float), and with ``partial`` the missing keys filled from the defaults."""
        declared = self.model if kind == "model" else self.params
        if not isinstance(given, Mapping):
            raise ConfigError(f"{kind}: expected a table, got {given!r}")
        values: dict[str, Any] = {}
        for key, value in given.items():
            if key not in declared:
                valid = ", ".join(sorted(declared)) or "none: this task declares no " + (
                    "model sizes" if kind == "model" else "hyper-parameters of its own"
                )
                where = f"{kind}.{key}" if kind == "model" else key
                hint = did_you_mean(key, declared)
                raise ConfigError(f"{where}: unknown {_noun(kind)} for this task{hint} (valid: {valid})")
            values[key] = coerce_like(f"{kind}.{key}" if kind == "model" else key, value, declared[key])
        for key, default in declared.items():
            if key not in values:
                if not partial:
                    raise ConfigError(f"{kind}.{key}: missing" if kind == "model" else f"{key}: missing")
                values[key] = default
        return Table(values, where=kind)


def _noun(kind: str) -> str:
    return "size" if kind == "model" else "config key"


def coerce_like(key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of ``default`` (bool, int, float, str or a list)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, list | tuple):
        ok = isinstance(value, list | tuple)
    else:
        ok = False
    if not ok:
        raise ConfigError(
            f"{key}: expected {type(default).__name__} like the default {default!r}, got {value!r}"
        )
    return _freeze(key, value)


__all__ = ["Declaration", "Scalar", "Table", "coerce_like"]
