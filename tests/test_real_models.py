"""inspect on real architectures: transformers GPT-2 and BERT (built from configs), torch.nn LSTMs and conv nets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import memlayout
from tests.models import tiny_gpt2

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def tiny_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        vocab_size=128, max_position_embeddings=32,
    )
    return transformers.BertForMaskedLM(config)


def codes(target: object, **kwargs: object) -> set[str]:
    return {f.code for f in memlayout.inspect(target, **kwargs).findings}  # type: ignore[arg-type]


def test_tied_gpt2_has_no_tie_or_layout_problems() -> None:
    model = tiny_gpt2()
    report = memlayout.inspect(model)
    assert codes(model) == {"ML204"}
    wte = report.facts.tensor("transformer.wte.weight")
    assert wte is not None and wte.names == ("transformer.wte.weight", "lm_head.weight")
    # The tie is declared by the model class and kept.
    assert any(t.target == "lm_head.weight" for t in report.facts.declared_ties)


def test_gpt2_with_a_lost_tie_is_a_broken_tie_and_a_duplicate() -> None:
    model = tiny_gpt2()
    model.lm_head.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().clone())
    found = memlayout.inspect(model).findings
    assert {"ML102", "ML103"} <= {f.code for f in found}
    (broken,) = [f for f in found if f.code == "ML103"]
    assert set(broken.tensors) == {"lm_head.weight", "transformer.wte.weight"}
    assert "contents match" in broken.message


def test_gpt2_loaded_with_assign_has_two_parameters_on_one_storage() -> None:
    source, target = tiny_gpt2(), tiny_gpt2()
    target.load_state_dict(source.state_dict(), assign=True)
    assert target.lm_head.weight is not target.transformer.wte.weight
    assert "ML104" in codes(target)


def test_gpt2_state_dict_saved_and_reinspected_keeps_the_tie(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.pt"
    torch.save(tiny_gpt2().state_dict(), path)
    report = memlayout.inspect(str(path))
    wte = report.facts.tensor("transformer.wte.weight")
    assert wte is not None and "lm_head.weight" in wte.names
    assert {f.code for f in report.findings} <= {"ML204"}


def test_bert_keeps_its_decoder_ties() -> None:
    report = memlayout.inspect(tiny_bert())
    assert {f.code for f in report.findings} == {"ML204"}
    decoder = report.facts.tensor("cls.predictions.decoder.weight")
    assert decoder is not None and "bert.embeddings.word_embeddings.weight" in decoder.names


def test_bert_in_bf16_with_one_fp32_layer_is_mixed_dtype() -> None:
    model = tiny_bert().to(torch.bfloat16)
    model.bert.encoder.layer[0].output.dense.to(torch.float32)
    (finding,) = [f for f in memlayout.inspect(model).findings if f.code == "ML502"]
    assert set(finding.tensors) == {
        "bert.encoder.layer.0.output.dense.weight", "bert.encoder.layer.0.output.dense.bias"
    }


def test_bidirectional_lstm_on_cpu_is_not_flat_for_cudnn() -> None:
    lstm = torch.nn.LSTM(16, 16, num_layers=2, bidirectional=True, proj_size=8)
    report = memlayout.inspect(lstm)
    (finding,) = [f for f in report.findings if f.code == "ML401"]
    assert len(finding.tensors) == 2 * 2 * 5  # layers x directions x (w_ih, w_hh, b_ih, b_hh, w_hr)
    assert finding.tensors[:5] == ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_hr_l0")


def test_pickled_lstm_module_is_inspected_without_running_its_code(tmp_path: Path) -> None:
    path = tmp_path / "lstm.pt"
    torch.save(torch.nn.LSTM(8, 8, num_layers=2), path)
    report = memlayout.inspect(str(path))
    assert report.facts.source.format == "torch-zip"
    (root,) = [m for m in report.facts.modules if m.path == ""]
    assert root.class_name == "torch.nn.modules.rnn.LSTM"
    assert root.rnn is not None and root.rnn.flat_weight_names[0] == "weight_ih_l0"
    assert "ML401" in {f.code for f in report.findings}
    assert report.summary.parameters == 8


def test_channels_last_resnet_block_is_clean_but_a_mix_is_reported() -> None:
    block = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3), torch.nn.BatchNorm2d(16),
    ).to(memory_format=torch.channels_last)
    assert not {"ML201", "ML202"} & codes(block)
    block[3].weight.data = block[3].weight.data.contiguous()
    assert "ML202" in codes(block)


def test_pickled_module_inside_a_checkpoint_keeps_its_section_and_kinds(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model, "epoch": 1}, path)
    facts = memlayout.inspect(str(path)).facts
    by_name = {t.name: t for t in facts.tensors}
    assert {t.section for t in facts.tensors} == {"model"}
    assert by_name["model.0.weight"].kind.value == "parameter"
    assert by_name["model.1.running_mean"].kind.value == "buffer"
