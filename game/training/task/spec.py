"""The spec hash's bytes: a task's config and inputs as canonical JSON.

Why a module of its own: the bytes are computed from a loaded :class:`~.config.TaskConfig`, and,
for a config someone else recorded (a transcript's manifest), from its plain dicts *before* it is
loaded: loading imports the module the config's ``task`` names, and nobody's transcript may make
an auditor, a judge or a client import a module of its choosing. One rule, two callers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from game.errors import ConfigError

#: Bumped whenever the meaning or layout of the canonical JSON changes, including what computation a
#: config stands for: v3 runs the optimizers as foreach ops, whose rounding log differs from v2's;
#: v4 commits to leaves of format ``vgame-leaf-v2`` (``leafhash.py``: chunked, so a GPU computes
#: them in parallel), where v3's were ``sha256(canonical bytes)``.
#: v5 binds the task's inputs (data, initial weights, code, libraries: ``inputs``) and names the
#: task by ``task`` (a preset or a user's), with ``accumulate`` and ``clip_grad_norm``.
#: v6 logs an op under its name in ``optable.LOG_NAMES`` (the backward of indexing: one name whichever
#: interceptor records it; v5's logs named it two ways) and rounds an inexact op on float32 tensors by
#: way of its float64 twin (``dispatch/widen.py``; v5 refused it).
SPEC_FORMAT = "vgame-task-v6"


def canonical_spec(config: Mapping[str, Any], inputs: Mapping[str, Any]) -> bytes:
    """The bytes the spec hash covers: a task's config (:meth:`TaskConfig.to_dict`) and inputs
    (:meth:`~.inputs.Inputs.to_dict`) as JSON with sorted keys, no whitespace, floats as Python repr.

    Python's float repr is the shortest string that round-trips, identical on every platform. A
    function of plain dicts, so that a recorded config someone else wrote is held to a known spec
    hash before it is loaded (:func:`recorded_spec_hash`): loading imports its task's module.
    """
    doc = {"format": SPEC_FORMAT, "config": config, "inputs": inputs}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def recorded_spec_hash(config: Mapping[str, Any], inputs: Mapping[str, Any]) -> bytes:
    """The spec hash of a config and inputs as someone recorded them (a transcript's manifest),
    computed without loading anything: what an honest record hashes to once loaded. A record that
    does not parse as JSON of the canonical kind raises :class:`ConfigError`."""
    try:
        return hashlib.sha256(canonical_spec(config, inputs)).digest()
    except (TypeError, ValueError) as exc:  # not JSON-able, a NaN: no config of ours
        raise ConfigError(f"the recorded config is not canonical JSON ({exc})") from None


__all__ = ["SPEC_FORMAT", "canonical_spec", "recorded_spec_hash"]
