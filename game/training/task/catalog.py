"""The presets' catalog: each preset's model sizes (one frozen dataclass per family), data file and
config defaults. What the config layer knows of a preset without torch (the models themselves are
built in :mod:`.presets`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, ClassVar

from game.errors import ConfigError
from game.registry import Registry
from game.training.task.declaration import Declaration

# --------------------------------------------------------------------------------------------------
# Model sizes, one frozen dataclass per preset family
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MLPShape:
    """Sizes of the digits MLP (64 -> hidden -> hidden -> 10)."""

    kind: ClassVar[str] = "mlp"
    hidden: int = 64  # width of both hidden layers

    def validate(self) -> None:
        check_int_range("model.hidden", self.hidden, 1, 1 << 16)


#: Architectures of the cnn-digits preset: its own small conv net, and a CIFAR-style ResNet-50.
CNN_ARCHS = ("small", "resnet50")

#: ``channels`` when left at 0 (its default): per arch. 64 gives ResNet-50's real widths.
CNN_DEFAULT_CHANNELS = {"small": 16, "resnet50": 64}

#: Field metadata: a field added after specs were posted; left out of the canonical form while it
#: holds its default, so the spec hash of every config written before it existed is unchanged.
OMIT_IF_DEFAULT = {"omit_if_default": True}


@dataclass(frozen=True)
class CNNShape:
    """Sizes of the digits conv net.

    ``arch = "small"``: conv -> BN -> ReLU -> pool, twice, then a hidden linear layer and the head.
    ``arch = "resnet50"``: ResNet-50 (bottleneck blocks [3, 4, 6, 3]) on the digits upsampled to
    32x32, CIFAR-style; ``channels`` is the stem width (stage widths 1, 2, 4, 8 times it, outputs 4x
    that: 64 gives the real 64/256/512/1024/2048) and ``hidden`` is unused (the head is one linear
    layer on the pooled 32 * channels features).
    """

    kind: ClassVar[str] = "cnn"
    channels: int = 0  # small: first conv (the second has twice as many); resnet50: stem width; 0: per arch
    hidden: int = 64  # small: hidden linear layer before the 10-way head; resnet50: unused
    arch: str = field(default="small", metadata=OMIT_IF_DEFAULT)  # one of CNN_ARCHS

    def __post_init__(self) -> None:
        if self.channels == 0 and self.arch in CNN_DEFAULT_CHANNELS:
            object.__setattr__(self, "channels", CNN_DEFAULT_CHANNELS[self.arch])

    def validate(self) -> None:
        if self.arch not in CNN_ARCHS:
            raise ConfigError(f"model.arch: {self.arch!r} is not one of {', '.join(CNN_ARCHS)}")
        check_int_range("model.channels", self.channels, 1, 1 << 12)
        check_int_range("model.hidden", self.hidden, 1, 1 << 16)


@dataclass(frozen=True)
class GPTShape:
    """Sizes of the character-level GPT (nanoGPT-like, untied head)."""

    kind: ClassVar[str] = "gpt"
    n_layer: int = 2  # transformer blocks
    n_head: int = 2  # attention heads per block
    n_embd: int = 64  # residual width; must be divisible by n_head
    block_size: int = 32  # context length in characters

    def validate(self) -> None:
        check_int_range("model.n_layer", self.n_layer, 1, 256)
        check_int_range("model.n_head", self.n_head, 1, 256)
        check_int_range("model.n_embd", self.n_embd, 1, 1 << 16)
        check_int_range("model.block_size", self.block_size, 1, 1 << 16)
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd: {self.n_embd} is not divisible by model.n_head = {self.n_head}")


ModelShape = MLPShape | CNNShape | GPTShape


# --------------------------------------------------------------------------------------------------
# Presets: which data file and which defaults each one has
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PresetInfo:
    """What the config layer knows about a preset (the models live in ``presets.py``)."""

    dataset: str  # file name under game/data/
    shape: type[MLPShape] | type[CNNShape] | type[GPTShape]
    defaults: Mapping[str, Any]  # TaskConfig field defaults that differ from the class defaults

    @property
    def declaration(self) -> Declaration:
        """The preset's declaration, as a user's task makes one (:mod:`.declaration`)."""
        return Declaration(defaults=self.defaults, shape=self.shape, data_file=self.dataset)


PRESET_INFO: Registry[PresetInfo] = Registry(
    "preset",
    {
        "mlp-digits": PresetInfo(
            dataset="digits.npz",
            shape=MLPShape,
            defaults={"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "dropout": 0.0},
        ),
        "cnn-digits": PresetInfo(
            dataset="digits.npz",
            shape=CNNShape,
            defaults={"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "dropout": 0.1},
        ),
        "gpt-shakespeare": PresetInfo(
            dataset="tinyshakespeare.txt",
            shape=GPTShape,
            defaults={
                "optimizer": "adamw",
                "lr": 1e-3,
                "momentum": 0.0,
                "weight_decay": 0.1,
                "dropout": 0.1,
                "batch_size": 8,
            },
        ),
    },
    where="preset",
)

PRESET_NAMES: tuple[str, ...] = PRESET_INFO.names()


def preset_info(name: str) -> PresetInfo:
    """The preset's info, or a ConfigError listing the valid names."""
    return PRESET_INFO.get(name)


@functools.cache
def dataset_sha256(filename: str) -> str:
    """Hex SHA-256 of a packaged data file (part of the spec: other data is another task)."""
    data = resources.files("game").joinpath("data", filename).read_bytes()
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------
# The config


def check_int_range(key: str, value: Any, lo: int, hi: int) -> None:
    """ConfigError naming ``key`` unless ``value`` is an integer in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{key}: {value} is outside {lo}..{hi}")


__all__ = [
    "CNN_ARCHS",
    "CNN_DEFAULT_CHANNELS",
    "OMIT_IF_DEFAULT",
    "PRESET_INFO",
    "PRESET_NAMES",
    "CNNShape",
    "GPTShape",
    "MLPShape",
    "ModelShape",
    "PresetInfo",
    "check_int_range",
    "dataset_sha256",
    "preset_info",
]
