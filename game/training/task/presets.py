"""The built-in presets, written on the public task API (:mod:`.define`) as a user writes a task.

Each preset is a build function ``cfg -> Task``: a model factory, a dataset, a loss, the config's
standard optimizer, a held-out set with its metrics, and the demo's poisoned batch. They are the
API's first users and its examples; the config layer knows their sizes and defaults without torch
(:mod:`.catalog`), and this module pairs each with its build function.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.registry import Registry
from game.training.task import data
from game.training.task.catalog import PRESET_NAMES, CNNShape, GPTShape, MLPShape, preset_info
from game.training.task.config import TaskConfig
from game.training.task.define import Task, TaskFactory
from game.training.task.models import GPT, MLPDigits, cnn_class


def classification_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Mean cross-entropy of ``model(inputs)`` against integer targets (per token for sequences)."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def classification_metrics(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Mapping[str, float]:
    """Held-out loss and accuracy (per token for sequences)."""
    inputs, targets = batch
    logits = model(inputs)
    flat, labels = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    return {
        "loss": float(F.cross_entropy(flat, labels)),
        "accuracy": float((flat.argmax(dim=-1) == labels).to(torch.float64).mean()),
    }


def mlp_digits(cfg: TaskConfig) -> Task:
    """An MLP on the 8x8 digits; SGD with momentum."""
    shape = cfg.model
    assert isinstance(shape, MLPShape)
    return Task(
        model=lambda: MLPDigits(shape),
        dataset=data.digits("train"),
        loss=classification_loss,
        eval_dataset=data.digits("test"),
        metrics=classification_metrics,
        poison=data.digits_poison,
    )


def cnn_digits(cfg: TaskConfig) -> Task:
    """A conv net with BatchNorm and dropout (or a CIFAR-style ResNet-50) on the 8x8 digits; SGD
    with momentum and weight decay."""
    shape = cfg.model
    assert isinstance(shape, CNNShape)
    return Task(
        model=lambda: cnn_class(shape)(shape, cfg.dropout),
        dataset=data.digits("train"),
        loss=classification_loss,
        eval_dataset=data.digits("test"),
        metrics=classification_metrics,
        poison=data.digits_poison,
    )


def gpt_shakespeare(cfg: TaskConfig) -> Task:
    """A character-level GPT on Tiny Shakespeare; AdamW (matrices decayed)."""
    shape = cfg.model
    assert isinstance(shape, GPTShape)
    return Task(
        model=lambda: GPT(shape, len(data.vocab()), cfg.dropout),
        dataset=data.shakespeare("train", shape.block_size),
        loss=classification_loss,
        eval_dataset=data.shakespeare("test", shape.block_size),
        metrics=classification_metrics,
        poison=data.shakespeare_poison,
    )


PRESETS: Registry[TaskFactory] = Registry(
    "preset",
    [
        (name, TaskFactory(build, preset_info(name).declaration))
        for name, build in (
            ("mlp-digits", mlp_digits),
            ("cnn-digits", cnn_digits),
            ("gpt-shakespeare", gpt_shakespeare),
        )
    ],
    where="task",
)
assert PRESETS.names() == PRESET_NAMES


__all__ = [
    "PRESETS",
    "classification_loss",
    "classification_metrics",
    "cnn_digits",
    "gpt_shakespeare",
    "mlp_digits",
]
