"""An optimizer's per-parameter state as the committed tensors, and back.

Why: a step commits the optimizer's ``state`` (the moments, a step count) so that a judge re-runs
any step in an optimizer built afresh with it loaded. torch's optimizers keep tensors there; an
optimizer of the task's own often keeps a Python number (``state["step"] += 1``, as most written
before torch's own do), and L-BFGS keeps lists of tensors (its curvature pairs) and numbers. Each
entry is committed under ``optim/<param name>/<key>``:

* a tensor as it is (any shape: Adafactor keeps a matrix's second moments as a row and a column);
* a number (int, float, bool) as ``<key>#number``, a tensor of numbers (:mod:`.numbers`);
* a list or tuple of tensors (``None`` among them) as ``<key>#list``, the numbers (its length,
  then whether each place holds a tensor), and ``<key>#<i>`` for the tensor at place ``i``.

``None`` is not committed (SGD without momentum keeps ``momentum_buffer = None``); anything else is
refused naming the entry. :func:`decode` turns the tensors of one parameter back into its entries.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from game.errors import CheckpointError, ConfigError
from game.training.state import numbers

#: The suffix of an entry that is a Python number.
NUMBER = "#number"
#: The suffix of an entry that is a list (or tuple) of tensors: its length and which places hold one.
LIST = "#list"


def encode(owner: str, pname: str, entries: dict[str, Any], kept: dict[str, Tensor]) -> dict[str, Tensor]:
    """One parameter's entries as committed tensors by name (``owner``: the optimizer's class
    name, for a refusal); numbers' tensors are kept in ``kept`` (:func:`.numbers.kept`)."""
    out: dict[str, Tensor] = {}
    at = f"optim/{pname}/"
    for key, value in entries.items():
        if value is None:
            continue
        if isinstance(value, Tensor):
            out[at + key] = value
            continue
        rows = numbers.rows(value) if isinstance(value, (bool, int, float)) else None
        if rows is not None:
            out[at + key + NUMBER] = numbers.kept(kept, at + key + NUMBER, rows)
            continue
        if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, Tensor) for v in value):
            shape = [numbers.row(len(value))] + [numbers.row(v is not None) for v in value]
            out[at + key + LIST] = numbers.kept(kept, at + key + LIST, shape)  # type: ignore[arg-type]
            out.update({f"{at}{key}#{i}": v for i, v in enumerate(value) if v is not None})
            continue
        raise ConfigError(
            f"Task.optimizer: {owner} keeps {pname}/{key} in its state as a {type(value).__name__}: a step "
            "commits an optimizer's per-parameter state as tensors, numbers and lists of tensors, so keep "
            "it as one of those"
        )
    return out


def decode(name: str, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """One parameter's committed tensors (by key, as :func:`encode` named them) as its entries;
    CheckpointError where they do not fit together (``name``: the parameter's, for the error)."""
    out: dict[str, Any] = {}
    places: dict[str, dict[int, Tensor]] = {}
    for key, t in tensors.items():
        if key.endswith(NUMBER):
            got = numbers.values(t)
            if len(got) != 1:
                raise CheckpointError(f"optim/{name}/{key}: {len(got)} numbers where the optimizer keeps one")
            out[key[: -len(NUMBER)]] = got[0]
        elif not key.endswith(LIST) and "#" in key and key.rpartition("#")[2].isdigit():
            base, _, i = key.rpartition("#")
            places.setdefault(base, {})[int(i)] = t
        elif not key.endswith(LIST):
            out[key] = t
    for key, t in tensors.items():
        if not key.endswith(LIST):
            continue
        base = key[: -len(LIST)]
        length, *present = numbers.values(t)
        held = places.pop(base, {})
        if len(present) != length or sorted(held) != [i for i, p in enumerate(present) if p]:
            raise CheckpointError(f"optim/{name}/{base}: the list's places do not fit its tensors")
        out[base] = [held.get(i) for i in range(length)]
    if places:
        raise CheckpointError(f"optim/{name}/{sorted(places)[0]}: a list's tensor without its list")
    return out


#: The dtypes a loaded state tensor is given back (the committed bytes tell them from float64).
_KEPT = (torch.float16, torch.bfloat16)


def keep_dtypes(loaded: dict[str, Any], committed: dict[str, Any]) -> None:
    """Give each half or bfloat16 tensor of one parameter's ``loaded`` state back its dtype.

    Why: torch's ``load_state_dict`` casts floating state to its parameter's dtype, and an
    optimizer that keeps its moments leaner than its parameters (``zeros_like(p,
    dtype=torch.bfloat16)``) stepped on float64 ones once loaded: a judge's re-run, or an audit
    from a checkpoint, computed another step than the trainer's. The values come back exactly (a
    narrower float widens without loss), so the cast back is exact too. A float32 tensor is left
    to torch: the committed bytes write float64 as float32 (``canonical.DTYPE_TAGS``), so its
    dtype there says nothing, and a step computes the same on either (float32 ops are widened)."""
    for key, want in committed.items():
        have = loaded.get(key)
        if isinstance(want, Tensor) and isinstance(have, Tensor):
            loaded[key] = _narrowed(have, want)
        elif isinstance(want, list) and isinstance(have, list):
            loaded[key] = [
                _narrowed(h, w) if isinstance(h, Tensor) and isinstance(w, Tensor) else h
                for h, w in zip(have, want, strict=True)
            ]


def _narrowed(have: Tensor, want: Tensor) -> Tensor:
    return have.to(want.dtype) if want.dtype in _KEPT and have.dtype != want.dtype else have


__all__ = ["LIST", "NUMBER", "decode", "encode", "keep_dtypes"]
