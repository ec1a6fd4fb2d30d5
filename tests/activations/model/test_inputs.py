"""`--input` specs and `--budget` sizes: parsed without torch, refused in one line."""

from __future__ import annotations

import pytest

from memlayout.activations.model.input_specs import InputSpec, parse_input_spec
from memlayout.activations.sizes import parse_size
from memlayout.errors import UsageError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("float32[8,3,224,224]", InputSpec(None, "float32", (8, 3, 224, 224), None)),
        ("int64[4,128]<50257", InputSpec(None, "int64", (4, 128), 50257)),
        ("labels=int64[4, 128] < 50257", InputSpec("labels", "int64", (4, 128), 50257)),
        ("bfloat16[]", InputSpec(None, "bfloat16", (), None)),
        ("bool[2,5]", InputSpec(None, "bool", (2, 5), None)),
    ],
)
def test_input_specs(text: str, expected: InputSpec) -> None:
    assert parse_input_spec(text) == expected
    assert parse_input_spec(expected.describe()) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("float32", "not an input spec"),
        ("complex64[2]", "unknown dtype"),
        ("float32[2,x]", "not an input spec"),
        ("float32[4]<10", "only applies to integer"),
        ("int64[4]<0", "at least 1"),
        ("1x=int64[4]", "not an input spec"),
    ],
)
def test_bad_input_specs(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_input_spec(text)


def test_made_tensors_follow_the_spec() -> None:
    import torch

    ids = parse_input_spec("int64[64,32]<7").make_tensor("cpu", torch.Generator().manual_seed(0))
    assert ids.dtype == torch.int64 and ids.shape == (64, 32)
    assert int(ids.min()) >= 0 and int(ids.max()) == 6
    image = parse_input_spec("float16[2,3,4,4]").make_tensor("cpu")
    assert image.dtype == torch.float16 and image.shape == (2, 3, 4, 4)


@pytest.mark.parametrize(
    "text, expected",
    [("123", 123), ("8GiB", 8 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("64 k", 65536),
     ("2g", 2 * 2**30)],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8 parsecs", "-1GiB", "1e9"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError, match="is not a size"):
        parse_size(text)
