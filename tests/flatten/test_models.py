"""Real models: tiny GPT-2 and BERT (tied embeddings), an LSTM LM, a weight-dropout LSTM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import memlayout
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.live import flatten_object, live_facts
from tests.flatten.conftest import assert_flat_invariants, snapshot
from tests.flatten.models import LstmLM, WeightDropLSTM

transformers = pytest.importorskip("transformers")
FIXED_BY_FLATTEN = {"ML201", "ML203", "ML204", "ML301", "ML401"}


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97, n_positions=16)
    return transformers.GPT2LMHeadModel(config).eval()


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=97,
        max_position_embeddings=16,
    )
    return transformers.BertForMaskedLM(config).eval()


@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_transformers_model_flattens_with_identical_outputs(build: object, tmp_path: Path) -> None:
    model = build()  # type: ignore[operator]
    tokens = torch.randint(0, 97, (2, 8))
    expected = model(tokens).logits
    before, values = live_facts(model), snapshot(model)
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is embedding
    handle = flatten_object(model)
    assert_flat_invariants(before, values, model)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert torch.equal(model(tokens).logits, expected)
    assert not FIXED_BY_FLATTEN & {f.code for f in memlayout.inspect(model).findings}
    assert not flatten_object(model).changed
    assert len(handle.groups) < len(before.storages)


@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_transformers_state_dict_file_round_trips(build: object, tmp_path: Path) -> None:
    model = build()  # type: ignore[operator]
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(model.state_dict(), src)
    flatten_path(str(src), FlattenOptions(out=str(out), device="cpu"))
    fresh = build()  # type: ignore[operator]
    memlayout.load_flat(fresh, str(out))
    tokens = torch.randint(0, 97, (1, 8))
    assert torch.equal(fresh(tokens).logits, model(tokens).logits)
    assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight
    assert not FIXED_BY_FLATTEN & {f.code for f in memlayout.inspect(str(out)).findings}


def test_lstm_language_model_outputs_identical_and_ml401_gone() -> None:
    model = LstmLM().eval()
    tokens = torch.randint(0, 50, (3, 7))
    expected = model(tokens)
    assert "ML401" in {f.code for f in memlayout.inspect(model).findings}
    flatten_object(model)
    assert torch.equal(model(tokens), expected)
    assert not FIXED_BY_FLATTEN & {f.code for f in memlayout.inspect(model).findings}


def test_weight_dropout_lstm_says_it_cannot_fix_ml402(tmp_path: Path) -> None:
    model = WeightDropLSTM().eval()
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(model, src)
    result = flatten_path(str(src), FlattenOptions(out=str(out), device="cpu", trust=True))
    assert any("ML402" in note for note in result.notes)
    loaded = torch.load(out, weights_only=False)
    x = torch.randn(3, 1, 8)
    assert torch.equal(loaded(x)[0], model(x)[0])
