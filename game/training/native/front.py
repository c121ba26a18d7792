"""The C++ dispatch front (``front.cpp``): building and loading it; the session's calls are in
:mod:`game.training.dispatch.front`.

Why: a ``TorchDispatchMode`` costs some 9 us of Python for each of the ~480 ATen ops of a
gpt-shakespeare step, a third of a plain float64 step, and half of those ops round nothing. The
front is a C++ fallback below autograd: ops that round nothing run without Python, and an op that
rounds hands the float64 tensors it produced or changed to the C kernels itself where the mode
would (:class:`~game.training.dispatch.front.Kernels`), or else calls the mode once with them. Classes,
log records, counters and errors are the Python code's in :mod:`game.training.dispatch`, so a
step gives the same bits, log and counters either way (tests/training/test_front.py holds them to
it).

The mode uses the front on profiles that emulate nothing (:meth:`Profile.interceptor`), on CPU
and on a GPU, in every rounding mode and log format, unless a subclass changes
``__torch_dispatch__``. A GPU step's session is shared with autograd's device thread, which runs
its backward pass (``front.cpp`` says how). It is compiled with torch's C++ extension builder (a
C++ compiler and ``ninja``) the first time it is needed, into the kernels' cache directory, keyed
by the source, torch and Python; ``python -m game.training.native.front`` builds it ahead (``make
setup`` does). Where it cannot be built, with
``VGAME_NATIVE=0`` or ``VGAME_FRONT=0``, or inside :func:`disabled`, the Python mode runs instead.

The module also reads tensors' layouts for the state's buffer plan (:func:`layouts`), one call where
Python would read five attributes a tensor.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import platform
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from game.training.native import library

log = logging.getLogger(__name__)

#: Set to ``0`` to keep the Python dispatch mode (``VGAME_NATIVE=0`` also does).
ENV_SWITCH = "VGAME_FRONT"

_lock = threading.Lock()
_module: Any = None
_tried = False
#: ``with front.disabled():`` runs the Python dispatch mode inside.
disabled = library.OffSwitch()


def _source() -> bytes:
    return resources.files(__package__).joinpath("front.cpp").read_bytes()


def build_dir() -> Path:
    """Where the compiled front is kept: keyed by its source, torch, Python and the platform."""
    tag = "|".join([torch.__version__, sys.version, platform.machine(), platform.system()]).encode()
    return library.cache_dir() / f"front-{hashlib.sha256(_source() + tag).hexdigest()[:16]}"


#: The extension's file suffix (``torch.utils.cpp_extension.LIB_EXT``, named here so loading a
#: built front does not import the builder, which imports setuptools).
_LIB_EXT = ".pyd" if sys.platform == "win32" else ".so"


def _build() -> Any:
    """The front's module: the one built for this key, else a fresh build.

    A built front is imported straight from its file, which appears only whole (renamed into place
    once built, as the C kernels are). Why not ``cpp_extension.load`` on the shared directory: it
    takes a lock file there even to find the build up to date, and a process killed while holding
    it (``kill -9`` or a crash during a run's first step) left every later run waiting on that
    file for ever.
    """
    where = build_dir()
    name = f"vgame_front_{where.name.removeprefix('front-')}"
    target = where / f"{name}{_LIB_EXT}"
    if target.exists():
        try:
            return _import(name, target)
        except (ImportError, OSError) as exc:  # a damaged cache entry: build it again
            log.warning("the C++ dispatch front in %s does not load (%s): building it again", where, exc)
    return _compile(name, where, target)


def _import(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(name: str, where: Path, target: Path) -> Any:
    """Build in a directory of this process's own (the builder's lock file and ninja's state stay
    there), then rename the library into place: concurrent first runs each build, none waits on
    another, and a killed build leaves only its temporary directory."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    where.mkdir(parents=True, exist_ok=True)
    log.warning("compiling the C++ dispatch front into %s (once, about a minute)", where)
    with tempfile.TemporaryDirectory(dir=where, prefix=".build-") as tmp:
        src = Path(tmp) / "front.cpp"
        src.write_bytes(_source())
        module = cpp_extension.load(
            name=name, sources=[str(src)], build_directory=tmp, extra_cflags=["-O2"], verbose=False
        )
        os.replace(Path(tmp) / target.name, target)
    return module


def load() -> Any:
    """The compiled module, building it if need be; None where it cannot be had (logged once)."""
    global _module, _tried
    with _lock:
        if _tried:
            return _module
        _tried = True
        if os.environ.get(library.ENV_SWITCH, "1") == "0" or os.environ.get(ENV_SWITCH, "1") == "0":
            return None
        try:
            _module = _build()
        except Exception as exc:  # no compiler, no ninja, no headers, a key taken by another library
            log.warning("C++ dispatch front unavailable (%s): the Python dispatch mode runs instead", exc)
            _module = None
        return _module


def layouts(tensors: Sequence[torch.Tensor]) -> bytes | None:
    """Each tensor's data pointer, dtype, device, contiguity and shape, as bytes (equal bytes: the
    same layouts), in one call; None where the front is not loaded (this builds nothing) or a
    tensor has no data pointer. :func:`disabled` does not apply: this reads, it intercepts nothing."""
    module = _module
    if module is None:
        return None
    try:
        return bytes(module.layouts(list(tensors)))
    except RuntimeError:  # a tensor without storage
        return None


def compiled() -> Any:
    """The loaded module (None before :func:`load` found it; no lock: the session's calls ask)."""
    return _module


def available() -> bool:
    """Whether the mode may use the front here: it loads, and not inside :func:`disabled`."""
    return not disabled.off and load() is not None


def active() -> bool:
    """Whether the front is on in this thread (never after a step, whatever the step raised)."""
    return _module is not None and bool(_module.active())


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Ops inside do not reach the front (what ``_disable_current_modes`` does for the Python mode),
    on any thread that has its key: autograd's device thread has it without a session of its own."""
    if _module is None:
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
