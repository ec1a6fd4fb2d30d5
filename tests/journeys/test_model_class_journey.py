"""A T5 config.json without `architectures`, given labels, as a new user tried it.

`activations` built the base `T5Model` in silence, and the step failed with "You must
specify exactly one of input_ids or inputs_embeds": a T5 without its head takes no
labels. With no class named, the model type's head with a loss is built now, every
report says which class and why, and `--model-class` chooses another.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests.activations.measure import allocator_peak_step

transformers = pytest.importorskip("transformers")

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "memlayout" / "activations" / "schema_v1.json").read_text())
VOCAB, BATCH, LENGTH = 200, 2, 16
INPUTS = ["--input", f"input_ids=int64[{BATCH},{LENGTH}]<{VOCAB}", "--input", f"labels=int64[{BATCH},{LENGTH}]<{VOCAB}"]


def _t5_config() -> object:
    return transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                 decoder_start_token_id=0)


@pytest.fixture
def t5_config(tmp_path: Path) -> Path:
    _t5_config().save_pretrained(tmp_path)  # type: ignore[attr-defined]
    path = tmp_path / "config.json"
    assert "architectures" not in json.loads(path.read_text())  # as the user's config had none
    return path


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_labels_build_the_head_with_a_loss_and_every_report_says_which(t5_config: Path) -> None:
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    assert report["target"]["class"] == "T5ForConditionalGeneration"
    chosen_by = report["target"]["class_chosen_by"]
    assert "names no architectures" in chosen_by and "AutoModelForSeq2SeqLM" in chosen_by, chosen_by
    assert report["loss"] == "output.loss"

    code, table, err = run(["activations", str(t5_config), *INPUTS, "--depth", "0"])
    assert code == 0, err
    model_line = next(line for line in table.splitlines() if "│ model " in line)
    assert "T5ForConditionalGeneration (config.json names no architectures" in model_line

    # The prediction against a real CPU step of the same class, judged by the CPU allocator's events.
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(_t5_config())
    kwargs = {name: torch.randint(0, VOCAB, (BATCH, LENGTH)) for name in ("input_ids", "labels")}
    real = allocator_peak_step(model, (), kwargs)
    predicted = report["summary"]["peak_bytes"]
    assert abs(predicted - real.peak_bytes) <= 0.02 * real.peak_bytes, (predicted, real.peak_bytes)


def test_model_class_chooses_and_the_failure_names_the_class(t5_config: Path) -> None:
    """--model-class T5Model builds what was built in silence before: its failure now names the class."""
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--model-class", "T5Model"])
    assert code == 2 and out == ""
    assert err.startswith("memlayout: error: the step failed on T5Model: ValueError: You must specify exactly one")
    assert len(err.strip().splitlines()) == 1
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--model-class", "AutoModelForSeq2SeqLM",
                          "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["target"]["class_chosen_by"] == "--model-class AutoModelForSeq2SeqLM"


def test_a_model_class_for_another_type_is_one_line_naming_what_fits(t5_config: Path) -> None:
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--model-class", "GPT2LMHeadModel"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "is built from a GPT2Config, and config.json is a T5Config" in err
    hint = err.split("pick one of ", 1)[1]
    named = hint.split(", ")[0].strip(" )\n")
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--model-class", named, "--format", "json"])
    assert code == 0, err  # the first class the hint names builds, and takes the labels
    assert json.loads(out)["target"]["class"] == named


def test_without_inputs_the_weights_report_names_the_class_and_its_suggestion_runs(t5_config: Path) -> None:
    """No --input: the weights report, which says the class and ends with a command whose inputs carry labels."""
    code, out, err = run(["activations", str(t5_config), "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["target"]["class"] == "T5ForConditionalGeneration"
    assert "names no architectures" in report["target"]["class_chosen_by"]
    code, out, err = run(["activations", str(t5_config)])
    assert code == 0, err
    command = shlex.split(out.rstrip("\n").splitlines()[-1])
    assert command == shlex.split(report["next_command"])
    assert command[:3] == ["memlayout", "activations", str(t5_config)]
    assert any(flag.startswith("labels=") for flag in command)
    code, out, err = run([*command[1:], "--optimizer", "none", "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["loss"] == "output.loss"


def test_the_fit_report_says_the_class_too(t5_config: Path) -> None:
    # A forward-only fit: the header is the same, and a training fit's plan search on this T5 took 180 s of CI.
    code, out, err = run(["activations", str(t5_config), *INPUTS, "--fit", "batch", "--budget", "4MiB",
                          "--step", "inference"])
    assert code == 0, err
    assert "  model       T5ForConditionalGeneration (config.json names no architectures" in out
