"""Hypothesis strategies: modules and checkpoints with every aliasing case flatten must keep."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn

from tests.flatten.models import Bag

DTYPES = (torch.float32, torch.float16, torch.float64, torch.bfloat16, torch.int64)

# One step of building a layout; each names the case it adds.
CASES = (
    "linear",  # a plain Linear: weight and bias
    "identity_tie",  # the same Parameter under a second name
    "transposed_tie",  # a new Parameter that is an earlier one's .t()
    "slices",  # two Parameters slicing one big tensor, optionally overlapping
    "expanded_buffer",  # a stride-0 buffer
    "lone_transposed",  # a Parameter alone in its storage, not contiguous
    "mixed_dtype_buffer",  # a buffer of another dtype
    "channels_last_conv",
    "frozen",  # a Parameter with requires_grad=False
    "lstm",
    "gru",
    "bloated_slice",  # a small buffer slicing a big storage (ML301)
)


@st.composite
def layout_steps(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(st.lists(st.tuples(st.sampled_from(CASES), st.integers(0, 2**16)), min_size=1, max_size=8))


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=generator).to(dtype)


def build_module(steps: list[tuple[str, int]]) -> Bag:
    """A `Bag` holding one piece per step, registered under unique names."""
    bag = Bag()
    params: list[nn.Parameter] = []
    for index, (case, seed) in enumerate(steps):
        name = f"m{index}"
        rows, cols = 2 + seed % 5, 1 + (seed >> 3) % 6
        if case == "linear":
            lin = nn.Linear(cols, rows)
            lin.weight.data = _random((rows, cols), torch.float32, seed)
            bag.subs[name] = lin
            params.append(lin.weight)
        elif case == "identity_tie" and params:
            bag.register_parameter(name, params[seed % len(params)])
        elif case == "transposed_tie" and params:
            source = params[seed % len(params)]
            if source.dim() == 2:
                bag.register_parameter(name, nn.Parameter(source.t(), requires_grad=source.requires_grad))
        elif case == "slices":
            base = _random((40,), torch.float32, seed)
            start, length = seed % 10, 5 + seed % 7
            overlap = seed % 3
            bag.register_parameter(name + "a", nn.Parameter(base[start : start + length]))
            second = start + length - overlap
            bag.register_parameter(name + "b", nn.Parameter(base[second : second + 6]))
        elif case == "expanded_buffer":
            bag.register_buffer(name, _random((1, cols), torch.float32, seed).expand(rows, cols))
        elif case == "lone_transposed":
            param = nn.Parameter(_random((rows, cols + 1), torch.float32, seed).t())
            bag.register_parameter(name, param)
            params.append(param)
        elif case == "mixed_dtype_buffer":
            bag.register_buffer(name, _random((rows, cols), DTYPES[seed % len(DTYPES)], seed))
        elif case == "channels_last_conv":
            conv = nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
            bag.subs[name] = conv
        elif case == "frozen":
            bag.register_parameter(name, nn.Parameter(_random((rows,), torch.float32, seed), requires_grad=False))
        elif case == "lstm":
            bag.subs[name] = nn.LSTM(cols, rows, num_layers=1 + seed % 2, bidirectional=bool(seed & 4))
        elif case == "gru":
            bag.subs[name] = nn.GRU(cols, rows)
        elif case == "bloated_slice":
            bag.register_buffer(name, _random((500,), torch.float32, seed)[seed % 10 : seed % 10 + 3])
    return bag


def build_checkpoint(steps: list[tuple[str, int]]) -> dict[str, Any]:
    """A nested training checkpoint: model state, optimizer state after one step, scalars."""
    module = build_module(steps)
    trainable = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable) if trainable else None
    if optimizer is not None:
        for param in trainable:
            param.grad = torch.ones_like(param)
        optimizer.step()
    checkpoint: dict[str, Any] = {"model": module.state_dict(), "epoch": 1, "loose": _random((3,), torch.float32, 7)}
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    return checkpoint
