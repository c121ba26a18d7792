"""Addresses as people type them: any case accepted, a mistyped checksum refused.

Why: an address in mixed case carries an EIP-55 checksum. Normalising it without checking (as
``to_checksum_address`` does) would turn a one-character typo in ``--trainer`` into a task whose
payment and bond go to an account nobody holds. All lower or all upper case carries no checksum,
and is taken as written, the way wallets and ethers' ``getAddress`` take it.
"""

from __future__ import annotations

from eth_typing import ChecksumAddress
from eth_utils import is_checksum_address, is_hex_address, to_checksum_address

from game.errors import ConfigError


def checked_address(value: str, what: str = "address") -> ChecksumAddress:
    """``value`` in checksum form; :class:`ConfigError` naming ``what`` if it is no address or its
    mixed case fails the checksum."""
    if not isinstance(value, str) or not is_hex_address(value):
        raise ConfigError(f"{what} {value!r} is not an address (0x followed by 40 hex digits)")
    digits = value[2:]
    if digits != digits.lower() and digits != digits.upper() and not is_checksum_address(value):
        raise ConfigError(
            f"{what} {value} fails its checksum (EIP-55): a character was mistyped or its case "
            "changed; copy the address again"
        )
    return to_checksum_address(value)


__all__ = ["checked_address"]
