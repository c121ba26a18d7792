"""Checks that a data key reached no output: no command prints it (a terminal's scrollback, a
captured log or CI output would keep it)."""

from __future__ import annotations

import base64
import re


def _forms(key: bytes) -> list[bytes]:
    """The key as a command could print it: hex (either case, any 8 bytes of it: half a key is a
    key too), base64 (standard and URL-safe, with and without padding) and the raw bytes."""
    hexes = [key.hex().encode(), key.hex().upper().encode()]
    pieces = [h[i : i + 16] for h in hexes for i in range(len(h) - 15)]
    b64 = [base64.b64encode(key), base64.urlsafe_b64encode(key)]
    return [key, *pieces, *b64, *(b.rstrip(b"=") for b in b64)]


def assert_key_absent(output: str | bytes, key: bytes, what: str = "the output") -> None:
    """Fail when any form of ``key`` is in ``output``, also once its whitespace is removed (a long
    line wrapped at the terminal's width breaks a printed key in two)."""
    data = output.encode("utf-8", "surrogateescape") if isinstance(output, str) else output
    squeezed = re.sub(rb"\s+", b"", data)
    for form in _forms(key):
        assert form not in data and form not in squeezed, f"the data key is in {what}: {data[-2000:]!r}"
