"""Small models whose plans the segment tests search by brute force: two Sequentials, whose children are the
stack, and two models that iterate nn.ModuleLists of blocks in their own loop."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def sequential_cnn(channels: tuple[int, ...] = (8, 16), classes: int = 10, norm: bool = True) -> nn.Sequential:
    """Conv2d(3x3)/BatchNorm2d/ReLU blocks (without the norm, `norm` False) flat in one nn.Sequential, then pooling
    and a linear head."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    before = 3
    for width in channels:
        layers += [nn.Conv2d(before, width, 3, padding=1), *([nn.BatchNorm2d(width)] if norm else []), nn.ReLU()]
        before = width
    layers += [nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(before, classes))]
    return nn.Sequential(*layers).train()


def issue_cnn() -> nn.Sequential:
    """Six conv/norm/ReLU blocks (32, 32, 64, 64, 128, 128 channels), pooling, Flatten and Linear(128, 10), one flat
    nn.Sequential of 21 children: the CNN a budget the segments reach was called unreachable for."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    before = 3
    for width in (32, 32, 64, 64, 128, 128):
        layers += [nn.Conv2d(before, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        before = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)]
    return nn.Sequential(*layers).train()


def sequential_mlp(width: int = 256, depth: int = 3, features: int = 64) -> nn.Sequential:
    """Linear/Tanh pairs flat in one nn.Sequential."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    before = features
    for _ in range(depth):
        layers += [nn.Linear(before, width), nn.Tanh()]
        before = width
    return nn.Sequential(*layers).train()


class Attention(nn.Module):
    """Causal self-attention through scaled_dot_product_attention."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        if memory is not None:  # cross-attention: keys and values from the encoder's output
            _, k, v = self.qkv(memory).split(width, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, -1, self.heads, width // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=memory is None)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """A pre-norm transformer block; returns a one-tuple, as Hugging Face layers do."""

    def __init__(self, width: int, heads: int, cross: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.cross = Attention(width, heads) if cross else None
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        x = x + self.attn(self.norm1(x))
        if self.cross is not None:
            x = x + self.cross(x, memory)
        return (x + self.mlp(self.norm2(x)),)


class ListTransformer(nn.Module):
    """Blocks in an nn.ModuleList that the model's forward iterates."""

    def __init__(self, width: int = 64, heads: int = 4, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)[0]
        return self.norm(x)


class EncoderDecoder(nn.Module):
    """An encoder's blocks and a decoder's, each an nn.ModuleList iterated; the decoder attends to the encoder's
    output, which every decoder layer takes beside the stream."""

    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.decoder = nn.ModuleList(Block(width, heads, cross=True) for _ in range(layers))
        self.head = nn.Linear(width, width)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        memory = source
        for block in self.encoder:
            memory = block(memory)[0]
        x = target
        for layer in self.decoder:
            x = layer(x, memory=memory)[0]
        return self.head(x)


def list_transformer() -> nn.Module:
    return ListTransformer().train()


def encoder_decoder() -> nn.Module:
    return EncoderDecoder().train()


def inputs(*shapes: tuple[int, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    generator = torch.Generator().manual_seed(1)
    return tuple(torch.randn(*shape, generator=generator) for shape in shapes), {}
