"""Models the multi-rank tests shard: a Llama-style decoder in plain torch, and one with nothing to shard by name.

Plain torch (no transformers) so that each rank process starts fast. Each
builder is seeded, so every rank builds the same weights, as a real job does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 1000
BATCH, LENGTH = 2, 128


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Attention(nn.Module):
    """Grouped-query attention; heads are counted from the projections' local width (-1), as Llama's are."""

    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.groups = heads // kv_heads
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.groups, dim=1)
        v = v.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(width)
        self.self_attn = Attention(width, heads, kv_heads)
        self.post_norm = RMSNorm(width)
        self.mlp = MLP(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class LlamaStyle(nn.Module):
    """Embeddings, decoder blocks in an nn.ModuleList, a final norm and an untied LM head."""

    def __init__(self, layers: int, width: int, heads: int, kv_heads: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Block(width, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        return {"loss": F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()), "logits": logits}


def llama_style(layers: int = 4, width: int = 128, heads: int = 4, kv_heads: int = 2, hidden: int = 341,
                vocab: int = VOCAB) -> LlamaStyle:
    """The issue's 4-layer Llama-style model (hidden 128, vocab 1000). Its MLP width, 341 (8/3 of 128),
    is odd, so FSDP2's shards are uneven: rank 0 holds one row more of each MLP projection than rank 1."""
    torch.manual_seed(0)
    return LlamaStyle(layers, width, heads, kv_heads, hidden, vocab).train()


def llama_style_even() -> LlamaStyle:
    """The same with an MLP width of 344: every dimension splits evenly over 2 and 4 ranks."""
    return llama_style(hidden=344)


def transformers_llama() -> nn.Module:
    """transformers' LlamaForCausalLM from a config (2 layers, hidden 64, vocab 1000), seeded: the real thing
    the precision tests shard, where the plain-torch models above keep the other tests fast."""
    from tests.activations.models import llama

    return llama(vocab=VOCAB)


def transformers_llama_small_vocab() -> nn.Module:
    """The same with a vocabulary of 64: a forward's peak is in the MLP, at the row-wise projection's all-reduce,
    not at the logits."""
    from tests.activations.models import llama

    return llama(vocab=64)


def transformers_llama_tied() -> nn.Module:
    """The same with its output layer tied to its embedding (`tie_word_embeddings`, as Gemma's and GPT-2's are):
    one [1000, 64] Parameter in two modules."""
    from tests.activations.models import llama

    model = llama(vocab=VOCAB, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def token_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """One rank's batch, 2x128 tokens, with labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


BATCH_SPECS = (f"input_ids=int64[{BATCH},{LENGTH}]<{VOCAB}", f"labels=int64[{BATCH},{LENGTH}]<{VOCAB}")
"""The same batch as `--input` specs."""


class ConvNet(nn.Module):
    """Convolutions in an nn.ModuleList: FSDP2 shards them, and nothing is named like a projection for --tp."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Conv2d(3 if i == 0 else 16, 16, 3, padding=1) for i in range(3)])
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x.mean((2, 3)))


def conv_net() -> ConvNet:
    torch.manual_seed(0)
    return ConvNet().train()


def token_step_batch(seed: int = 1) -> tuple[tuple[Any, ...], dict[str, torch.Tensor]]:
    """`token_batch` as (args, kwargs), the form the DDP ranks take."""
    return (), token_batch(seed)


def gpt2() -> nn.Module:
    """transformers' GPT2LMHeadModel from a config (2 layers, width 64, vocab 1000), seeded."""
    from tests.activations.models import gpt2 as build

    return build(vocab=VOCAB)


def image_batch(seed: int = 1) -> tuple[tuple[Any, ...], dict[str, torch.Tensor]]:
    """One rank's batch of images for the CNNs: 1 x 3 x 8 x 8, small beside `wide_cnn`'s state."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 3, 8, 8, generator=generator),), {}


IMAGE_SPECS = ("float32[1,3,8,8]",)
"""`image_batch` as `--input` specs."""


def short_token_step_batch(seed: int = 1, batch: int = 1, length: int = 16) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One rank's batch of 1 x 16 tokens (or `batch` x `length`) with labels, as (args, kwargs): at 1 x 16 a step whose
    activations are small beside the model's state, so that where the gradients live (DDP's gradient_as_bucket_view)
    moves the peak."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=generator)
    return (), {"input_ids": ids, "labels": ids.clone()}


SHORT_TOKEN_SPECS = (f"input_ids=int64[1,16]<{VOCAB}", f"labels=int64[1,16]<{VOCAB}")
"""`short_token_step_batch` as `--input` specs."""


def wide_cnn() -> nn.Module:
    """`models.flat_cnn` at 64 channels: convolutions, batch norms (whose statistics DDP broadcasts every forward)
    and a head; 1.6 MiB of parameters, so that a small batch's step is mostly model state."""
    from tests.activations.models import flat_cnn

    return flat_cnn(channels=64)


def bert() -> nn.Module:
    """transformers' BertForMaskedLM from a config (2 layers, width 64, vocab 1000), seeded: its decoder's weight is
    the word embeddings' (one parameter, one bucket slot), and its dropout draws a mask on every rank."""
    from tests.activations.models import bert as build

    return build(vocab=VOCAB)
