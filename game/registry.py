"""One type for every table of named things a user picks by name: :class:`Registry`.

Why: scenarios, auditor strategies, trainer deviations, hardware profiles and presets are each
chosen by a string (a CLI option, a config key), and each look-up had its own dict, its own
``try: ... except KeyError`` and its own wording of the error. A registry keeps the order the
entries were given in (the order ``--help`` lists them) and refuses an unknown name with a
:class:`~game.errors.ConfigError` that lists the valid ones. No torch here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from game.errors import ConfigError

T = TypeVar("T")

#: the default wording of an unknown name; ``{where}`` is ``"<where>: "`` or empty
UNKNOWN = "{where}unknown {kind} {name!r}; valid: {valid}"


def did_you_mean(name: object, valid: Iterable[str]) -> str:
    """`` (did you mean 'steps'?)`` when ``name`` is a near miss of one valid name, else ``""``:
    a mistyped key or option is the commonest bad input, and a list of twenty names hides the one
    meant."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    """Named entries of one kind, in a fixed order; :meth:`get` refuses an unknown name.

    ``kind`` names the entries in the error (``"scenario"``); ``where`` is the config key or option
    the name came from, put before the error (``"profile"`` gives ``profile: unknown profile ...``);
    ``unknown`` rewords the error (fields ``where``, ``kind``, ``name`` and ``valid``).
    """

    def __init__(
        self,
        kind: str,
        entries: Mapping[str, T] | Iterable[tuple[str, T]],
        *,
        where: str | None = None,
        unknown: str = UNKNOWN,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, T] = dict(entries)
        self._where = f"{where}: " if where else ""
        self._unknown = unknown

    def get(self, name: str) -> T:
        """The entry called ``name``, or a ConfigError listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            message = self._unknown.format(
                where=self._where, kind=self.kind, name=name, valid=", ".join(self._entries)
            )
            raise ConfigError(message + did_you_mean(name, self._entries)) from None

    def names(self) -> tuple[str, ...]:
        """Every name, in the order given."""
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """Every ``(name, entry)``, in the order given."""
        return list(self._entries.items())

    def values(self) -> list[T]:
        """Every entry, in the order given."""
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
