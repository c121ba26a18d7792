"""The one registry type: look-ups by name, the order kept, an unknown name refused with the valid ones."""

from __future__ import annotations

import pytest

from game.errors import ConfigError
from game.registry import Registry


def test_get_returnsTheEntry_andNamesItemsValues_keepTheOrderGiven() -> None:
    reg = Registry("colour", [("red", 1), ("green", 2), ("blue", 3)])
    assert reg.get("green") == 2
    assert reg.names() == ("red", "green", "blue")
    assert reg.items() == [("red", 1), ("green", 2), ("blue", 3)]
    assert reg.values() == [1, 2, 3]
    assert list(reg) == ["red", "green", "blue"] and len(reg) == 3
    assert "red" in reg and "pink" not in reg


def test_get_unknownName_isAConfigErrorListingTheValidNames() -> None:
    reg = Registry("colour", {"red": 1, "green": 2})
    with pytest.raises(ConfigError) as err:
        reg.get("pink")
    assert str(err.value) == "unknown colour 'pink'; valid: red, green"


def test_get_unknownName_saysWhereTheNameCameFrom_andTakesItsOwnWording() -> None:
    with pytest.raises(ConfigError) as err:
        Registry("profile", {"cpu": 0}, where="profile").get("gpu")
    assert str(err.value) == "profile: unknown profile 'gpu'; valid: cpu"
    worded = Registry("auditor strategy", {"honest": 0}, unknown="{kind} {name!r} is not one of {valid}")
    with pytest.raises(ConfigError, match=r"^auditor strategy 'sly' is not one of honest$"):
        worded.get("sly")
