"""The C++ dispatch front (``front.cpp``): RoundingMode's interception without a Python call per op.

Why: a ``TorchDispatchMode`` costs some 9 us of Python for each of the ~480 ATen ops of a
gpt-shakespeare step, a third of a plain float64 step, and half of those ops round nothing. The
front is a C++ fallback below autograd: ops that round nothing run without Python, and an op that
rounds hands the float64 tensors it produced or changed to the C kernels itself where the mode
would (:class:`Kernels`), or else calls :meth:`RoundingMode._front_op` once with them. Classes,
log records, counters and errors are the Python code's in :mod:`game.training.intercept`, so a
step gives the same bits, log and counters either way (tests/training/test_front.py holds them to
it).

The mode uses the front on CPU profiles that emulate nothing (:meth:`Profile.interceptor`), in
every rounding mode and log format, unless a subclass changes ``__torch_dispatch__``. It is
compiled with torch's C++ extension builder (a C++ compiler and ``ninja``) the first time it is
needed, into the kernels' cache directory, keyed by the source, torch and Python; ``python -m
game.training.native.front`` builds it ahead (``make setup`` does). Where it cannot be built, with
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
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

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
        if os.environ.get(native.ENV_SWITCH, "1") == "0" or os.environ.get(ENV_SWITCH, "1") == "0":
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


def available() -> bool:
    """Whether the mode may use the front here: it loads, and not inside :func:`disabled`."""
    return not disabled.off and load() is not None


class SparseEntries(NamedTuple):
    """A sparse chunk to replay, as columns (:meth:`~game.training.log.sparse.SparseStepLog.columns`)."""

    table: torch.Tensor  # (k, 4) int64: op index, name id, value count, entry count, per record
    names: list[str]  # by name id
    positions: torch.Tensor  # flat int64: every record's positions, one record after another


class Kernels(NamedTuple):
    """What the front rounds with the C kernels itself, without a Python call (front.cpp's
    ``Direct``): kernel addresses (0: that work goes to Python), the grid, and for an inexact op
    its band (``bands`` known ahead, ``band_for(row) -> (rel, abs)`` asked once a session past
    them) and the entries to replay."""

    round_inplace: int = 0  # exact ops' tensors
    record: int = 0  # inexact ops' tensors, sparse record
    replay: int = 0  # inexact ops' tensors, sparse replay
    trits_record: int = 0  # inexact ops' tensors, packed record
    trits_replay: int = 0  # inexact ops' tensors, packed replay
    round_nearest: int = 0  # inexact ops' tensors without a log (mode "round")
    k0: int = 0
    max_finite: int = 0
    threshold: int = 0  # the packed log's floor(tau * step) in float64 ulps
    count_free: bool = False
    band_for: Callable[[int], tuple[int, int]] | None = None
    #: the bands of rows 0..n-1 known ahead, as an (n, 2) int64 tensor of (rel, abs): ``band_for``
    #: is asked only for a row past them (each ask takes the GIL in the middle of the step)
    bands: torch.Tensor | None = None
    #: the chunk to replay: a sparse log's as :meth:`SparseStepLog.columns` gives them (as tensors),
    #: a packed log's as (op index, op name, count, trits) per record, in order
    entries: SparseEntries | Sequence[tuple[int, str, int, torch.Tensor]] = ()


#: Log records the front made and Python has not logged yet. In a sparse record, two tensors: a
#: (k, 4) int64 table of (op index, row, count, entries) per record, and every record's positions
#: one after another (flat int64). Otherwise (op index, row, count, trits) per packed record.
Records = tuple[torch.Tensor, torch.Tensor] | list[tuple[int, int, int, torch.Tensor]]


class Left(NamedTuple):
    """What a session did that Python has not seen yet, from :func:`leave`."""

    first_calls: list[tuple[int, int]]  # (row, class) of each op's first call, in call order
    op_index: int  # the step's logged tensors so far; -1: the last on_op call raised, Python's is newer
    cursor: int  # replay records taken so far; -1 as op_index
    records: Records  # not yet logged
    logged: list[int]  # tensors the kernels rounded with the log, by row
    rounded: list[int]  # tensors the kernels rounded without it, by row
    corrections: int
    free: int
    tensors: int  # tensors the kernels took in all


_NO_BANDS = torch.zeros(0, 2, dtype=torch.int64)


def enter(
    plan_for: Callable[[str, str], tuple[int, int, int, list[int], list[int], int, str]],
    on_op: Callable[..., tuple[int, int]],
    kernels: Kernels,
) -> None:
    """Switch the front on for this thread. ``plan_for`` gives an op's row the first time the front
    meets it; ``on_op(row, class, tensors, op index, cursor, records)`` rounds the float64 tensors
    the kernels did not take, after logging ``records`` (the front's, since its last call) and
    taking the op index and replay cursor from it, and returns them as they are after."""
    k = kernels
    _module.enter(
        plan_for, on_op, (k.round_inplace, k.record, k.replay, k.trits_record, k.trits_replay, k.round_nearest), k.k0,
        k.max_finite, k.threshold, k.count_free, k.band_for,
        k.bands if k.bands is not None else _NO_BANDS,
        k.entries if isinstance(k.entries, SparseEntries) else list(k.entries),
    )  # fmt: skip


def leave() -> Left:
    """Switch it off, with what the session did since the last ``on_op`` call."""
    return Left(*_module.leave())


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
