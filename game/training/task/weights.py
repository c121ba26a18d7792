"""Initial weights a task fine-tunes from: reading them, their digest, and putting them in a model.

Why a digest of the values and not of the file: the same weights saved as ``.safetensors`` or as a
``torch.save`` file, or as float32 or float64, must bind the same task, and a single changed value
must not (issue 43: "changing one byte of the initial weights changes the spec hash"). The digest
covers each tensor's name, shape and values as float64 (integer tensors as int64), in sorted name
order. Leaf 0 of such a task is these weights rounded onto the task's grid
(:mod:`game.training.state.checkpoint`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from game.errors import ConfigError
from game.training.task.inputs import Digest

#: Prefix of a weights digest (its format).
WEIGHTS_FORMAT = b"vgame-weights-v1\0"


def load(source: Mapping[str, Any] | str | Path) -> dict[str, Tensor]:
    """The weights a task gives: a ``state_dict`` as is, or read from a ``.safetensors`` or
    ``.pt``/``.pth`` file (``torch.load`` with ``weights_only=True``: no code runs)."""
    if isinstance(source, Mapping):
        out = dict(source)
    else:
        p = Path(source)
        if not p.is_file():
            raise ConfigError(f"init_weights {p}: no such file")
        try:
            if p.suffix == ".safetensors":
                from safetensors.torch import load_file

                out = dict(load_file(str(p)))
            elif p.suffix in (".pt", ".pth", ".bin"):
                loaded = torch.load(p, map_location="cpu", weights_only=True)
                if not isinstance(loaded, Mapping):
                    raise ConfigError(f"init_weights {p}: expected a state_dict, got {type(loaded).__name__}")
                out = dict(loaded)
            else:
                raise ConfigError(f"init_weights {p}: a .safetensors or .pt file (or give a state_dict)")
        except OSError as exc:
            raise ConfigError(f"init_weights {p}: {exc.strerror or exc}") from exc
    for name, t in out.items():
        if not isinstance(name, str) or not isinstance(t, Tensor):
            raise ConfigError(f"init_weights: {name!r} is not a tensor")
    if not out:
        raise ConfigError("init_weights: no tensors")
    return out


def digest(source: Mapping[str, Any] | str | Path) -> Digest:
    """The digest of the weights' values (module docstring: why not the file's bytes)."""
    tensors = load(source)
    h = hashlib.sha256(WEIGHTS_FORMAT)
    for name in sorted(tensors):
        t = tensors[name].detach().cpu()
        t = t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64)
        head = f"{name}|{tuple(t.shape)}".encode()
        h.update(len(head).to_bytes(4, "little") + head)
        h.update(t.contiguous().numpy().astype("<f8" if t.dtype == torch.float64 else "<i8").tobytes())
    return Digest("state_dict", h.hexdigest(), {"tensors": len(tensors)})


@torch.no_grad()
def apply(model: nn.Module, source: Mapping[str, Any] | str | Path, *, strict: bool) -> None:
    """Load the weights into ``model`` (whose float tensors are float64): every tensor they hold
    must exist in the model with its shape; with ``strict`` every tensor of the model's state must
    be given (ConfigError listing what is missing or extra)."""
    given = load(source)
    own = model.state_dict()
    extra = sorted(set(given) - set(own))
    missing = sorted(set(own) - set(given))
    if extra:
        raise ConfigError(
            f"init_weights: the model has no {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )
    if strict and missing:
        raise ConfigError(
            f"init_weights: no values for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
            "(pass init_strict=False to keep the model's own initialisation for them)"
        )
    for name, t in given.items():
        target = own[name]
        if tuple(t.shape) != tuple(target.shape):
            raise ConfigError(
                f"init_weights: {name} has shape {tuple(t.shape)}, the model's is {tuple(target.shape)}"
            )
        target.copy_(t.to(target.dtype))


def save(weights: Mapping[str, Tensor], path: Path) -> bytes:
    """The bytes of ``weights`` in the format ``path``'s suffix names: ``.safetensors``, else a
    ``torch.save`` file. Tied tensors are written once each name (a copy apiece)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        return bytes(save({n: t.contiguous().clone() for n, t in weights.items()}))
    import io

    buf = io.BytesIO()
    torch.save(dict(weights), buf)
    return buf.getvalue()


__all__ = ["WEIGHTS_FORMAT", "apply", "digest", "load", "save"]
