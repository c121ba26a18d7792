"""A model wrapped with adapters (PEFT's LoRA and kin) read by its base model's names, so that
``init_weights`` fine-tunes it from the base model's checkpoint.

Why: the training people buy is mostly a pretrained model fine-tuned with LoRA. PEFT's
``get_peft_model`` renames every tensor it wraps: GPT-2's ``transformer.h.0.attn.c_attn.weight``
becomes ``base_model.model.transformer.h.0.attn.c_attn.base_layer.weight``, beside the new
``...c_attn.lora_A.default.weight``. A base checkpoint given as ``init_weights`` then fitted none of
the model's names and was refused. Outside vgame one loads the base model first and wraps it after;
here the factory builds the wrapped model and vgame puts the weights in, so the names are mapped
back: what the weights fill is decided by the wrapped model's own structure, not by guessing from
names (a module holding a ``base_layer`` and listing its ``adapter_layer_names`` is a tuner layer; one
holding an ``original_module`` and a ``modules_to_save`` dict keeps a trainable copy of a module,
both filled from the checkpoint, as PEFT copies the module when it wraps it). The adapters' own
tensors, and whatever the wrapper holds beside its base model (prompt tuning's virtual tokens, VeRA's
shared projections), are not in a base checkpoint: they keep the initialisation the factory gave
them (PEFT's LoRA: ``lora_B`` zero, so the wrapped model starts as its base), even with
``init_strict``.

A fine-tune that goes on from an adapter PEFT saved (``save_pretrained``'s
``adapter_model.safetensors``, given beside the base checkpoint) has its tensors named as PEFT
saves them (``...c_attn.lora_A.weight``, a kept module's trainable copy by its base name):
:func:`saved_names` places them by PEFT's own ``get_peft_model_state_dict``, which names the live
tensors as a save would.

Nothing else here imports PEFT: a model is read by duck typing, so a hand-written adapter that keeps
PEFT's layout is read alike, and a model without wrappers has no renamed tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from game.training.dispatch.provisional import PEFT_FROM_BASE


@dataclass
class Unwrapped:
    """A wrapped model's state names read as its base model's."""

    #: each base name (a checkpoint's) -> the model's state names holding that tensor (two for a
    #: module kept with a trainable copy)
    names: dict[str, list[str]] = field(default_factory=dict)
    #: the model's state names that are adapters' own (in no base checkpoint)
    adapters: set[str] = field(default_factory=set)
    #: the base model inside the wrapper (its ``base_model_prefix`` fits a headless checkpoint)
    base: nn.Module | None = None

    @property
    def wrapped(self) -> bool:
        """Whether any name differs from its base name."""
        return bool(self.adapters) or any(own != [base] for base, own in self.names.items())


def _wrappers(model: nn.Module) -> tuple[dict[str, int], set[str], str, nn.Module | None]:
    """What to take out of a state name: each wrapper's own segments, by their full path, with how
    many they are (``base_layer``, ``original_module``: one; ``modules_to_save.<adapter>``: two),
    the adapters' module paths, and the base model inside the wrapper (PEFT's), with its path
    (``base_model.model``; '' and None if none)."""
    drop: dict[str, int] = {}
    adapters: set[str] = set()
    for path, m in model.named_modules():
        at = f"{path}." if path else ""
        layer_names = getattr(m, "adapter_layer_names", None)
        if isinstance(getattr(m, "base_layer", None), nn.Module) and isinstance(layer_names, tuple):
            drop[f"{at}base_layer"] = 1
            # its adapters, and what else it holds for them (VeRA's shared projections)
            held = (*layer_names, *getattr(m, "other_param_names", ()))
            adapters.update(f"{at}{n}" for n in held if isinstance(n, str))
        kept = getattr(m, "modules_to_save", None)
        if isinstance(getattr(m, "original_module", None), nn.Module) and isinstance(kept, nn.ModuleDict):
            drop[f"{at}original_module"] = 1
            drop.update((f"{at}modules_to_save.{adapter}", 2) for adapter in kept)
    prefix, inner = "", None
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and hasattr(model, "peft_config"):
        inner = get_base()
        prefix = next((p for p, m in model.named_modules() if m is inner and p), "")
    return drop, adapters, prefix, inner if prefix else None


def _base_name(name: str, drop: dict[str, int], prefix: str) -> str:
    """``name`` with the wrappers' own segments and the base model's path taken out."""
    parts = name.split(".")
    kept: list[str] = []
    i = 0
    while i < len(parts):
        own = next((k for k in (2, 1) if drop.get(".".join(parts[: i + k])) == k), 0)
        if not own:
            kept.append(parts[i])
        i += max(own, 1)
    base = ".".join(kept)
    return base[len(prefix) + 1 :] if prefix and base.startswith(f"{prefix}.") else base


#: ``init_lora_weights`` values (as they begin) by which PEFT computes the adapters from the base
#: model's weights or from data (:data:`~game.training.dispatch.provisional.PEFT_FROM_BASE`).
FROM_BASE = tuple(PEFT_FROM_BASE)


def initialised_from_base(model: nn.Module) -> str | None:
    """How a PEFT model's adapter is computed from the base model's weights, which the factory
    had before ``init_weights`` replaced them: an ``init_lora_weights`` of :data:`FROM_BASE`, or
    DoRA (its magnitudes are the base weights' norms); None if no adapter is."""
    configs = getattr(model, "peft_config", None)
    for config in configs.values() if isinstance(configs, dict) else ():
        how = getattr(config, "init_lora_weights", None)
        if isinstance(how, str) and how.lower().startswith(FROM_BASE):
            return f"init_lora_weights={how!r}"
        if getattr(config, "use_dora", False) is True:
            return "use_dora=True"
    return None


def _under(name: str, paths: set[str]) -> bool:
    """Whether the state name ``name`` lies under one of the module ``paths``: each of its dotted
    prefixes looked up (not every path tested against every name: a 7B model's LoRA has hundreds
    of each)."""
    at = name.find(".")
    while at > 0:
        if name[:at] in paths:
            return True
        at = name.find(".", at + 1)
    return False


def unwrapped(model: nn.Module, state: Mapping[str, Any]) -> Unwrapped:
    """The model's state (``model.state_dict(keep_vars=True)``) read by its base model's names
    (module docstring)."""
    drop, adapter_paths, prefix, inner = _wrappers(model)
    out = Unwrapped(base=inner)
    if not drop and not prefix:
        out.names = {n: [n] for n in state}
        return out
    held = {n for n in state if _under(n, adapter_paths)}
    base = (
        {id(t) for n, t in state.items() if n.startswith(f"{prefix}.") and n not in held} if prefix else set()
    )
    for name, t in state.items():
        # a tuner layer's adapters, and whatever the wrapper holds beside its base model (prompt
        # tuning's virtual tokens, VeRA's shared projections), unless it is a base tensor under a
        # second name (prompt tuning's word embeddings: the base model's, tied)
        beside = bool(prefix) and not name.startswith(f"{prefix}.") and id(t) not in base
        if name in held or beside:
            out.adapters.add(name)
        elif name.startswith(f"{prefix}.") or not prefix:
            out.names.setdefault(_base_name(name, drop, prefix), []).append(name)
    return out


def saved_names(model: nn.Module, state: Mapping[str, Any]) -> dict[str, list[str]]:
    """For a PEFT model, the names its active adapter's tensors have in a file PEFT saved
    (``save_pretrained``), each with the model's state names (``state``, kept as variables) holding
    that tensor; empty for any other model. Why PEFT's function and not a rule here: PEFT renames
    as it saves in more than one way (``lora_A.default.weight`` -> ``lora_A.weight``,
    ``lora_magnitude_vector.default.weight`` -> ``lora_magnitude_vector``, a kept module's
    ``modules_to_save.default.weight`` -> ``weight``), and its own function is the one its loader
    undoes. A tensor PEFT computes only to save it (prompt tuning's ``prompt_embeddings``) is held
    by no state name and left out."""
    if not isinstance(getattr(model, "peft_config", None), dict):
        return {}
    from peft import get_peft_model_state_dict  # a PEFT model: PEFT is installed

    adapter = getattr(model, "active_adapter", "default")
    saved = get_peft_model_state_dict(
        model, state_dict=dict(state), adapter_name=adapter if isinstance(adapter, str) else "default",
        save_embedding_layers=False,
    )  # fmt: skip
    holders: dict[int, list[str]] = {}
    for name, t in state.items():
        holders.setdefault(id(t), []).append(name)
    return {key: holders[id(t)] for key, t in saved.items() if id(t) in holders}


__all__ = ["FROM_BASE", "Unwrapped", "initialised_from_base", "saved_names", "unwrapped"]
