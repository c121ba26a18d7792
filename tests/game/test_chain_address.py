"""Addresses as people type them: any case taken, a mistyped checksum refused before any transaction."""

from __future__ import annotations

import pytest
from eth_utils import to_checksum_address
from hypothesis import given
from hypothesis import strategies as st

from game.chain.address import checked_address
from game.errors import ConfigError

ADDRESSES = st.binary(min_size=20, max_size=20).map(lambda b: to_checksum_address("0x" + b.hex()))


def _case_flipped(address: str, at: int) -> str | None:
    """``address`` with the case of its ``at``-th letter flipped (None when it has no letters)."""
    letters = [i for i, ch in enumerate(address) if i >= 2 and ch.isalpha()]
    if not letters:
        return None
    i = letters[at % len(letters)]
    return address[:i] + address[i].swapcase() + address[i + 1 :]


@given(ADDRESSES)
def test_anyCaseWithoutAChecksum_isTakenAsWritten(address: str) -> None:
    assert checked_address(address) == address
    assert checked_address(address.lower()) == address
    assert checked_address("0x" + address[2:].upper()) == address


@given(ADDRESSES, st.integers(min_value=0, max_value=39))
def test_oneLetterOfAChecksummedAddressInTheOtherCase_isRefused(address: str, at: int) -> None:
    typo = _case_flipped(address, at)
    digits = (typo or "")[2:]
    if typo is None or digits in (digits.lower(), digits.upper()):
        return  # no letters, or the flip left it in one case: no checksum to fail
    with pytest.raises(ConfigError, match=r"--trainer 0x\w+ fails its checksum"):
        checked_address(typo, "--trainer")


@pytest.mark.parametrize("text", ["", "0x", "0x12", "0x" + "g" * 40, "1" * 42, "0x" + "00" * 21])
def test_notAnAddress_saysSo(text: str) -> None:
    with pytest.raises(ConfigError, match="is not an address"):
        checked_address(text, "--judge")
