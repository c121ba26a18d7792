"""Helpers shared by the game tests: the store's sealing and packing in memory.

The product seals a directory as it packs it (``publish_directory``) and opens a blob member by
member (``SealedArchive``, ``fetch_directory``); these whole-buffer forms of the same code make
blobs and plain archives for the tests to tamper with and compare.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import BinaryIO

from game.store import sealing
from game.store.archive import _pack_to


def seal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Encrypt and authenticate all of ``src`` for ``purpose`` under ``key`` into ``dst`` (v2)."""
    writer = sealing._SealingWriter(key, dst, purpose)
    shutil.copyfileobj(src, writer, sealing.SEGMENT)  # read at call time: tests shrink it
    writer.finish()


def unseal_stream(key: bytes, src: BinaryIO, dst: BinaryIO, purpose: bytes) -> None:
    """Decrypt a sealed blob from ``src`` into ``dst``; a wrong key, another purpose, any modified,
    missing or added byte is a :class:`StoreError`. What reached ``dst`` before such an error is not
    to be used: it is authentic only once this returns."""
    for part in sealing._plain_segments(key, src, purpose):
        dst.write(part)


def seal(key: bytes, plaintext: bytes, purpose: bytes) -> bytes:
    """:func:`seal_stream` in memory."""
    out = io.BytesIO()
    seal_stream(key, io.BytesIO(plaintext), out, purpose)
    return out.getvalue()


def unseal(key: bytes, blob: bytes, purpose: bytes) -> bytes:
    """:func:`unseal_stream` in memory."""
    out = io.BytesIO()
    unseal_stream(key, io.BytesIO(blob), out, purpose)
    return out.getvalue()


def pack_directory(src: Path) -> bytes:
    """The deterministic tar ``publish_directory`` seals, in memory."""
    buf = io.BytesIO()
    _pack_to(src, buf)
    return buf.getvalue()
