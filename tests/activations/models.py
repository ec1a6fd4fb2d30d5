"""Models the activations tests and benchmarks trace, fake, and run for real.

Each builder takes sizes so that tests use tiny ones and the benchmarks larger
ones; each is seeded, so two builds give the same weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def gpt2(layers: int = 2, width: int = 64, heads: int = 4, vocab: int = 500, positions: int = 128,
         dropout: float = 0.1) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).train()


def bert(layers: int = 2, width: int = 64, heads: int = 4, vocab: int = 500, positions: int = 128) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=positions)
    return BertForMaskedLM(config).train()


def llama(layers: int = 2, width: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 500,
          tie: bool = False) -> nn.Module:
    """The Llama architecture (RMSNorm, rotary embeddings, grouped-query SDPA, SwiGLU) at a small size; `tie`: the
    output layer shares the embedding's weight."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=width, intermediate_size=int(width * 8 / 3), num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=256, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).train()


def t5(layers: int = 2, width: int = 64, heads: int = 4, vocab: int = 500) -> nn.Module:
    """An encoder-decoder: relative attention biases, cross-attention, and a cache of two parts when it generates."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=vocab, d_model=width, d_kv=width // heads, d_ff=2 * width, num_layers=layers,
                      num_heads=heads, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config).train()


def flat_cnn(channels: int = 16, classes: int = 10) -> nn.Sequential:
    """One flat nn.Sequential of conv/norm/activation layers: single-layer checkpoints save nothing here."""
    torch.manual_seed(0)
    c = channels
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, classes),
    ).train()


def norm_mlp(width: int = 64, blocks: int = 2) -> nn.Sequential:
    """torch.nn's RMSNorm, SiLU and Mish: the ops a CUDA build runs whole and a CPU build splits on CUDA tensors
    (trace/fake_cuda.py's WHOLE_ON_CUDA)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.RMSNorm(width), nn.Linear(width, 4 * width), nn.SiLU(), nn.Linear(4 * width, width), nn.Mish()]
    return nn.Sequential(*layers).train()


class ResidualBlock(nn.Module):
    """x + W2 relu(W1 x): a block whose input stays needed after it, as in a transformer layer."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, hidden)
        self.b = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


def residual_stack(blocks: int = 8, width: int = 256, hidden: int = 1024, classes: int = 10) -> nn.Sequential:
    """Residual blocks in a Sequential, then a head: one block checkpointed moves the peak to its own rerun."""
    torch.manual_seed(0)
    return nn.Sequential(*[ResidualBlock(width, hidden) for _ in range(blocks)], nn.Linear(width, classes)).train()


class LSTMLanguageModel(nn.Module):
    """Embedding, a stacked LSTM with dropout between layers, and a vocabulary head."""

    def __init__(self, vocab: int = 500, width: int = 64, hidden: int = 96, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=layers, batch_first=True, dropout=0.1)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(ids))
        return self.head(self.drop(hidden))


def lstm_lm(**sizes: Any) -> nn.Module:
    torch.manual_seed(0)
    return LSTMLanguageModel(**sizes).train()


def token_inputs(batch: int, length: int, vocab: int, labels: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    return (ids,), ({"labels": ids.clone()} if labels else {})


def image_inputs(batch: int, size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(batch, 3, size, size, generator=generator),), {}


def gpt2_inputs() -> dict[str, Any]:
    """`--inputs tests.activations.models:gpt2_inputs`: keyword inputs for `gpt2()`."""
    args, kwargs = token_inputs(2, 32, 500)
    return {"input_ids": args[0], **kwargs}
