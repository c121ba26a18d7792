"""Data keys: making one, reading one given as text, and the fingerprint printed in its stead.

A data key is what the client hands to trainer, auditor and judge so that they, and only they,
can open a task's blobs (:mod:`game.store.sealing`).
"""

from __future__ import annotations

import hashlib
import secrets

from game.store.sealing import KEY_SIZE, StoreError


def new_key() -> bytes:
    """A fresh random 256-bit data key (the client makes one per task)."""
    return secrets.token_bytes(KEY_SIZE)


def key_fingerprint(key: bytes) -> str:
    """The SHA-256 of a data key, in hex: what a command prints in the key's stead (no command
    prints the key itself, which terminals' scrollback and logs keep), so that a person can tell
    whether two files hold the same task's key; it cannot be turned back into the key."""
    return hashlib.sha256(key).hexdigest()


def parse_key(text: str) -> bytes:
    """Parse a key given as 64 hex characters (optionally 0x-prefixed)."""
    t = text.strip().removeprefix("0x")
    try:
        key = bytes.fromhex(t)
    except ValueError:
        raise StoreError("a data key must be 64 hex characters (256 bits)") from None
    if len(key) != KEY_SIZE:
        raise StoreError(f"a data key must be {KEY_SIZE} bytes (64 hex characters), got {len(key)} bytes")
    return key
