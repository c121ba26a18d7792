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


def key_hash(key: bytes) -> bytes:
    """The SHA-256 of a data key: what a task posts on-chain (``keyHash``), so that the trainer,
    the auditors and the judge each check that the key they were handed is the task's before they
    work with it (a trainer that sealed its transcript under another key was once paid for a
    transcript nobody could open). A 256-bit random key cannot be recovered from its hash."""
    return hashlib.sha256(key).digest()


def key_fingerprint(key: bytes) -> str:
    """The SHA-256 of a data key, in hex (:func:`key_hash`): what a command prints in the key's
    stead (no command prints the key itself, which terminals' scrollback and logs keep), so that a
    person can tell whether two files hold the same task's key; it cannot be turned back into the key."""
    return key_hash(key).hex()


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
