"""Tiny models for flatten tests, each named after the layout case it shows.

They live in an importable module so that pickled whole modules load back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Bag(nn.Module):
    """Parameters and buffers registered by name, for generated layouts."""

    def __init__(self) -> None:
        super().__init__()
        self.subs = nn.ModuleDict()


class TransposedTie(nn.Module):
    """decoder.weight is encoder.weight.t(): two Parameters, one memory."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 4)
        self.decoder = nn.Linear(4, 6, bias=False)
        self.decoder.weight = nn.Parameter(self.encoder.weight.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.relu(self.encoder(x)))


class LstmLM(nn.Module):
    """Embedding, 2-layer LSTM and a head tied to the embedding."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden)


class WeightDropLSTM(nn.Module):
    """awd-lstm's WeightDrop: weight_hh_l0 is deleted and recomputed from a `_raw` Parameter each forward."""

    def __init__(self, width: int = 8, dropout: float = 0.5) -> None:
        super().__init__()
        self.module = nn.LSTM(width, width)
        self.dropout = dropout
        raw = self.module.weight_hh_l0
        del self.module._parameters["weight_hh_l0"]
        self.module.weight_hh_l0_raw = nn.Parameter(raw.detach().clone())
        self._setweights()

    def _setweights(self) -> None:
        raw = self.module.weight_hh_l0_raw
        # Always a fresh plain tensor: assigning the Parameter itself (what dropout
        # returns in eval mode) would register it again.
        weight = nn.functional.dropout(raw, p=self.dropout, training=self.training) * 1.0
        setattr(self.module, "weight_hh_l0", weight)  # noqa: B010 - a plain attribute on purpose
        self.module._flat_weights = [getattr(self.module, n) for n in self.module._flat_weights_names]

    def forward(self, x: torch.Tensor) -> Any:
        self._setweights()
        return self.module(x)


class ConvNet(nn.Module):
    """Two convs, the first channels_last, and a BatchNorm with int64 num_batches_tracked."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.conv2 = nn.Conv2d(4, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv2(self.conv1(x)))
