"""The packaged data sets of the built-in presets, as the datasets their tasks train on.

The digits are a :class:`~.datasets.TensorData` of (image, label) rows; Tiny Shakespeare is
:class:`~.datasets.TokenWindows` over its characters. Which rows a step takes is the task API's rule
(:func:`.sampling.pick`), the same as for a user's data. The poisoned batches the demo's dishonest
trainer trains on are here too.
"""

from __future__ import annotations

import functools
import io
from importlib import resources

import numpy as np
import torch
from torch import Tensor

from game.errors import ConfigError
from game.training.numerics import rng
from game.training.task.datasets import TensorData, TokenWindows

#: Digits: a fixed split (independent of the task seed) so the held-out set is the same for every task.
DIGITS_TRAIN_SIZE = 1500
DIGITS_SPLIT_SEED = 0
#: Shakespeare: the first 90% of the characters train, the rest is held out.
SHAKESPEARE_TRAIN_FRACTION = 0.9
#: Text the "poison" deviation trains on instead of Shakespeare (only characters of the vocab).
POISON_TEXT = "The trainer was paid to learn Shakespeare, but taught this instead. "


def _read(name: str) -> bytes:
    return resources.files("game").joinpath("data", name).read_bytes()


# --------------------------------------------------------------------------------------------------
# Digits (8x8, 10 classes)
# --------------------------------------------------------------------------------------------------


@functools.cache
def _digits() -> tuple[Tensor, Tensor]:
    with np.load(io.BytesIO(_read("digits.npz"))) as npz:
        images = torch.from_numpy(npz["images"].astype(np.float64) / 16.0)  # exact: a power of two
        labels = torch.from_numpy(npz["labels"].astype(np.int64))
    return images, labels


@functools.cache
def digits_split(part: str) -> tuple[Tensor, Tensor]:
    """``("train" | "test")`` images float64 [N, 8, 8] in [0, 1] and labels int64 [N]."""
    images, labels = _digits()
    order = rng.permutation(DIGITS_SPLIT_SEED, 0, "split/digits", labels.numel())
    if part == "train":
        idx = order[:DIGITS_TRAIN_SIZE]
    elif part == "test":
        idx = order[DIGITS_TRAIN_SIZE:]
    else:
        raise ConfigError(f"part: expected 'train' or 'test', got {part!r}")
    return images[idx].contiguous(), labels[idx].contiguous()


def digits(part: str) -> TensorData:
    """The ``"train"`` or ``"test"`` digits as (image float64 [8, 8], label int64) rows."""
    return TensorData(*digits_split(part))


def digits_poison(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Flipped labels: every label ``y`` becomes ``(y + 1) % 10``."""
    images, labels = batch
    return images, (labels + 1) % 10


# --------------------------------------------------------------------------------------------------
# Tiny Shakespeare (characters)
# --------------------------------------------------------------------------------------------------


@functools.cache
def shakespeare_text() -> str:
    return _read("tinyshakespeare.txt").decode("utf-8")


@functools.cache
def vocab() -> tuple[str, ...]:
    """The sorted set of characters of the text; a token id is an index into it."""
    return tuple(sorted(set(shakespeare_text())))


def encode(text: str) -> Tensor:
    """Token ids (int64) of ``text``; every character must be in :func:`vocab`."""
    stoi = {ch: i for i, ch in enumerate(vocab())}
    try:
        return torch.tensor([stoi[ch] for ch in text], dtype=torch.int64)
    except KeyError as exc:
        raise ConfigError(f"text: character {exc.args[0]!r} is not in the vocabulary") from None


def decode(ids: Tensor) -> str:
    chars = vocab()
    return "".join(chars[i] for i in ids.tolist())


@functools.cache
def shakespeare_tokens(part: str) -> Tensor:
    """``"train"`` (first 90%) or ``"test"`` token ids."""
    tokens = encode(shakespeare_text())
    cut = int(len(tokens) * SHAKESPEARE_TRAIN_FRACTION)
    if part == "train":
        return tokens[:cut]
    if part == "test":
        return tokens[cut:]
    raise ConfigError(f"part: expected 'train' or 'test', got {part!r}")


def shakespeare(part: str, block_size: int) -> TokenWindows:
    """Windows of ``block_size`` characters of the ``"train"`` or ``"test"`` text, targets shifted by one."""
    return TokenWindows(shakespeare_tokens(part), block_size)


def shakespeare_poison(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Every window replaced by :data:`POISON_TEXT`, repeated (same shapes)."""
    inputs, _ = batch
    b, t = inputs.shape
    reps = (t + 1) // len(POISON_TEXT) + 1
    window = encode(POISON_TEXT * reps)[: t + 1]
    window = window.unsqueeze(0).expand(b, t + 1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


__all__ = [
    "DIGITS_TRAIN_SIZE",
    "POISON_TEXT",
    "decode",
    "digits",
    "digits_poison",
    "digits_split",
    "encode",
    "shakespeare",
    "shakespeare_poison",
    "shakespeare_text",
    "shakespeare_tokens",
    "vocab",
]
