"""A small transformer classifier written as any PyTorch model is: stock ``nn.Dropout`` and
``F.scaled_dot_product_attention``, torch's own initialisers, and ``forward(x)``. Nothing in it knows
about vgame."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        drop = self.attn_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.norm2(x)))


class RowTransformer(nn.Module):
    """Each of the image's 8 rows is a token; a learned position per row; mean-pooled to 10 classes."""

    def __init__(self, width: int = 32, heads: int = 4, layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.pos = nn.Parameter(torch.zeros(8, width))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))
