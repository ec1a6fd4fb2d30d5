"""The `--input` shorthand: `float32[8,3,224,224]`, `int64[4,128]<50257`, `labels=int64[4,128]<50257`.

Parsing is torch-free; `make_tensor` builds the tensor (fake, meta or real) when
the step is traced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memlayout.errors import UsageError

_SPEC = re.compile(
    r"^\s*(?:(?P<name>[A-Za-z_]\w*)\s*=\s*)?(?P<dtype>[a-z]+\d*)\s*\[(?P<shape>[\d,\s]*)\]\s*(?:<\s*(?P<high>\d+)\s*)?$"
)
FLOATING = ("float16", "bfloat16", "float32", "float64")
INTEGRAL = ("bool", "uint8", "int8", "int16", "int32", "int64")
HINT = "write DTYPE[D0,D1,...] with an optional name= before and <HIGH after, e.g. 'int64[4,128]<50257'"


@dataclass(frozen=True)
class InputSpec:
    """One input tensor the step is fed."""

    name: str | None
    """Keyword argument name; None for a positional argument."""
    dtype: str
    shape: tuple[int, ...]
    high: int | None
    """Integer inputs are drawn from [0, high): token ids below the vocabulary size."""

    @property
    def nbytes(self) -> int:
        itemsize = 1 if self.dtype in ("bool", "uint8", "int8") else int(self.dtype.removeprefix("bfloat").removeprefix(
            "float").removeprefix("int")) // 8
        count = 1
        for dim in self.shape:
            count *= dim
        return count * itemsize

    def describe(self) -> str:
        text = f"{self.dtype}[{','.join(map(str, self.shape))}]" + (f"<{self.high}" if self.high is not None else "")
        return f"{self.name}={text}" if self.name else text

    def make_tensor(self, device: Any, generator: Any = None) -> Any:
        """The tensor itself: random normal floats, or random integers in [0, high)."""
        import torch

        dtype = getattr(torch, self.dtype)
        if self.dtype in FLOATING:
            return torch.randn(self.shape, dtype=dtype, device=device, generator=generator)
        if self.dtype == "bool":
            return torch.randint(0, 2, self.shape, device=device, generator=generator).bool()
        return torch.randint(0, self.high or 2, self.shape, dtype=dtype, device=device, generator=generator)


def parse_input_spec(text: str) -> InputSpec:
    """Parse one `--input` value.

    Raises:
        UsageError: unknown dtype, bad shape, or a bound on a floating input.
    """
    match = _SPEC.match(text)
    if not match:
        raise UsageError(f"`input` {text!r} is not an input spec", HINT)
    dtype = match.group("dtype")
    if dtype not in FLOATING + INTEGRAL:
        raise UsageError(f"`input` {text!r}: unknown dtype {dtype!r}", f"use one of {', '.join(FLOATING + INTEGRAL)}")
    shape_text = match.group("shape").strip()
    try:
        shape = tuple(int(part) for part in shape_text.split(",")) if shape_text else ()
    except ValueError:
        raise UsageError(f"`input` {text!r}: the shape is not a list of integers", HINT) from None
    high = int(match.group("high")) if match.group("high") is not None else None
    if high is not None and dtype not in INTEGRAL:
        raise UsageError(f"`input` {text!r}: a bound (<{high}) only applies to integer inputs", HINT)
    if high is not None and high < 1:
        raise UsageError(f"`input` {text!r}: the bound must be at least 1", HINT)
    return InputSpec(name=match.group("name"), dtype=dtype, shape=shape, high=high)


SUGGESTED_BATCH = 4
SUGGESTED_LENGTH = 128
"""A suggested text input is 4 sequences of 128 tokens, or fewer where the model's
positions end sooner: small enough that following the suggestion traces quickly."""

_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


def suggested_inputs(model: Any) -> tuple[InputSpec, ...]:
    """Inputs for a Hugging Face model, read off its config; () when it has no config or none fits.

    A text model (its config has `vocab_size`) gets token ids below the vocabulary,
    and `labels` too when it is a language model (causal, masked or sequence to
    sequence), so the step has a real loss. A vision model (`image_size` and
    `num_channels`) gets `pixel_values`. An image input is never suggested for a text
    model, nor the other way round.
    """
    config = getattr(model, "config", None)
    if config is None:
        return ()
    image_size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        limit = position_limit(model)
        length = min(SUGGESTED_LENGTH, limit[1]) if limit is not None else SUGGESTED_LENGTH
        shape = (SUGGESTED_BATCH, length)
        specs = [InputSpec("input_ids", "int64", shape, vocab)]
        name = type(model).__name__
        # A sequence-to-sequence LM (T5ForConditionalGeneration) makes its decoder's inputs from the labels.
        seq2seq = bool(getattr(config, "is_encoder_decoder", False)) and name.endswith("ForConditionalGeneration")
        if name.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM")) or seq2seq:
            specs.append(InputSpec("labels", "int64", shape, vocab))
        return tuple(specs)
    if isinstance(image_size, int) and isinstance(channels, int):
        return (InputSpec("pixel_values", "float32", (SUGGESTED_BATCH, channels, image_size, image_size), None),)
    return ()


def position_limit(model: Any) -> tuple[str, int] | None:
    """(config field, value) of the fewest positions a Hugging Face model's config allows; None without one.

    Fake tensors do not check an index against a table's size, so a sequence longer than
    the model's position embeddings would trace without failing where the real step does.
    """
    config = getattr(model, "config", None)
    limits = [(name, getattr(config, name, None)) for name in _POSITION_LIMITS] if config is not None else []
    known = [(name, value) for name, value in limits if isinstance(value, int) and not isinstance(value, bool)
             and value > 0]
    return min(known, key=lambda item: item[1]) if known else None
