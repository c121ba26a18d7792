"""The C++ dispatch front (``front.cpp``): RoundingMode's interception without a Python call per op.

Why: a ``TorchDispatchMode`` costs some 9 us of Python for each of the ~480 ATen ops of a
gpt-shakespeare step, a third of a plain float64 step, and half of those ops round nothing. The
front is a C++ fallback below autograd: ops that round nothing run without Python, and an op that
rounds calls :meth:`RoundingMode._front_op` once with the float64 tensors it produced or changed.
Classes, logs and errors stay with the Python code in :mod:`game.training.intercept`, so a step
gives the same bits, log and counters either way (tests/training/test_front.py holds them to it).

The mode uses the front on CPU profiles that emulate nothing (:meth:`Profile.interceptor`), in
every rounding mode and log format, unless a subclass changes ``__torch_dispatch__``. It is
compiled with torch's C++ extension builder (a C++ compiler and ``ninja``) the first time it is
needed, into the kernels' cache directory, keyed by the source, torch and Python; ``python -m
game.training.native.front`` builds it ahead (``make setup`` does). Where it cannot be built, with
``VGAME_NATIVE=0`` or ``VGAME_FRONT=0``, or inside :func:`disabled`, the Python mode runs instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from game.training import native

log = logging.getLogger(__name__)

#: Kinds the C++ side knows (``front.cpp``'s ``Kind``): the three classes, then the conditional ops
#: whose class it works out from the arguments, as ``intercept._conditional_class`` does.
MOVE, EXACT, INEXACT, ALPHA, DIV, ACCUMULATE = range(6)

#: Set to ``0`` to keep the Python dispatch mode (``VGAME_NATIVE=0`` also does).
ENV_SWITCH = "VGAME_FRONT"

_lock = threading.Lock()
_module: Any = None
_tried = False
#: ``with front.disabled():`` runs the Python dispatch mode inside.
disabled = native.OffSwitch()


def _source() -> bytes:
    return resources.files(__package__).joinpath("front.cpp").read_bytes()


def build_dir() -> Path:
    """Where the compiled front is kept: keyed by its source, torch, Python and the platform."""
    tag = "|".join([torch.__version__, sys.version, platform.machine(), platform.system()]).encode()
    return native.cache_dir() / f"front-{hashlib.sha256(_source() + tag).hexdigest()[:16]}"


def _build() -> Any:
    from torch.utils import cpp_extension  # imports setuptools: only when building or loading

    where = build_dir()
    where.mkdir(parents=True, exist_ok=True)
    src = where / "front.cpp"
    if not src.exists() or src.read_bytes() != _source():
        tmp = where / f"front.cpp.{os.getpid()}"
        tmp.write_bytes(_source())
        os.replace(tmp, src)
    if not any(where.glob("*.so")):
        log.warning("compiling the C++ dispatch front into %s (once, about a minute)", where)
    return cpp_extension.load(
        name=f"vgame_front_{where.name.removeprefix('front-')}",
        sources=[str(src)],
        build_directory=str(where),
        extra_cflags=["-O2"],
        verbose=False,
    )


def load() -> Any:
    """The compiled module, building it if need be; None where it cannot be had (logged once)."""
    global _module, _tried
    with _lock:
        if _tried:
            return _module
        _tried = True
        if os.environ.get(native.ENV_SWITCH, "1") == "0" or os.environ.get(ENV_SWITCH, "1") == "0":
            return None
        try:
            _module = _build()
        except Exception as exc:  # no compiler, no ninja, no headers, a key taken by another library
            log.warning("C++ dispatch front unavailable (%s): the Python dispatch mode runs instead", exc)
            _module = None
        return _module


def available() -> bool:
    """Whether the mode may use the front here: it loads, and not inside :func:`disabled`."""
    return not disabled.off and load() is not None


def enter(
    plan_for: Callable[[str, str], tuple[int, int, int, list[int], list[int], int]], on_op: Any
) -> None:
    """Switch the front on for this thread; ``plan_for`` gives an op's row the first time the front
    meets it, ``on_op(id, class, tensors)`` rounds an op's float64 tensors."""
    _module.enter(plan_for, on_op)


def leave() -> list[tuple[int, int]]:
    """Switch it off; the (row id, class) of each op's first call since :func:`enter`, in call order."""
    calls: list[tuple[int, int]] = _module.leave()
    return calls


def active() -> bool:
    """Whether the front is on in this thread (never after a step, whatever the step raised)."""
    return _module is not None and bool(_module.active())


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Ops inside do not reach the front (what ``_disable_current_modes`` does for the Python mode)."""
    if _module is None or not _module.active():
        yield
        return
    before = _module.set_included(False)
    try:
        yield
    finally:
        _module.set_included(before)


def main() -> None:
    """Build the front ahead of its first use (``make setup`` does). Without it the Python mode
    runs, with the same results: that is said, not an error."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load() is None:
        print("no C++ dispatch front here: the Python dispatch mode will run (same results, slower)")
    else:
        print(f"C++ dispatch front ready in {build_dir()}")


if __name__ == "__main__":
    main()
