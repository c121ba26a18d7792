"""The packaged data sets and the batch for each step.

Batches are a pure function of (seed, step, batch size): batch row ``i`` of step ``s`` holds the
example with global id ``(s - 1) * batch_size + i``, and which data item that example is comes from
``rng.randbelow`` keyed by (seed, step, "data", example id). Sampling is *with replacement* (each
example an independent draw), so an example's content never depends on the others in its batch,
on the batch layout or on the epoch boundaries.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
from torch import Tensor

from game.errors import ConfigError
from game.training.numerics import rng

#: Digits: a fixed split (independent of the task seed) so the held-out set is the same for every task.
DIGITS_TRAIN_SIZE = 1500
DIGITS_SPLIT_SEED = 0
#: Shakespeare: the first 90% of the characters train, the rest is held out.
SHAKESPEARE_TRAIN_FRACTION = 0.9
#: Text the "poison" deviation trains on instead of Shakespeare (only characters of the vocab).
POISON_TEXT = "The trainer was paid to learn Shakespeare, but taught this instead. "


@dataclass(frozen=True)
class Batch:
    """One step's batch. ``example_ids`` are the global ids that key the step's randomness."""

    inputs: Tensor  # digits: float64 [B, 8, 8] in [0, 1]; shakespeare: int64 [B, T] token ids
    targets: Tensor  # digits: int64 [B] labels; shakespeare: int64 [B, T] next-token ids
    example_ids: Tensor  # int64 [B]

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device`` (the engine moves batches; presets build them on CPU)."""
        return Batch(self.inputs.to(device), self.targets.to(device), self.example_ids.to(device))

    def __len__(self) -> int:
        return int(self.example_ids.numel())


def _read(name: str) -> bytes:
    return resources.files("game").joinpath("data", name).read_bytes()


def example_ids(step: int, batch_size: int) -> Tensor:
    """Global ids of step ``step``'s examples (steps start at 1)."""
    if step < 1:
        raise ConfigError(f"step: batches exist for steps >= 1, got {step}")
    return torch.arange(batch_size, dtype=torch.int64) + (step - 1) * batch_size


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


def digits_batch(seed: int, step: int, batch_size: int) -> Batch:
    """Step ``step``'s digits batch, drawn with replacement from the train split."""
    images, labels = digits_split("train")
    ids = example_ids(step, batch_size)
    pick = rng.randbelow(seed, step, "data", ids, (), labels.numel())
    return Batch(images[pick], labels[pick], ids)


def digits_eval_batch(size: int) -> Batch:
    """The first ``size`` held-out digits (for reporting progress; never trained on)."""
    images, labels = digits_split("test")
    size = min(size, labels.numel())
    return Batch(images[:size], labels[:size], torch.arange(size, dtype=torch.int64))


def digits_poison(batch: Batch) -> Batch:
    """Flipped labels: every label ``y`` becomes ``(y + 1) % 10``."""
    return Batch(batch.inputs, (batch.targets + 1) % 10, batch.example_ids)


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


def shakespeare_batch(seed: int, step: int, batch_size: int, block_size: int) -> Batch:
    """Windows of ``block_size`` characters at keyed random offsets; targets are shifted by one."""
    tokens = shakespeare_tokens("train")
    ids = example_ids(step, batch_size)
    start = rng.randbelow(seed, step, "data", ids, (), tokens.numel() - block_size)
    window = tokens[start.unsqueeze(1) + torch.arange(block_size + 1, dtype=torch.int64)]
    return Batch(window[:, :-1].contiguous(), window[:, 1:].contiguous(), ids)


def shakespeare_eval_batch(size: int, block_size: int) -> Batch:
    """``size`` held-out windows at evenly spaced offsets of the test text (for reporting progress)."""
    tokens = shakespeare_tokens("test")
    span = tokens.numel() - block_size - 1
    start = torch.arange(size, dtype=torch.int64) * span // max(size, 1)
    window = tokens[start.unsqueeze(1) + torch.arange(block_size + 1, dtype=torch.int64)]
    return Batch(
        window[:, :-1].contiguous(), window[:, 1:].contiguous(), torch.arange(size, dtype=torch.int64)
    )


def shakespeare_poison(batch: Batch) -> Batch:
    """Every window replaced by :data:`POISON_TEXT`, repeated (same ids, same shapes)."""
    b, t = batch.inputs.shape
    reps = (t + 1) // len(POISON_TEXT) + 1
    window = encode(POISON_TEXT * reps)[: t + 1]
    window = window.unsqueeze(0).expand(b, t + 1)
    return Batch(window[:, :-1].contiguous(), window[:, 1:].contiguous(), batch.example_ids)


__all__ = [
    "DIGITS_TRAIN_SIZE",
    "POISON_TEXT",
    "Batch",
    "decode",
    "digits_batch",
    "digits_eval_batch",
    "digits_poison",
    "digits_split",
    "encode",
    "example_ids",
    "shakespeare_batch",
    "shakespeare_eval_batch",
    "shakespeare_poison",
    "shakespeare_text",
    "shakespeare_tokens",
    "vocab",
]
