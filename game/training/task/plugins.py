"""Finding a task by name: a built-in preset, an import path (``mypkg.tasks:build``) or an entry
point (group ``vgame.tasks``), and the digest of the code it comes from.

Why here and not in each command: every party (trainer, auditor, judge, client) and every command
(`vgame train`, `audit`, `replay-step`, `calibrate`, `node`, `task model`) reads a task from its
config, so each must find the same code the same way, with no wrapper script that registers it
first. A task that is missing or fails to load is one :class:`PluginError` that says what was
tried and what went wrong.

The code digest binds the task's code into the spec hash: the files of the top-level package the
task's module belongs to (every ``*.py`` under it, by relative path), or the module's own file
when it is a lone module. A model, dataset or loss that lives in that package is bound; code
elsewhere is bound only through the library versions the task declares (``Task.libraries``).

No torch here: importing a task's module may import torch, but this module does not.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from game.errors import ConfigError
from game.training.task.catalog import PRESET_NAMES
from game.training.task.inputs import Digest

#: The entry-point group a package registers its tasks under: ``[project.entry-points."vgame.tasks"]``.
ENTRY_POINT_GROUP = "vgame.tasks"

#: Prefix of the code digest (its format): bumped if what is hashed changes.
CODE_FORMAT = b"vgame-code-v1\0"

_lock = threading.Lock()
_loaded: dict[str, Loaded] = {}


class PluginError(ConfigError):
    """A task named by import path or entry point cannot be found or fails to load."""


@dataclass(frozen=True)
class Loaded:
    """A task's factory as found, with where it came from and the digest of its code."""

    name: str  # as the config names it
    target: str  # "module:attribute"
    factory: Any  # a game.training.task.api.TaskFactory (checked by the caller)
    code: Digest


def is_plugin_name(name: str) -> bool:
    """Whether ``name`` names a task by import path (it has a ``:``); else it is a preset or an entry point."""
    return ":" in name


def entry_point_target(name: str) -> str | None:
    """The ``module:attribute`` an installed package registers as task ``name``, or None."""
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return str(ep.value)
    return None


def entry_point_names() -> list[str]:
    """Every task name installed packages register (for error messages and `vgame profiles`)."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def extend_search_path(*directories: Path) -> None:
    """Let imports find modules in ``directories`` too, after what ``sys.path`` finds: a task beside
    its config file, or in the current directory. They stay on the path: a task's module may import
    more of its package later, inside a step."""
    for d in directories:
        entry = str(d.resolve())
        if entry not in sys.path:
            sys.path.append(entry)


def load(name: str, *, search: tuple[Path, ...] = ()) -> Loaded:
    """The task factory ``name`` names: ``module:attribute`` or an entry point's name.

    The module is imported once a process (a second load returns the same factory); ``search``
    adds directories to look in (the config file's; the current directory is always looked in,
    as ``python -m`` does). Raises :class:`PluginError` with what was tried."""
    with _lock:
        found = _loaded.get(name)
        if found is not None:
            return found
        target, module_name, attr = _target(name)
        extend_search_path(*search, Path.cwd())
        module = _import(name, module_name)
        obj: Any = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise PluginError(f"task {name!r}: module {module_name} has no attribute {attr!r}") from None
        found = Loaded(name, target, obj, code_digest(module_name))
        _loaded[name] = found
        return found


def check_recorded_code(name: str, recorded: Digest | None, *, search: tuple[Path, ...] = ()) -> None:
    """Hold the code task ``name`` would import here to ``recorded``, the code digest its spec was
    recorded with, *before* importing it; raises :class:`PluginError` naming both where they differ.

    Why: a recorded config is held to the task's spec hash before it is loaded, but loading imports
    whatever module of the task's name the search path finds first. Another package of that name
    (planted in the working directory, an older version installed) ran its code at import, and only
    the spec hash computed afterwards refused it. The digest is worked out from the files as
    :func:`load` would find them (``importlib.util.find_spec`` runs no code of the package). A task
    already loaded in this process is not imported again; the caller's spec hash check holds it."""
    if name in _loaded:
        return
    _, module_name, _ = _target(name)
    extend_search_path(*search, Path.cwd())
    if recorded is None:
        raise PluginError(
            f"task {name!r}: its spec was recorded with no task code, yet it names module {module_name}: "
            "not imported"
        )
    here = code_digest(module_name)
    if (here.kind, here.sha256) != (recorded.kind, recorded.sha256):
        raise PluginError(
            f"task {name!r}: the code found here is not the code its spec was recorded with, so it is "
            f"not imported (install, or put on the search path, the task's own package): task code: "
            f"the task's is {recorded.describe()}, here it is {here.describe()}"
        )


def _target(name: str) -> tuple[str, str, str]:
    """``(target, module, attribute)`` of task ``name``: its import path, or an entry point's."""
    target = name if is_plugin_name(name) else entry_point_target(name)
    if target is None:
        installed = entry_point_names()
        raise PluginError(
            f"task {name!r}: not a built-in preset ({', '.join(PRESET_NAMES)}), not an import path "
            f"(module:attribute) and no installed package registers it under the entry-point group "
            f"{ENTRY_POINT_GROUP!r}" + (f" (registered: {', '.join(installed)})" if installed else "")
        )
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PluginError(f"task {name!r}: expected module:attribute, e.g. mypkg.tasks:build")
    return target, module_name, attr


def _import(name: str, module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise PluginError(
                f"task {name!r}: no module named {exc.name!r} (install the task's package, put it on "
                "PYTHONPATH, or run from the directory that holds it; a config file's own directory "
                "is searched too)"
            ) from None
        raise PluginError(f"task {name!r}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:  # the task's own code failed: say so in one line, keep the cause
        raise PluginError(
            f"task {name!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc


def code_digest(module_name: str) -> Digest:
    """The digest of the code ``module_name`` comes from: its top-level package's ``*.py`` files,
    or its own file when it is a lone module (module docstring: why)."""
    top = module_name.partition(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise PluginError(f"module {top!r} has no source file to bind (a namespace or built-in module?)")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every source file under its directory
        root = origin.parent
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        kind = "package"
    else:
        root, files, kind = origin.parent, [origin], "module"
    h = hashlib.sha256(CODE_FORMAT)
    for path in files:
        rel = path.relative_to(root).as_posix().encode("utf-8")
        data = path.read_bytes()
        h.update(len(rel).to_bytes(4, "little") + rel + len(data).to_bytes(8, "little"))
        h.update(data)
    return Digest(kind, h.hexdigest(), {"name": top, "files": len(files)})


def library_versions(dists: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Installed versions of the distributions a task declares (``Task.libraries``)."""
    out: dict[str, str] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise ConfigError(f"libraries: {dist!r} is not installed here") from None
    return out


__all__ = [
    "CODE_FORMAT",
    "ENTRY_POINT_GROUP",
    "Loaded",
    "PluginError",
    "check_recorded_code",
    "code_digest",
    "entry_point_names",
    "entry_point_target",
    "extend_search_path",
    "is_plugin_name",
    "library_versions",
    "load",
]
