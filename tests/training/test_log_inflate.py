"""A chunk's zlib payload inflated in one C call (``vg_inflate``) or by Python's zlib: the same
bytes, the same refusals in the same words, and a probe that keeps the reader to Python where the
two would differ, without turning the writer's library down."""

from __future__ import annotations

import contextlib
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game.training.log import codec
from game.training.log import inflate as inflate_mod
from game.training.log.codec import Malformed, zlib_blocks
from game.training.log.inflate import Refused, inflate, inflate_python
from game.training.native import writerlib

needs_c = pytest.mark.skipif(not writerlib.available(), reason="the writer's C library is not built here")


def _payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 5, size=size, dtype=np.uint8).tobytes()


#: How a stream may be broken: cut short, bytes after it, a byte changed, or a size stated short.
BREAKS = ["whole", "cut", "trailing", "flipped", "stated short"]


def _broken(body: bytes, size: int, how: str, at: int) -> tuple[bytes, int]:
    at %= len(body)
    if how == "cut":
        return body[:at], size
    if how == "trailing":
        return body + bytes(1 + at % 5), size
    if how == "flipped":
        return body[:at] + bytes([body[at] ^ (1 << at % 8)]) + body[at + 1 :], size
    if how == "stated short":
        return body, max(0, size - 1 - at % 100)
    return body, size


@needs_c
@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    size=st.integers(0, 300_000),
    blocked=st.booleans(),
    how=st.sampled_from(BREAKS),
    at=st.integers(0, 2**31),
)
def test_theCCall_inflatesAndRefusesAsPythonDoes(
    seed: int, size: int, blocked: bool, how: str, at: int
) -> None:
    payload = _payload(seed, size)
    body = zlib_blocks(payload, 1, 1 << 16, 2) if blocked and size else zlib.compress(payload, 6)
    body, stated = _broken(body, size, how, at)
    lib = writerlib.running()
    assert lib is not None
    got = inflate_mod._inflate_c(lib, body, stated + 1)
    assert got == inflate_python(body, stated + 1)
    if how == "whole":
        assert got == payload


@pytest.mark.parametrize("how", BREAKS)
def test_decompress_refusesInTheSameWords_eitherWay(how: str) -> None:
    payload = _payload(3, 50_000)
    body, stated = _broken(zlib.compress(payload), len(payload), how, 1234)
    said = []
    for off in (False, True):  # the C call where it runs, then Python's zlib
        with writerlib.disabled() if off else contextlib.nullcontext():
            try:
                said.append(codec.decompress(body, "zlib", stated))
            except Malformed as exc:
                said.append(str(exc))
    assert said[0] == said[1]
    expected = {
        "whole": payload,
        "cut": "payload truncated or larger than its stated size",
        "trailing": "trailing bytes after the compressed payload",
        "flipped": "corrupt compressed payload: Error -3 while decompressing data",
        "stated short": "payload truncated or larger than its stated size",
    }[how]
    if how == "whole":
        assert said[0] == expected
    else:
        assert isinstance(said[0], str) and isinstance(expected, str) and expected in said[0]


@needs_c
def test_aProbeThatDisagrees_keepsTheReaderToPython_notTheWriter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = inflate_mod._inflate_c

    def counted(*a: object) -> bytes | Refused | None:
        calls.append(1)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(inflate_mod, "_inflate_c", counted)
    monkeypatch.setattr(inflate_mod, "_probed", None)
    body = zlib.compress(b"x" * 1000)
    assert inflate(body, 1001) == b"x" * 1000 and calls  # the probe and the call, in C
    monkeypatch.setattr(inflate_mod, "_agrees", lambda lib: "its inflate differs")
    monkeypatch.setattr(inflate_mod, "_probed", None)
    calls.clear()
    assert inflate(body, 1001) == b"x" * 1000 and not calls  # Python's zlib
    assert writerlib.running() is not None  # the writer still writes in C
