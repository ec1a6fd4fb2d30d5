"""Tiny models for loader tests, each named after the case it covers."""

from __future__ import annotations

import torch
from torch import nn


class TiedScriptable(nn.Module):
    """A Linear, a buffer, a plain tensor attribute, an LSTM and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.proj = nn.Linear(4, 4)
        self.lstm = nn.LSTM(4, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("running", torch.zeros(2, 3))
        self.scale = torch.ones(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.embed(x))) * self.scale.sum()


class AssignedTwins(nn.Module):
    """Two distinct Parameters over one storage, as after load_state_dict(assign=True) on a tied model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = nn.Parameter(self.embed.weight.data)


class TinyLSTM(nn.Module):
    """A Linear in front of a two-layer LSTM: ML401 when saved unflattened."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.rnn = nn.LSTM(4, 4, num_layers=2)
