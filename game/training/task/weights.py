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
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from game.errors import ConfigError
from game.training.dispatch.provisional import PEFT_FROM_BASE_FIX
from game.training.task import adapters
from game.training.task.inputs import Digest

log = logging.getLogger(__name__)

#: Prefix of a weights digest (its format).
WEIGHTS_FORMAT = b"vgame-weights-v1\0"


#: What a model directory holds its weights in, as Hugging Face's ``save_pretrained`` writes them:
#: one file, or an index of shards (a model over its shard size), looked for in this order; then
#: what PEFT's ``save_pretrained`` writes, an adapter alone.
DIRECTORY_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)

#: One source of initial weights: a ``state_dict``, or a file or directory holding one.
Source = Mapping[str, Any] | str | Path
#: What ``Task.init_weights`` takes: one source, or several (a base checkpoint and an adapter).
Sources = Source | list[Source] | tuple[Source, ...]


def load(source: Sources) -> dict[str, Tensor]:
    """The weights a task gives: a ``state_dict`` as is, or read from a ``.safetensors`` or
    ``.pt``/``.pth``/``.bin`` file (``torch.load`` with ``weights_only=True``: no code runs), a
    shard index (``*.index.json``, its ``weight_map`` naming each tensor's shard beside it), or a
    model directory holding one of :data:`DIRECTORY_FILES` (a Hugging Face checkpoint, sharded or
    not, or a PEFT adapter); or a list of such sources, their tensors together (a base model's
    checkpoint and an adapter PEFT saved for it), each name given once."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ConfigError("init_weights: an empty list of sources")
        out: dict[str, Tensor] = {}
        for one in source:
            got = load(one)
            twice = sorted(set(out) & set(got))
            if twice:
                raise ConfigError(
                    f"init_weights: {', '.join(twice[:5])} given by two of the sources (each name once)"
                )
            out.update(got)
        return out
    if isinstance(source, Mapping):
        out = dict(source)
    else:
        p = Path(source)
        if p.is_dir():
            found = next((p / n for n in DIRECTORY_FILES if (p / n).is_file()), None)
            if found is None:
                raise ConfigError(f"init_weights {p}: a directory with none of {', '.join(DIRECTORY_FILES)}")
            p = found
        if not p.is_file():
            raise ConfigError(f"init_weights {p}: no such file")
        out = _sharded(p) if p.name.endswith(".index.json") else _file(p)
    for name, t in out.items():
        if not isinstance(name, str) or not isinstance(t, Tensor):
            raise ConfigError(f"init_weights: {name!r} is not a tensor")
    if not out:
        raise ConfigError("init_weights: no tensors")
    return out


def _file(p: Path) -> dict[str, Tensor]:
    """The tensors of one ``.safetensors`` or ``torch.save`` file."""
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(p)))
        if p.suffix in (".pt", ".pth", ".bin"):
            loaded = torch.load(p, map_location="cpu", weights_only=True)
            if not isinstance(loaded, Mapping):
                raise ConfigError(f"init_weights {p}: expected a state_dict, got {type(loaded).__name__}")
            return dict(loaded)
    except OSError as exc:
        raise ConfigError(f"init_weights {p}: {exc.strerror or exc}") from exc
    raise ConfigError(
        f"init_weights {p}: a .safetensors or .pt file, a shard index or a model directory (or give a state_dict)"
    )


def _sharded(index: Path) -> dict[str, Tensor]:
    """The tensors a shard index names, each from the shard its ``weight_map`` gives: a file in
    the index's own directory (a name that leads elsewhere is refused)."""
    try:
        weight_map = json.loads(index.read_text("utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"init_weights {index}: not a shard index with a weight_map ({exc!r})") from None
    if not isinstance(weight_map, Mapping) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(f"init_weights {index}: its weight_map is not names of shard files")
    out: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or shard in (".", ".."):
            raise ConfigError(f"init_weights {index}: shard {shard!r} is not a file beside the index")
        path = index.parent / shard
        if not path.is_file():
            raise ConfigError(f"init_weights {index}: its shard {shard} is missing")
        tensors = _file(path)
        wanted = [n for n, s in weight_map.items() if s == shard]
        lacking = [n for n in wanted if n not in tensors]
        if lacking:
            raise ConfigError(f"init_weights {index}: shard {shard} lacks {', '.join(lacking[:5])}")
        out.update((n, tensors[n]) for n in wanted)
    return out


def digest(source: Sources) -> Digest:
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
def apply(model: nn.Module, source: Sources, *, strict: bool) -> None:
    """Load the weights into ``model`` (whose float tensors are float64): every tensor they hold
    must exist in the model with its shape, or, for a vocabulary's tensors, fewer rows (the first
    rows are given: :func:`_vocabulary_tensors`) (names fitted to a Hugging Face model's base-model
    prefix where that makes them fit: :func:`_fitted`; a model wrapped with adapters, PEFT's LoRA,
    read by its base model's names, and an adapter PEFT saved by the names it saves under:
    :mod:`~game.training.task.adapters`); with ``strict`` every tensor of the model's state but the
    adapters' own must be given (ConfigError listing what is missing or extra)."""
    own = model.state_dict(keep_vars=True)
    loaded = load(source)
    # a model wrapped with adapters (PEFT's LoRA) is read by its base model's names, unless the
    # weights name its own tensors (an earlier run of the wrapped model); an adapter PEFT saved
    # goes to the tensors it was saved from
    view = adapters.unwrapped(model, own)
    saved: dict[str, list[str]] = {}
    if all(n in own for n in loaded) or not view.wrapped:
        view = adapters.Unwrapped({n: [n] for n in own})
    else:
        saved = adapters.saved_names(model, own)
    from_adapter = {k: t for k, t in loaded.items() if k in saved and k not in view.names}
    loaded = {k: t for k, t in loaded.items() if k not in from_adapter}
    base = view.base if view.base is not None else model
    given = _fitted(loaded, view.names, getattr(base, "base_model_prefix", ""))
    extra = sorted(set(given) - set(view.names))
    targets = {n: given[b] for b in given if b in view.names for n in view.names[b]}
    # after the base's: a kept module's trainable copy takes the adapter's values
    targets.update((n, t) for k, t in from_adapter.items() for n in saved[k])
    if view.adapters - set(targets) and (how := adapters.initialised_from_base(model)) is not None:
        raise ConfigError(f"init_weights: the model's adapters use {how}: {PEFT_FROM_BASE_FIX}")
    # a tensor the model ties to a given one (an output layer sharing the input embedding, which a
    # Hugging Face checkpoint stores once) is given with it
    tied = {id(own[n]) for n in targets}
    lacking = {n for n in set(own) - set(targets) - view.adapters if id(own[n]) not in tied}
    # said by the names the weights would give them (a wrapped model's base names)
    said = {n: b for b, names in view.names.items() for n in names}
    missing = sorted({said.get(n, n) for n in lacking})
    if extra:
        raise ConfigError(
            f"init_weights: the model has no {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )
    if strict and missing:
        raise ConfigError(
            f"init_weights: no values for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
            "(pass init_strict=False to keep the model's own initialisation for them)"
        )
    if view.adapters - set(targets):
        log.info(
            "init_weights: the model's %d adapter tensors (%s ...) keep the factory's initialisation",
            len(view.adapters), min(view.adapters),
        )  # fmt: skip
    vocabulary = _vocabulary_tensors(model)
    for name, t in targets.items():
        target = own[name]
        if tuple(t.shape) == tuple(target.shape):
            target.data.copy_(t.to(target.dtype))
        elif (
            id(target) in vocabulary
            and t.dim() >= 1
            and t.shape[1:] == target.shape[1:]
            and t.shape[0] < target.shape[0]
        ):
            target.data[: t.shape[0]].copy_(t.to(target.dtype))
            log.info(
                "init_weights: %s gives %d of the model's %d rows; the %d added (a vocabulary grown in "
                "the model's factory) keep the model's own initialisation",
                name, t.shape[0], target.shape[0], target.shape[0] - t.shape[0],
            )  # fmt: skip
        else:
            raise ConfigError(
                f"init_weights: {name} has shape {tuple(t.shape)}, the model's is {tuple(target.shape)}"
            )


def _vocabulary_tensors(model: nn.Module) -> set[int]:
    """The ids of the tensors a grown vocabulary adds rows to: every ``nn.Embedding``'s weight and a
    Hugging Face model's output embedding (weight and bias). Why: fine-tuning with special tokens
    added (``resize_token_embeddings`` in the factory) gives the checkpoint's rows, fewer than the
    model's, which ``from_pretrained`` then resizing keeps, the added rows initialised anew."""
    found = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    output = getattr(model, "get_output_embeddings", None)
    head = output() if callable(output) else None
    for attr in ("weight", "bias"):
        t = getattr(head, attr, None)
        if isinstance(t, Tensor):
            found.add(id(t))
    return found


def _fitted(given: dict[str, Tensor], own: Mapping[str, Any], prefix: Any) -> dict[str, Tensor]:
    """``given`` with its names fitted to a Hugging Face model's, as ``from_pretrained`` fits them: a
    base model's checkpoint (``bert.``-less names) given to a model with a head gains the model's
    ``base_model_prefix``, and a checkpoint with the prefix given to the base model loses it, when
    that makes every name one of the model's; else ``given`` as it is."""
    if not isinstance(prefix, str) or not prefix or all(n in own for n in given):
        return given
    dotted = f"{prefix}."
    for rename in (lambda n: dotted + n, lambda n: n.removeprefix(dotted)):
        fitted = {rename(n): t for n, t in given.items()}
        if len(fitted) == len(given) and all(n in own for n in fitted):
            return fitted
    return given


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


__all__ = ["DIRECTORY_FILES", "WEIGHTS_FORMAT", "apply", "digest", "load", "save"]
