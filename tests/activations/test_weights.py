"""`activations --weights` (and no --input): the weights in each dtype and the fixed costs of training, checked
against the real model's tensors, a real AdamW step, a traced step, and the same model read from its checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from memlayout.activations.weights import WeightsReport, weights_report
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.measure import state_bytes

transformers = pytest.importorskip("transformers")

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "memlayout" / "activations" / "weights_schema_v1.json").read_text()
)
VOCAB = 500


def _t5() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config).train()


BUILDS: dict[str, Callable[[], torch.nn.Module]] = {
    "gpt2-tied": models.gpt2, "llama-untied": models.llama, "bert": models.bert, "t5": _t5,
}


def _row(report: WeightsReport, dtype: str) -> Any:
    return next(row for row in report.rows if row.dtype == dtype)


def _real_step(model: torch.nn.Module) -> tuple[int, int]:
    """(gradient bytes, AdamW state bytes) after a real training step with labels, as a training script runs it."""
    ids = torch.randint(0, VOCAB, (2, 16))
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    grads = state_bytes([p.grad for p in model.parameters()])
    return grads, state_bytes([v for s in optimizer.state.values() for v in s.values()])


@pytest.mark.parametrize("name", list(BUILDS))
def test_the_counts_are_the_real_models_and_a_real_adamw_step_holds_the_training_columns(
    name: str, tmp_path: Path
) -> None:
    model = BUILDS[name]()
    model.config.save_pretrained(tmp_path)
    report = weights_report(str(tmp_path))
    assert report.model_class == type(model).__name__
    assert report.parameters == sum(p.numel() for p in model.parameters())  # a tie once
    float32 = _row(report, "float32")
    assert float32.parameter_bytes == state_bytes(list(model.parameters()))
    assert float32.buffer_bytes == state_bytes(list(model.buffers()))
    assert float32.training is not None
    assert (float32.training.gradient_bytes, float32.training.optimizer_bytes) == _real_step(model)

    model.to(torch.bfloat16)  # pure bf16 training: torch's AdamW keeps its state in the parameters' dtype
    for parameter in model.parameters():
        parameter.grad = None
    half = _row(report, "bfloat16")
    assert half.parameter_bytes == state_bytes(list(model.parameters()))
    assert half.buffer_bytes == state_bytes(list(model.buffers()))
    assert half.training is not None
    assert (half.training.gradient_bytes, half.training.optimizer_bytes) == _real_step(model)


def test_the_weights_are_the_model_state_a_traced_step_holds(tmp_path: Path) -> None:
    from memlayout.activations import analyze

    models.llama().config.save_pretrained(tmp_path)
    report = weights_report(str(tmp_path))
    traced = analyze(str(tmp_path), [f"input_ids=int64[2,16]<{VOCAB}", f"labels=int64[2,16]<{VOCAB}"]).summary
    float32 = _row(report, "float32")
    assert float32.training is not None
    assert (float32.parameter_bytes, float32.buffer_bytes) == (traced.parameter_bytes, traced.buffer_bytes)
    assert float32.training.gradient_bytes == traced.gradient_bytes
    assert float32.training.optimizer_bytes == traced.optimizer_bytes


def _save_weights_only(model: torch.nn.Module, folder: Path, how: str) -> Path:
    if how == "safetensors-shards":
        model.save_pretrained(folder, max_shard_size="20KB")  # type: ignore[operator]
        (folder / "config.json").unlink()
        return folder
    if how == "bin":
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        return folder / "pytorch_model.bin"
    assert how == "pickled-module"
    torch.save(model, folder / "model.pt")
    return folder / "model.pt"


@pytest.mark.parametrize("how", ["safetensors-shards", "bin", "pickled-module"])
@pytest.mark.parametrize("name", ["gpt2-tied", "llama-untied"])
def test_a_checkpoints_headers_give_the_configs_parameters(name: str, how: str, tmp_path: Path) -> None:
    """Read from headers alone: the same parameters; the buffers a checkpoint holds (a Llama's rotary table is
    non-persistent, so only the pickled module, which is the whole module, holds it)."""
    model = BUILDS[name]()
    (tmp_path / "config").mkdir()
    model.config.save_pretrained(tmp_path / "config")
    built = weights_report(str(tmp_path / "config"))
    (tmp_path / "weights").mkdir()
    read = weights_report(str(_save_weights_only(model, tmp_path / "weights", how)))
    assert read.counted_from == "the checkpoint's headers" and read.target_kind == "checkpoint"
    assert (read.parameters, read.parameter_tensors) == (built.parameters, built.parameter_tensors)
    persistent = state_bytes([b for n, b in model.named_buffers() if n in model.state_dict()])
    held = state_bytes(list(model.buffers())) if how == "pickled-module" else persistent
    assert _row(read, "float32").buffer_bytes == held
    for built_row, read_row in zip(built.rows, read.rows, strict=True):
        assert read_row.parameter_bytes == built_row.parameter_bytes
        if built_row.training is not None and read_row.training is not None:
            assert read_row.training.optimizer_bytes == built_row.training.optimizer_bytes
    assert read.model_class == (type(model).__name__ if how == "pickled-module" else None)


def test_a_state_dicts_batch_norm_statistics_are_buffers(tmp_path: Path) -> None:
    model = models.flat_cnn()
    torch.save(model.state_dict(), tmp_path / "cnn.pt")
    read = weights_report(str(tmp_path / "cnn.pt"))
    built = weights_report("tests.activations.models:flat_cnn")
    assert (read.parameters, read.buffers) == (built.parameters, built.buffers)
    assert read.trainable_parameters == sum(p.numel() for p in model.parameters())
    assert [row.training for row in read.rows] == [row.training for row in built.rows]


def test_int4_packs_two_to_a_byte_and_only_trainable_parameters_train() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Linear(1, 5))
    model[1].requires_grad_(False)
    report = weights_report(model)
    # Linear(3, 1): 3 + 1 elements; Linear(1, 5): 5 + 5. int4 rounds each tensor up to a whole byte.
    assert _row(report, "int4").parameter_bytes == 2 + 1 + 3 + 3
    assert _row(report, "int8").parameter_bytes == 14
    float32 = _row(report, "float32").training
    assert float32 is not None and float32.gradient_bytes == 4 * 4
    real = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter) if parameter.requires_grad else None
    real.step()
    assert float32.optimizer_bytes == state_bytes([v for s in real.state.values() for v in s.values()])
    assert report.trainable_parameters == 4 and report.parameters == 14


@pytest.mark.parametrize("optimizer", ["sgd", "none"])
def test_the_optimizer_decides_the_state(optimizer: str) -> None:
    model = models.flat_cnn()
    report = weights_report(model, optimizer=optimizer)
    float32 = _row(report, "float32").training
    assert float32 is not None
    expected = state_bytes(list(model.parameters())) if optimizer == "sgd" else 0  # one momentum buffer each
    assert float32.optimizer_bytes == expected


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_the_json_follows_its_schema_and_the_table_says_the_same(tmp_path: Path) -> None:
    models.gpt2().config.save_pretrained(tmp_path)
    code, out, err = run(["activations", str(tmp_path), "--weights", "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["report"] == "activations-weights" and data["target"]["class"] == "GPT2LMHeadModel"
    assert [row["dtype"] for row in data["dtypes"]] == ["float32", "bfloat16", "int8", "int4"]
    assert data["dtypes"][2]["training"] is None
    code, table, err = run(["activations", str(tmp_path)])
    assert code == 0, err
    row = next(line for line in table.splitlines() if line.startswith("│ float32 "))
    from memlayout.format_bytes import human_bytes

    training = data["dtypes"][0]["training"]
    assert [cell.strip() for cell in row.strip("│").split("│")] == [
        "float32", human_bytes(data["dtypes"][0]["weights_bytes"]), human_bytes(training["gradient_bytes"]),
        human_bytes(training["optimizer_bytes"]), human_bytes(training["total_bytes"]),
    ]
