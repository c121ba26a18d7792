"""The one registry type: look-ups by name, the order kept, an unknown name refused with the valid ones."""

from __future__ import annotations

import pytest

from game.errors import ConfigError
from game.registry import Registry, did_you_mean


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


def test_get_nearMiss_namesTheOneMeant_andAFarNameOnlyTheList() -> None:
    reg = Registry("profile", {"cpu-1t": 0, "cpu-2t": 1, "noisy": 2}, where="profile")
    with pytest.raises(ConfigError) as err:
        reg.get("noisey")
    assert (
        str(err.value)
        == "profile: unknown profile 'noisey'; valid: cpu-1t, cpu-2t, noisy (did you mean 'noisy'?)"
    )
    with pytest.raises(ConfigError) as far:
        reg.get("h100")
    assert str(far.value) == "profile: unknown profile 'h100'; valid: cpu-1t, cpu-2t, noisy"


def test_didYouMean_takesTheClosestName_andNothingForANonString() -> None:
    assert did_you_mean("n_layers", ["n_head", "n_layer", "n_embd"]) == " (did you mean 'n_layer'?)"
    assert did_you_mean("step", ["steps", "seed"]) == " (did you mean 'steps'?)"
    assert did_you_mean("optimiser", ["optimizer", "lr"]) == " (did you mean 'optimizer'?)"
    assert did_you_mean("batch", ["lr", "seed"]) == ""
    assert did_you_mean(3, ["3"]) == ""
