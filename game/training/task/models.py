"""Float64 models whose every random choice comes from ``rng.py``.

Rules that keep training replayable bit for bit on any machine:

* no torch RNG anywhere: modules are built on the ``meta`` device (so torch's default initialisers
  draw nothing) and every parameter and buffer is then set by :func:`init_model`;
* initialisation uses only IEEE-exact arithmetic (+ - * / sqrt) on counter-based uniforms, never a
  transcendental function (libms differ);
* dropout masks are keyed by (seed, step, example id, module name), so they follow the example, not
  its position in the batch or the device;
* attention is an explicit matmul + masked softmax (torch's fused SDPA kernel picks a different
  backend per device).

Every model's ``forward(x, ctx)`` takes a :class:`StepContext` naming the seed, the step and the
example ids of the batch rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.errors import ConfigError, TrainingError
from game.training.numerics import rng
from game.training.task.catalog import CNN_ARCHS, CNNShape, GPTShape, MLPShape

log = logging.getLogger(__name__)

#: Fill value for masked attention scores: finite (so no inf ever reaches the rounding), and far
#: enough below any real score that exp() of it underflows to exactly 0.
ATTENTION_MASK_FILL = -1e30

#: Standard deviation of GPT embedding and projection initialisation (GPT-2's 0.02).
GPT_INIT_STD = 0.02


@dataclass(frozen=True)
class StepContext:
    """What a forward pass needs to draw its randomness: passed explicitly, never global."""

    seed: int  # task seed
    step: int  # training step (1-based; 0 is initialisation)
    example_ids: Tensor  # int64 [batch]: the global id of each batch row's example


class DeterministicDropout(nn.Module):
    """Dropout whose mask is keyed by (seed, step, example id, purpose), not by torch's generator."""

    def __init__(self, p: float, purpose: str) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability {p} is outside [0, 1)")
        self.p = p
        self.purpose = purpose

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.shape[0] != ctx.example_ids.numel():
            raise TrainingError(
                f"dropout {self.purpose}: batch of {x.shape[0]} rows but {ctx.example_ids.numel()} example ids"
            )
        keep = rng.bernoulli_mask(
            ctx.seed,
            ctx.step,
            f"dropout/{self.purpose}",
            ctx.example_ids,
            tuple(x.shape[1:]),
            1.0 - self.p,
            device=x.device,
        )
        return x * (keep.to(x.dtype) * (1.0 / (1.0 - self.p)))

    def extra_repr(self) -> str:
        return f"p={self.p}, purpose={self.purpose!r}"


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


class MLPDigits(nn.Module):
    """64 -> hidden -> hidden -> 10 with ReLU, on flattened 8x8 digits."""

    def __init__(self, shape: MLPShape) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, shape.hidden, dtype=torch.float64)
        self.fc2 = nn.Linear(shape.hidden, shape.hidden, dtype=torch.float64)
        self.head = nn.Linear(shape.hidden, 10, dtype=torch.float64)

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        x = x.reshape(x.shape[0], -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.head(x)


class CNNDigits(nn.Module):
    """conv3x3 -> BN -> ReLU -> maxpool (8->4), conv3x3 -> BN -> ReLU -> maxpool (4->2), MLP head."""

    def __init__(self, shape: CNNShape, dropout: float) -> None:
        super().__init__()
        c1, c2 = shape.channels, 2 * shape.channels
        f64 = torch.float64
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1, bias=False, dtype=f64)
        self.bn1 = nn.BatchNorm2d(c1, dtype=f64)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=False, dtype=f64)
        self.bn2 = nn.BatchNorm2d(c2, dtype=f64)
        self.drop = DeterministicDropout(dropout, "drop")
        self.fc = nn.Linear(c2 * 2 * 2, shape.hidden, dtype=f64)
        self.head = nn.Linear(shape.hidden, 10, dtype=f64)

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        x = x.reshape(x.shape[0], 1, 8, 8)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(x.reshape(x.shape[0], -1), ctx)
        return self.head(F.relu(self.fc(x)))


#: ResNet-50: bottleneck blocks per stage, their strides (CIFAR-style: the first keeps 32x32), and
#: the channel expansion of a block's last 1x1 conv.
RESNET50_BLOCKS = (3, 4, 6, 3)
RESNET50_STRIDES = (1, 2, 2, 2)
RESNET50_EXPANSION = 4

#: The 8x8 digits are upsampled to 32x32 (CIFAR's size) by repeating each pixel this often per axis.
RESNET_UPSAMPLE = 4


class Bottleneck(nn.Module):
    """1x1 (reduce) -> 3x3 (stride here, as torchvision's v1.5) -> 1x1 (expand), BN after each conv,
    ReLU after the first two and after the sum with the shortcut (1x1 conv + BN where the shape
    changes, identity otherwise). Every BN starts at weight 1, bias 0 (no zero-init of the last)."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        f64 = torch.float64
        c_out = RESNET50_EXPANSION * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False, dtype=f64)
        self.bn1 = nn.BatchNorm2d(width, dtype=f64)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False, dtype=f64)
        self.bn2 = nn.BatchNorm2d(width, dtype=f64)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False, dtype=f64)
        self.bn3 = nn.BatchNorm2d(c_out, dtype=f64)
        self.shortcut: nn.Sequential | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False, dtype=f64),
                nn.BatchNorm2d(c_out, dtype=f64),
            )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet50Digits(nn.Module):
    """CIFAR-style ResNet-50 on the digits: 8x8 repeated to 32x32, 3x3 stem (stride 1, no max-pool),
    four bottleneck stages ([3, 4, 6, 3] blocks, strides 1, 2, 2, 2: 32 -> 4), global average pool,
    dropout, one linear 10-way head. Stage widths are 1, 2, 4, 8 times ``shape.channels`` (the stem
    width); ``shape.hidden`` is unused."""

    def __init__(self, shape: CNNShape, dropout: float) -> None:
        super().__init__()
        f64 = torch.float64
        c = shape.channels
        self.stem = nn.Conv2d(1, c, 3, padding=1, bias=False, dtype=f64)
        self.bn = nn.BatchNorm2d(c, dtype=f64)
        stages: list[nn.Module] = []
        c_in = c
        for i, (blocks, stride) in enumerate(zip(RESNET50_BLOCKS, RESNET50_STRIDES, strict=True)):
            width = c << i
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(c_in, width, stride if b == 0 else 1))
                c_in = RESNET50_EXPANSION * width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.drop = DeterministicDropout(dropout, "drop")
        self.head = nn.Linear(c_in, 10, dtype=f64)

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        x = x.reshape(x.shape[0], 1, 8, 8)
        # Nearest-neighbour upsampling by repetition: data movement only (no interpolation weights).
        x = x.repeat_interleave(RESNET_UPSAMPLE, dim=2).repeat_interleave(RESNET_UPSAMPLE, dim=3)
        x = F.relu(self.bn(self.stem(x)))
        x = self.stages(x)
        x = x.mean(dim=(2, 3))  # global average pool: an inexact reduction, rounded with the log
        return self.head(self.drop(x, ctx))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out: QK^T / sqrt(d), masked softmax, AV."""

    causal: Tensor  # bool [1, 1, block, block], lower triangular

    def __init__(self, shape: GPTShape, dropout: float, name: str) -> None:
        super().__init__()
        f64 = torch.float64
        self.n_head = shape.n_head
        self.block_size = shape.block_size
        self.c_attn = nn.Linear(shape.n_embd, 3 * shape.n_embd, dtype=f64)
        self.c_proj = nn.Linear(shape.n_embd, shape.n_embd, dtype=f64)
        self.attn_drop = DeterministicDropout(dropout, f"{name}.attn_drop")
        self.resid_drop = DeterministicDropout(dropout, f"{name}.resid_drop")
        causal = torch.ones(shape.block_size, shape.block_size, dtype=torch.bool).tril()
        # Not state: a constant rebuilt from the shape, so it is left out of state_dict.
        self.register_buffer(
            "causal", causal.view(1, 1, shape.block_size, shape.block_size), persistent=False
        )
        self.scale = 1.0 / math.sqrt(shape.n_embd // shape.n_head)

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.causal[:, :, :t, :t], ATTENTION_MASK_FILL)
        att = self.attn_drop(F.softmax(att, dim=-1), ctx)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.c_proj(y), ctx)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), x + mlp(ln(x)); GELU in its exact erf form."""

    def __init__(self, shape: GPTShape, dropout: float, name: str) -> None:
        super().__init__()
        f64 = torch.float64
        self.ln_1 = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.attn = CausalSelfAttention(shape, dropout, f"{name}.attn")
        self.ln_2 = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.c_fc = nn.Linear(shape.n_embd, 4 * shape.n_embd, dtype=f64)
        self.c_proj = nn.Linear(4 * shape.n_embd, shape.n_embd, dtype=f64)
        self.mlp_drop = DeterministicDropout(dropout, f"{name}.mlp_drop")

    def forward(self, x: Tensor, ctx: StepContext) -> Tensor:
        x = x + self.attn(self.ln_1(x), ctx)
        h = self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="none"))
        return x + self.mlp_drop(h, ctx)


class GPT(nn.Module):
    """Character-level GPT (nanoGPT layout). The head is *untied* from the token embedding so every
    parameter is its own tensor in the state (no aliasing for the state hash to worry about)."""

    def __init__(self, shape: GPTShape, vocab_size: int, dropout: float) -> None:
        super().__init__()
        f64 = torch.float64
        self.shape = shape
        self.wte = nn.Embedding(vocab_size, shape.n_embd, dtype=f64)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd, dtype=f64)
        self.drop = DeterministicDropout(dropout, "drop")
        self.blocks = nn.ModuleList(Block(shape, dropout, f"blocks.{i}") for i in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.lm_head = nn.Linear(shape.n_embd, vocab_size, bias=False, dtype=f64)

    def forward(self, idx: Tensor, ctx: StepContext) -> Tensor:
        t = idx.shape[1]
        if t > self.shape.block_size:
            raise TrainingError(f"sequence of {t} tokens exceeds block_size {self.shape.block_size}")
        pos = torch.arange(t, dtype=torch.int64, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos), ctx)
        for block in self.blocks:
            x = block(x, ctx)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------------------------------
# Building and initialisation
# --------------------------------------------------------------------------------------------------


def materialize(build: Callable[..., nn.Module], *args: object, **kwargs: object) -> nn.Module:
    """Construct a module on ``meta`` (torch's default init draws nothing) and give it CPU storage.

    The storage is uninitialised: :func:`init_model` must set every tensor.
    """
    with torch.device("meta"):
        module = build(*args, **kwargs)
    module = module.to_empty(device="cpu")
    # Non-persistent buffers (constants such as the causal mask) are rebuilt on CPU from scratch.
    for mod in module.modules():
        if isinstance(mod, CausalSelfAttention):
            size = mod.block_size
            mod.causal = torch.ones(size, size, dtype=torch.bool).tril().view(1, 1, size, size)
    return module


def _uniform_pm(seed: int, purpose: str, shape: torch.Size, bound: float) -> Tensor:
    """U(-bound, bound) from exact ops: (2u - 1) * bound."""
    return (rng.uniform(seed, 0, purpose, None, tuple(shape)) * 2.0 - 1.0) * bound


def _normal(seed: int, purpose: str, shape: torch.Size, std: float) -> Tensor:
    return rng.irwin_hall(seed, 0, purpose, None, tuple(shape)) * std


@torch.no_grad()
def init_model(model: nn.Module, seed: int) -> None:
    """Set every parameter and persistent buffer from ``seed`` (step 0, purpose ``init/<name>``).

    Linear and conv layers: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias (torch's own
    default scheme, with exact arithmetic). Embeddings: Irwin-Hall normal with std 0.02 (GPT-2).
    Norm layers: weight 1, bias 0; BatchNorm running mean 0, var 1, count 0. Raises if any tensor of
    the state is left unset, so a new layer type cannot silently keep garbage.
    """
    done: set[str] = set()
    for mod_name, mod in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(mod, nn.Linear | nn.Conv2d):
            fan_in = mod.weight[0].numel()
            bound = 1.0 / math.sqrt(fan_in)
            for pname, p in mod.named_parameters(recurse=False):
                p.copy_(_uniform_pm(seed, f"init/{prefix}{pname}", p.shape, bound))
                done.add(prefix + pname)
        elif isinstance(mod, nn.Embedding):
            mod.weight.copy_(_normal(seed, f"init/{prefix}weight", mod.weight.shape, GPT_INIT_STD))
            done.add(prefix + "weight")
        elif isinstance(mod, nn.LayerNorm | nn.BatchNorm2d):
            for pname, p in mod.named_parameters(recurse=False):
                p.fill_(1.0 if pname == "weight" else 0.0)
                done.add(prefix + pname)
            if isinstance(mod, nn.BatchNorm2d):
                assert mod.running_mean is not None and mod.running_var is not None
                assert mod.num_batches_tracked is not None
                mod.running_mean.zero_()
                mod.running_var.fill_(1.0)
                mod.num_batches_tracked.zero_()
                done.update(prefix + b for b in ("running_mean", "running_var", "num_batches_tracked"))
    missing = sorted(set(model.state_dict()) - done)
    if missing:
        raise TrainingError(f"init_model: no initialiser for {', '.join(missing)}")
    log.debug("initialised %d tensors from seed %d", len(done), seed)


def build_mlp(shape: MLPShape, seed: int) -> MLPDigits:
    model = materialize(MLPDigits, shape)
    init_model(model, seed)
    assert isinstance(model, MLPDigits)
    return model


def build_cnn(shape: CNNShape, dropout: float, seed: int) -> CNNDigits | ResNet50Digits:
    """The cnn-digits model ``shape.arch`` names."""
    model_cls: type[CNNDigits | ResNet50Digits]
    if shape.arch == "small":
        model_cls = CNNDigits
    elif shape.arch == "resnet50":
        model_cls = ResNet50Digits
    else:
        raise ConfigError(f"model.arch: {shape.arch!r} is not one of {', '.join(CNN_ARCHS)}")
    model = materialize(model_cls, shape, dropout)
    init_model(model, seed)
    assert isinstance(model, model_cls)
    return model


def build_gpt(shape: GPTShape, vocab_size: int, dropout: float, seed: int) -> GPT:
    model = materialize(GPT, shape, vocab_size, dropout)
    init_model(model, seed)
    assert isinstance(model, GPT)
    return model


__all__ = [
    "ATTENTION_MASK_FILL",
    "GPT",
    "RESNET50_BLOCKS",
    "RESNET50_EXPANSION",
    "RESNET50_STRIDES",
    "RESNET_UPSAMPLE",
    "Bottleneck",
    "CNNDigits",
    "CausalSelfAttention",
    "DeterministicDropout",
    "MLPDigits",
    "ResNet50Digits",
    "StepContext",
    "build_cnn",
    "build_gpt",
    "build_mlp",
    "init_model",
    "materialize",
]
