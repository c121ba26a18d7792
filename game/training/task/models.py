"""The built-in presets' models: plain float64 PyTorch modules, called as ``model(x)``.

They are written as any PyTorch user writes a model, because the presets are the first users of the
public task API (:mod:`.define`): stock ``nn.Dropout`` (vgame serves its mask from the counter-based
RNG, keyed by seed, step and example), torch's own initialisers (served from the task seed when
vgame builds the model at step 0), and nothing vgame-specific in ``forward``. Attention is written
out (matmul, masked softmax, matmul), the shape of the paper's GPT-2 and of nanoGPT's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.errors import TrainingError
from game.training.task.catalog import CNNShape, GPTShape, MLPShape

#: Fill value for masked attention scores: finite (so no inf ever reaches the rounding), and far
#: enough below any real score that exp() of it underflows to exactly 0.
ATTENTION_MASK_FILL = -1e30

#: Standard deviation of GPT embedding initialisation (GPT-2's 0.02).
GPT_INIT_STD = 0.02

F64 = torch.float64


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


class MLPDigits(nn.Module):
    """64 -> hidden -> hidden -> 10 with ReLU, on flattened 8x8 digits."""

    def __init__(self, shape: MLPShape) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, shape.hidden, dtype=F64)
        self.fc2 = nn.Linear(shape.hidden, shape.hidden, dtype=F64)
        self.head = nn.Linear(shape.hidden, 10, dtype=F64)

    def forward(self, x: Tensor) -> Tensor:
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
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(c2 * 2 * 2, shape.hidden, dtype=f64)
        self.head = nn.Linear(shape.hidden, 10, dtype=f64)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], 1, 8, 8)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(x.reshape(x.shape[0], -1))
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
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(c_in, 10, dtype=f64)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], 1, 8, 8)
        # Nearest-neighbour upsampling by repetition: data movement only (no interpolation weights).
        x = x.repeat_interleave(RESNET_UPSAMPLE, dim=2).repeat_interleave(RESNET_UPSAMPLE, dim=3)
        x = F.relu(self.bn(self.stem(x)))
        x = self.stages(x)
        x = x.mean(dim=(2, 3))  # global average pool: an inexact reduction, rounded with the log
        return self.head(self.drop(x))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out: QK^T / sqrt(d), masked softmax, AV."""

    causal: Tensor  # bool [1, 1, block, block], lower triangular

    def __init__(self, shape: GPTShape, dropout: float) -> None:
        super().__init__()
        f64 = torch.float64
        self.n_head = shape.n_head
        self.block_size = shape.block_size
        self.c_attn = nn.Linear(shape.n_embd, 3 * shape.n_embd, dtype=f64)
        self.c_proj = nn.Linear(shape.n_embd, shape.n_embd, dtype=f64)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        causal = torch.ones(shape.block_size, shape.block_size, dtype=torch.bool).tril()
        # Not state: a constant rebuilt from the shape, so it is left out of state_dict.
        self.register_buffer(
            "causal", causal.view(1, 1, shape.block_size, shape.block_size), persistent=False
        )
        self.scale = 1.0 / math.sqrt(shape.n_embd // shape.n_head)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.causal[:, :, :t, :t], ATTENTION_MASK_FILL)
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.c_proj(y))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), x + mlp(ln(x)); GELU in its exact erf form."""

    def __init__(self, shape: GPTShape, dropout: float) -> None:
        super().__init__()
        f64 = torch.float64
        self.ln_1 = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.attn = CausalSelfAttention(shape, dropout)
        self.ln_2 = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.c_fc = nn.Linear(shape.n_embd, 4 * shape.n_embd, dtype=f64)
        self.c_proj = nn.Linear(4 * shape.n_embd, shape.n_embd, dtype=f64)
        self.mlp_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        h = self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="none"))
        return x + self.mlp_drop(h)


class GPT(nn.Module):
    """Character-level GPT (nanoGPT layout). The head is *untied* from the token embedding so every
    parameter is its own tensor in the state (no aliasing for the state hash to worry about)."""

    def __init__(self, shape: GPTShape, vocab_size: int, dropout: float) -> None:
        super().__init__()
        f64 = torch.float64
        self.shape = shape
        self.wte = nn.Embedding(vocab_size, shape.n_embd, dtype=f64)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd, dtype=f64)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(shape, dropout) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd, dtype=f64)
        self.lm_head = nn.Linear(shape.n_embd, vocab_size, bias=False, dtype=f64)
        with torch.no_grad():  # GPT-2's embeddings: N(0, 0.02) (torch's default is N(0, 1))
            self.wte.weight.normal_(0.0, GPT_INIT_STD)
            self.wpe.weight.normal_(0.0, GPT_INIT_STD)

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        if t > self.shape.block_size:
            raise TrainingError(f"sequence of {t} tokens exceeds block_size {self.shape.block_size}")
        pos = torch.arange(t, dtype=torch.int64, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def cnn_class(shape: CNNShape) -> type[CNNDigits] | type[ResNet50Digits]:
    """The cnn-digits model class ``shape.arch`` names (the config layer checked the name)."""
    return ResNet50Digits if shape.arch == "resnet50" else CNNDigits


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
    "MLPDigits",
    "ResNet50Digits",
    "cnn_class",
]
