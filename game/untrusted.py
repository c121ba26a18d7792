"""JSON that someone else wrote (a trainer's manifest, a config left for the judge), parsed safely.

Why: importing web3's ``py_ecc`` raises Python's recursion limit to 100,000, and the C JSON decoder
recurses once per nesting level, so a document of a few hundred kilobytes of brackets overflowed
the C stack and killed the process (a segmentation fault, not an exception): an auditor or a judge
that read such a manifest died again on every restart. Our documents nest a few levels deep;
anything deeper than :data:`MAX_DEPTH` is refused before the decoder sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: The deepest nesting of arrays and objects accepted (a manifest nests about five levels).
MAX_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def nesting(data: bytes) -> int:
    """How deep the arrays and objects of the JSON text ``data`` nest (brackets inside strings
    not counted)."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b'""', data))
    depth = deepest = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(data: bytes | str) -> Any:
    """``json.loads`` of someone else's document; :class:`json.JSONDecodeError` (a ValueError)
    for one nested deeper than :data:`MAX_DEPTH`, as for one that does not parse."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if nesting(raw) > MAX_DEPTH:
        raise json.JSONDecodeError(
            f"nested deeper than {MAX_DEPTH} levels", raw.decode("utf-8", "replace")[:80], 0
        )
    return json.loads(raw)


__all__ = ["MAX_DEPTH", "loads", "nesting"]
