"""Presets: model + optimizer + data + loss, the interface the step engine trains through.

A step, as the engine runs it::

    preset = get_preset(cfg.preset)
    model = preset.build_model(cfg)                 # step 0: float64, CPU, init from cfg.seed
    opt = preset.build_optimizer(cfg, model)
    batch = preset.batch(cfg, step).to(device)      # steps start at 1
    loss = preset.loss(model, batch, StepContext(cfg.seed, step, batch.example_ids))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

``loss`` runs on whatever device the model and batch are on: moving them is the engine's job.
Optimizers are built with ``foreach=True`` and ``fused=False``: each update is a handful of
``_foreach_*`` ATen ops over the list of all tensors (on CPU a loop in C++ over per-tensor kernels),
which the engine intercepts once each and rounds tensor by tensor. One op per tensor instead sent
some 200 more ops a step through Python on gpt-shakespeare, about 10 ms of a 105 ms trainer step.
A fused optimizer would do the whole update in one kernel, with no result to round in between.

Initial parameters are plain float64 (not on the ``bits`` grid): rounding the step-0 state onto the
grid is the engine's job, like every other rounding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.errors import ConfigError
from game.registry import Registry
from game.training.task import data
from game.training.task.catalog import PRESET_NAMES, CNNShape, GPTShape, MLPShape
from game.training.task.config import TaskConfig
from game.training.task.data import Batch
from game.training.task.models import StepContext, build_cnn, build_gpt, build_mlp


class Preset(ABC):
    """One kind of training task. Stateless: every method is a pure function of its arguments."""

    name: str

    @abstractmethod
    def build_model(self, cfg: TaskConfig) -> nn.Module:
        """The model at step 0: float64 on CPU, every tensor set from ``cfg.seed``, train mode."""

    def build_optimizer(self, cfg: TaskConfig, model: nn.Module) -> torch.optim.Optimizer:
        """SGD or AdamW per ``cfg.optimizer``: foreach (one op per step of the update, over every
        tensor), not fused (each step's results are rounded)."""
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(
                model.parameters(),
                lr=cfg.lr,
                momentum=cfg.momentum,
                weight_decay=cfg.weight_decay,
                foreach=True,
                fused=False,
            )
        if cfg.optimizer == "adamw":
            # nanoGPT's grouping: decay matrices (linear weights, embeddings), not biases or norms.
            named = list(model.named_parameters())
            decay = [p for _, p in named if p.dim() >= 2]
            no_decay = [p for _, p in named if p.dim() < 2]
            return torch.optim.AdamW(
                [
                    {"params": decay, "weight_decay": cfg.weight_decay},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=cfg.lr,
                betas=cfg.betas,
                eps=cfg.eps,
                foreach=True,
                fused=False,
            )
        raise ConfigError(f"optimizer: {cfg.optimizer!r} is not supported")  # validate() prevents this

    @abstractmethod
    def batch(self, cfg: TaskConfig, step: int) -> Batch:
        """Step ``step``'s batch on CPU (``step >= 1``), a pure function of (cfg, step)."""

    @abstractmethod
    def eval_batch(self, cfg: TaskConfig, size: int = 256) -> Batch:
        """A fixed held-out batch (CPU) to report progress on, in eval mode; never trained on."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch, ctx: StepContext) -> Tensor:
        """Forward pass and mean cross-entropy: a float64 scalar. Batch and model share a device."""

    @abstractmethod
    def poison(self, cfg: TaskConfig, batch: Batch, step: int) -> Batch:
        """The deviation of the "poison" scenario: same shapes and ids, different data."""


class _DigitsPreset(Preset):
    def batch(self, cfg: TaskConfig, step: int) -> Batch:
        return data.digits_batch(cfg.seed, step, cfg.batch_size)

    def eval_batch(self, cfg: TaskConfig, size: int = 256) -> Batch:
        return data.digits_eval_batch(size)

    def loss(self, model: nn.Module, batch: Batch, ctx: StepContext) -> Tensor:
        return F.cross_entropy(model(batch.inputs, ctx), batch.targets)

    def poison(self, cfg: TaskConfig, batch: Batch, step: int) -> Batch:
        return data.digits_poison(batch)


class MLPDigitsPreset(_DigitsPreset):
    """MLP on 8x8 digits; SGD with momentum."""

    name = "mlp-digits"

    def build_model(self, cfg: TaskConfig) -> nn.Module:
        assert isinstance(cfg.model, MLPShape)
        return build_mlp(cfg.model, cfg.seed)


class CNNDigitsPreset(_DigitsPreset):
    """Conv net with BatchNorm and dropout on 8x8 digits; SGD with momentum and weight decay."""

    name = "cnn-digits"

    def build_model(self, cfg: TaskConfig) -> nn.Module:
        assert isinstance(cfg.model, CNNShape)
        return build_cnn(cfg.model, cfg.dropout, cfg.seed)


class GPTShakespearePreset(Preset):
    """Character-level GPT on Tiny Shakespeare; AdamW."""

    name = "gpt-shakespeare"

    def build_model(self, cfg: TaskConfig) -> nn.Module:
        assert isinstance(cfg.model, GPTShape)
        return build_gpt(cfg.model, len(data.vocab()), cfg.dropout, cfg.seed)

    def batch(self, cfg: TaskConfig, step: int) -> Batch:
        assert isinstance(cfg.model, GPTShape)
        return data.shakespeare_batch(cfg.seed, step, cfg.batch_size, cfg.model.block_size)

    def eval_batch(self, cfg: TaskConfig, size: int = 256) -> Batch:
        assert isinstance(cfg.model, GPTShape)
        return data.shakespeare_eval_batch(size, cfg.model.block_size)

    def loss(self, model: nn.Module, batch: Batch, ctx: StepContext) -> Tensor:
        logits = model(batch.inputs, ctx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))

    def poison(self, cfg: TaskConfig, batch: Batch, step: int) -> Batch:
        return data.shakespeare_poison(batch)


PRESETS: Registry[Preset] = Registry(
    "preset",
    [(p.name, p) for p in (MLPDigitsPreset(), CNNDigitsPreset(), GPTShakespearePreset())],
    where="preset",
)
assert PRESETS.names() == PRESET_NAMES


def get_preset(name: str) -> Preset:
    """The preset called ``name``, or a ConfigError listing the valid names."""
    return PRESETS.get(name)


__all__ = [
    "PRESETS",
    "Batch",
    "CNNDigitsPreset",
    "GPTShakespearePreset",
    "MLPDigitsPreset",
    "Preset",
    "StepContext",
    "get_preset",
]
