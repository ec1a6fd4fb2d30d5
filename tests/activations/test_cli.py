"""`memlayout activations` on the command line: outputs, the budget's exit code, one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests.activations import models

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "memlayout" / "activations" / "schema_v1.json").read_text())
GPT2 = ["activations", "tests.activations.models:gpt2", "--input", "int64[2,32]<500", "--input", "labels=int64[2,32]<500"]


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_json_report_follows_its_schema() -> None:
    code, out, err = run([*GPT2, "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    assert report["loss"] == "output.loss"
    assert report["plan"] is None
    summary = report["summary"]
    assert summary["peak_bytes"] >= summary["activation_bytes"] + summary["parameter_bytes"]
    paths = [m["path"] for m in report["modules"]]
    assert paths[0] == "" and "transformer.h.1.mlp" in paths
    dropout = next(m for m in report["modules"] if m["path"] == "transformer.drop")
    assert dropout["uses_randomness"] and dropout["saved_bytes"] > 0
    head = next(m for m in report["modules"] if m["path"] == "lm_head")
    assert head["forward_flops"] == 2 * 2 * 32 * 64 * 500  # 2 * tokens * width * vocab


def test_json_report_with_a_plan_follows_its_schema(tmp_path: Path) -> None:
    code, out, _ = run([*GPT2, "--format", "json"])
    peak = json.loads(out)["summary"]["peak_bytes"]
    target = tmp_path / "report.json"
    # 0.85: the lowest peak a plan reaches is 0.802x, once each checkpointed call's generator state counts
    code, out, err = run([*GPT2, "--format", "json", "--budget", str(int(peak * 0.85)), "-o", str(target)])
    assert code == 0, err
    assert out == ""
    report = json.loads(target.read_text())
    jsonschema.validate(report, SCHEMA)
    plan = report["plan"]
    assert plan["budget_bytes"] == int(peak * 0.85)
    assert plan["peak_bytes"] <= plan["budget_bytes"]
    assert plan["checkpoint"] or plan["sequential"]
    assert plan["recompute_flops"] > 0 or all("act" in p or "drop" in p for p in plan["checkpoint"])
    assert any("use_reentrant=False" in p for p in plan["pitfalls"])
    assert any("use_cache=False" in p for p in plan["pitfalls"])


def test_table_report() -> None:
    code, out, err = run([*GPT2, "--budget", "1GiB"])
    assert code == 0, err
    assert "peak" in out and "transformer.h.0" in out
    assert "nothing to checkpoint" in out


def test_unreachable_budget_exits_1_with_one_line() -> None:
    code, out, err = run([*GPT2, "--budget", "1KiB"])
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("memlayout: error: no checkpoint plan found fits a budget of 1.0 KiB")
    assert re.search(r"the lowest peak of \d+ plans? traced, over module and segment plans, is", lines[0])
    assert "reachable" not in lines[0]  # said only of what the search proves


def test_inputs_factory() -> None:
    code, out, err = run(["activations", "tests.activations.models:gpt2", "--inputs",
                          "tests.activations.models:gpt2_inputs", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["loss"] == "output.loss"
    assert report["inputs"] == ["tests.activations.models:gpt2_inputs"]


def test_hugging_face_config_directory_is_built_without_weights(tmp_path: Path) -> None:
    models.gpt2().config.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    code, out, err = run(["activations", str(tmp_path), "--input", "int64[2,32]<500", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["target"]["kind"] == "hf-config" and report["target"]["class"] == "GPT2LMHeadModel"
    assert report["loss"] == "sum of floating outputs"
    code, out_json, err = run(["activations", str(tmp_path / "config.json"), "--input", "int64[2,32]<500",
                               "--format", "json"])
    assert code == 0, err
    assert json.loads(out_json)["summary"] == report["summary"]


def test_pickled_module_needs_trust(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(models.flat_cnn(), path)
    code, out, err = run(["activations", str(path), "--input", "float32[2,3,16,16]"])
    assert code == 2 and out == ""
    assert err.startswith("memlayout: error: ") and "--trust" in err and len(err.strip().splitlines()) == 1
    code, out, err = run(["activations", str(path), "--input", "float32[2,3,16,16]", "--trust", "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["target"]["class"] == "Sequential"


def test_real_run_on_cpu_agrees_with_the_fake_one() -> None:
    cnn = ["activations", "tests.activations.models:flat_cnn", "--input", "float32[2,3,16,16]", "--format", "json"]
    code, fake, err = run(cnn)
    assert code == 0, err
    code, real, err = run([*cnn, "--real"])
    assert code == 0, err
    assert json.loads(real)["mode"] == "real"
    assert json.loads(real)["summary"]["peak_bytes"] == json.loads(fake)["summary"]["peak_bytes"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["activations", "no_such_module_xyz:build", "--input", "float32[2]"], "cannot import"),
        (["activations", "/no/such/file.pt", "--input", "float32[2]"], "does not exist"),
        ([*GPT2[:2], "--budget", "1GiB"], "no inputs"),
        ([*GPT2, "--weights"], "--weights answers without tracing a step, and --input is for a step"),
        ([*GPT2[:2], "--weights", "--budget", "1GiB"], "--budget is for a step"),
        ([*GPT2[:2], "--model-class", "GPT2Model"], "--model-class chooses the class a Hugging Face config builds"),
        ([*GPT2, "--input", "float32[2,x]"], "not an input spec"),
        ([*GPT2, "--budget", "lots"], "is not a size"),
        ([*GPT2, "--format", "xml"], "Invalid value for '--format' / '-f': 'xml' is not one of 'table', 'json'."),
        ([*GPT2, "--format", "sarif"], "'sarif' is not one of 'table', 'json' (sarif is for inspect)."),
        ([*GPT2, "--real", "--device", "meta"], "--real needs a device with memory"),
        ([*GPT2, "--device", "tpu"], "Invalid value for '--device': 'tpu' is not one of 'cpu', 'cuda', 'cuda:N', 'meta'."),
        ([*GPT2[:2], "--inputs", "a.b:c", "--input", "float32[2]"], "not both"),
        (["activations", "tests.activations.models:token_inputs", "--input", "float32[2]"], "calling"),
        (["activations", "tests.activations.models:gpt2_inputs", "--input", "float32[2]"], "not an nn.Module"),
        (["activations", "tests.activations.models:flat_cnn", "--input", "int64[2,3,8,8]<5"], "the step failed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out, err = run(args)
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("memlayout: error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_the_json_plan_applied_as_printed_fits_for_real() -> None:
    """The table says: apply the "plan" object of --format json with apply_plan. Follow it."""
    import memlayout.activations as act
    from tests.activations.measure import memtracker_step

    args, _ = models.image_inputs(8, 32)
    plain = memtracker_step(models.flat_cnn(), args, {})
    budget = int(plain.peak_bytes * 0.8)
    code, out, err = run(["activations", "tests.activations.models:flat_cnn", "--input", "float32[8,3,32,32]",
                          "--budget", str(budget), "--format", "json"])
    assert code == 0, err
    plan = json.loads(out)["plan"]
    model = models.flat_cnn()
    with act.apply_plan(model, plan):
        planned = memtracker_step(model, args, {})
    assert planned.peak_bytes <= budget
    assert torch.equal(planned.loss, plain.loss)


def test_meta_device_traces_and_says_what_it_cannot_see() -> None:
    code, out, err = run(["activations", "tests.activations.models:lstm_lm", "--input", "int64[2,16]<500",
                          "--device", "meta", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    assert report["mode"] == "meta" and report["device"] == "meta"
    assert any("meta tensors have no device" in note for note in report["notes"])


def _suggested_flags(out: str) -> list[str]:
    """The flags of the command the weights report prints for tracing a step."""
    import shlex

    command = out.rstrip("\n").splitlines()[-1].strip()
    assert command.startswith("memlayout activations "), out
    return [flag for flag in shlex.split(command)[3:]]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: models.gpt2(vocab=500, positions=64), ["--input", "input_ids=int64[4,64]<500",
                                                        "--input", "labels=int64[4,64]<500"]),
        (lambda: models.bert(vocab=500), ["--input", "input_ids=int64[4,128]<500",
                                          "--input", "labels=int64[4,128]<500"]),
    ],
)
def test_a_config_without_inputs_suggests_inputs_read_from_it_and_they_run(
    tmp_path: Path, build: Any, expected: list[str]
) -> None:
    """Without inputs, the weights report ends with the command that traces a step: token ids below the
    vocabulary and within the positions, never an image input. Following it runs the step."""
    build().config.save_pretrained(tmp_path)
    code, out, err = run(["activations", str(tmp_path / "config.json")])
    assert code == 0 and err == "", err
    assert "224" not in out and "float32[" not in out
    flags = _suggested_flags(out)
    assert flags == expected
    code, out, err = run(["activations", str(tmp_path / "config.json"), *flags, "--optimizer", "none"])
    assert code == 0, err
    assert "peak" in out


def test_a_vision_config_without_inputs_suggests_pixel_values_of_its_size(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                    intermediate_size=64, image_size=32, patch_size=8, num_channels=3)
    config.save_pretrained(tmp_path)
    code, out, err = run(["activations", str(tmp_path)])
    assert code == 0, err
    flags = _suggested_flags(out)
    assert flags == ["--input", "pixel_values=float32[4,3,32,32]"]
    code, out, err = run(["activations", str(tmp_path), *flags, "--optimizer", "none"])
    assert code == 0 and "peak" in out, err


def test_real_prints_the_prediction_against_what_it_measured() -> None:
    """--real is a check: its report carries the fake-tensor prediction beside the measured peak,
    in the table and in JSON, and the prediction is what a run without --real reports."""
    cnn = ["activations", "tests.activations.models:flat_cnn", "--input", "float32[2,3,16,16]"]
    code, fake, err = run([*cnn, "--format", "json"])
    assert code == 0, err
    code, real, err = run([*cnn, "--real", "--format", "json"])
    assert code == 0, err
    report = json.loads(real)
    jsonschema.validate(report, SCHEMA)
    assert report["predicted_peak_bytes"] == json.loads(fake)["summary"]["peak_bytes"]
    assert json.loads(fake)["predicted_peak_bytes"] is None
    code, table, err = run([*cnn, "--real"])
    assert code == 0, err
    line = next(line for line in table.splitlines() if "predicted" in line)
    assert "measured" in line and "real step" in line
    code, table, err = run(cnn)
    assert "predicted" not in table
