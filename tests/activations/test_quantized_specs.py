"""A model an import spec quantizes itself (bitsandbytes through transformers) and adapts with peft, traced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import memlayout.activations as act
from tests.activations import lora_models

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

INPUTS = ["int64[4,32]<500", "labels=int64[4,32]<500"]


def test_an_import_spec_that_builds_qlora_itself_is_traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It stopped inside peft with "'Parameter' object has no attribute 'compress_statistics'": moving the
    4-bit weights to fake or meta tensors made them plain Parameters, without Params4bit's attributes."""
    folder = tmp_path
    directory = lora_models.saved("llama", folder)
    spec = folder / "qlora_spec.py"
    spec.write_text(
        "import peft\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n\n"
        "def build():\n"
        "    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')\n"
        f"    model = AutoModelForCausalLM.from_pretrained({str(directory)!r}, quantization_config=config)\n"
        "    return peft.get_peft_model(model, peft.LoraConfig(r=16))\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("qlora_spec", None)
    report = act.analyze("qlora_spec:build", INPUTS)
    measured = lora_models.real_peak(lora_models.with_lora(lora_models.quantized_from(directory), r=16))
    assert abs(report.summary.peak_bytes - measured) <= 0.03 * measured, (report.summary.peak_bytes, measured)


def test_a_4bit_weight_moved_to_fake_tensors_keeps_its_class_and_state() -> None:
    """peft reads a 4-bit weight's attributes and checks its class by name (DoRA dequantizes only a Params4bit)."""
    import bitsandbytes as bnb
    import torch

    from memlayout import _torch
    from memlayout.activations.model.build import TensorMover
    from memlayout.activations.model.parameter_class import attribute_tensors

    weight = bnb.nn.Params4bit(torch.randn(64, 32), requires_grad=False, quant_type="nf4")._quantize("cpu")
    mode = _torch.FakeTensorMode(allow_non_fake_inputs=True)
    moved = TensorMover("fake", "cpu", lambda: mode).move(weight)
    assert isinstance(moved, _torch.FakeTensor) and isinstance(moved, bnb.nn.Params4bit)
    assert type(moved).__name__ == "Params4bit" and isinstance(moved, torch.nn.Parameter)
    assert (moved.quant_type, moved.blocksize, moved.compress_statistics) == ("nf4", 64, weight.compress_statistics)
    state = list(attribute_tensors(moved))
    assert state and all(isinstance(t, _torch.FakeTensor) for t in state)
    assert sorted(t.untyped_storage().nbytes() for t in state) == sorted(
        t.untyped_storage().nbytes() for t in attribute_tensors(weight))
    with mode:  # bitsandbytes' own dequantization runs on it, as peft's DoRA runs it
        assert bnb.functional.dequantize_4bit(moved.data, moved.quant_state).shape == (64, 32)
