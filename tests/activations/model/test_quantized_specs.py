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


def _mappings_of(path: str) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each mapping of the file in this process, from /proc/self/smaps."""
    found: list[list[int]] = []
    current: list[int] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:  # a mapping's header line
            current = None
            if len(parts) >= 6 and parts[5] == path:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                current = [start, end, 0]
                found.append(current)
        elif current is not None and parts[0] == "Rss:":
            current[2] = int(parts[1]) * 1024
    return [(start, end, rss) for start, end, rss in found]


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_a_4bit_model_loaded_on_the_cpu_keeps_its_whole_checkpoint_mapped(tmp_path: Path) -> None:
    """What docs/activations-fine-tune.md says: the unquantized weights (embeddings, norms, the head) are views into the
    memory-mapped safetensors file, so the whole file, the float weights of every quantized layer included, stays
    mapped and mostly resident until the model is freed. The prediction counts the model's own tensors only."""
    import gc

    import bitsandbytes as bnb

    directory = lora_models.saved("llama", tmp_path)
    checkpoint = str((directory / "model.safetensors").resolve())
    model = lora_models.quantized_from(directory)
    mappings = _mappings_of(checkpoint)
    assert len(mappings) == 1, mappings
    start, end, resident = mappings[0]
    size = Path(checkpoint).stat().st_size
    assert end - start >= size  # the whole file, not the unquantized weights alone
    unquantized = [p for p in model.parameters() if not isinstance(p, bnb.nn.Params4bit)]
    assert unquantized and all(start <= p.data_ptr() < end for p in unquantized)
    held = sum(p.numel() * p.element_size() for p in unquantized)
    assert resident > 1.5 * held, (resident, held)  # the quantized layers' float weights were read, and stay
    del model, unquantized
    gc.collect()
    assert _mappings_of(checkpoint) == []  # the weights alone kept it
