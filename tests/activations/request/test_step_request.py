"""The step request: one object from flags, a config file or Python, checked once, its errors in its own terms."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from memlayout.activations.request.rules import RULES, STEP_SETTINGS
from memlayout.activations.request.step_request import GROUPS, PYTHON_ONLY, SETTINGS, StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.sizes import BudgetSpec
from memlayout.cli.activations_command import request_from_command_line
from memlayout.cli.activations_options import ROWS, flag
from memlayout.cli.app import app
from memlayout.errors import SettingError, respelled

TARGET = "tests.activations.models:gpt2"
INPUTS = ("int64[2,32]<500", "labels=int64[2,32]<500")


def command_line_request(args: list[str], cwd: Path | None = None) -> StepRequest:
    """The request `memlayout activations ARGS` makes, read as the command reads its options (no step is run)."""
    group = typer.main.get_command(app)
    parent = typer.Context(group)
    command = group.get_command(parent, "activations")  # type: ignore[attr-defined]
    context = command.make_context("activations", list(args), parent=parent)
    return request_from_command_line(dict(context.params))


def test_python_and_the_command_line_build_the_same_request() -> None:
    flags = ["--input", INPUTS[0], "--input", INPUTS[1], "--world-size", "8", "--fsdp", "--tp", "2", "--dtype",
             "bfloat16", "--param-dtype", "bf16", "--budget", "78GiB", "--optimizer", "sgd", "--format", "json",
             "--fsdp-modules", "transformer.h.*", "--no-reshard-after-forward", "--depth", "2", "--isolated"]
    python = StepRequest(TARGET, input=INPUTS, world_size=8, fsdp=True, tp=2, dtype="bf16", param_dtype="bfloat16",
                         budget=78 * 2**30, optimizer="sgd", format="json", fsdp_modules=["transformer.h.*"],
                         no_reshard_after_forward=True, depth=2)
    assert command_line_request([TARGET, *flags]) == python
    assert python.pipeline is Pipeline.RANKS and python.budget == BudgetSpec(bytes=78 * 2**30)


def test_either_spelling_of_a_dtype_is_the_same_setting() -> None:
    short = StepRequest(TARGET, input=INPUTS, dtype="bf16", autocast="fp16")
    assert StepRequest(TARGET, input=INPUTS, dtype="bfloat16", autocast="float16") == short
    assert StepRequest(TARGET, input=INPUTS, dtype="torch.bfloat16", autocast="fp16") == short
    assert short.dtype == "bf16"


def test_the_command_line_has_an_option_for_every_setting_and_each_is_in_a_group() -> None:
    options = {row.name for row in ROWS} - {"isolated", "config", "debug"}
    assert options == set(SETTINGS) | {"target"}
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields(StepRequest) if f.name != "pipeline")
    assert set(PYTHON_ONLY) - {"pipeline"} <= set(grouped)


def test_help_shows_the_options_in_their_groups() -> None:
    result = CliRunner().invoke(app, ["activations", "--help"])
    assert result.exit_code == 0
    headings = [line.rstrip(":") for line in result.output.splitlines() if line and not line[0].isspace()
                and line.endswith(":")]
    assert headings[:10] == ["Target", "Inputs", "Step", "Device", "Precision", "Budget and plans", "Ranks",
                             "Recipe", "Adapters", "Output"]
    ranks = result.output.split("\nRanks:\n")[1].split("\n\n")[0]
    assert "--world-size" in ranks and "--bucket-cap-mb" in ranks and "--lora" not in ranks


def test_gpu_help_lists_the_gpu_table() -> None:
    from memlayout.activations.device.gpus import GPUS

    result = CliRunner().invoke(app, ["activations", "--help"], terminal_width=400)
    assert ", ".join(spec.key for spec in GPUS) in " ".join(result.output.split())


@pytest.mark.parametrize(("settings", "says"), [
    ({"inputs": "m:inputs", "input": INPUTS}, "give `inputs` or `input`, not both"),
    ({"weights": True, "lora": 8}, "`weights=True` counts every parameter as trainable, and `lora` adapts the model"),
    ({"weights": True, "budget": "1GiB"}, "`weights=True` answers without tracing a step, and `budget` is for a step"),
    ({"fsdp": True}, "`fsdp` needs `world_size` N"),
    ({"input": INPUTS, "bucket_cap_mb": 1.0}, "`bucket_cap_mb` needs `world_size` N"),
    ({"input": INPUTS, "world_size": 2, "fsdp": True, "bucket_cap_mb": 1.0}, "`bucket_cap_mb` is DDP's"),
    ({"input": INPUTS, "world_size": 2, "ddp": True, "param_dtype": "bf16"}, "`param_dtype` is FSDP2's"),
    ({"input": INPUTS, "new_tokens": 4}, "`new_tokens` applies to `step=generate` only"),
    ({"input": INPUTS, "step": "generate"}, "`step=generate` needs `new_tokens` N"),
    ({"input": INPUTS, "lora_targets": "q"}, "`lora_targets` shapes LoRA adapters"),
    ({"input": INPUTS, "lora": 8, "world_size": 2, "fsdp": True}, "`lora` is not traced with `world_size` yet"),
    ({"input": INPUTS, "fit": "batch", "real": True, "budget": 10}, "`fit` searches on fake traces"),
    ({"input": INPUTS, "world_size": 2}, "`world_size` needs `fsdp` or `ddp`"),
    ({"input": INPUTS, "world_size": 3, "fsdp": True, "tp": 2}, "`tp` 2 does not divide `world_size` 3"),
    ({"input": INPUTS, "world_size": 2, "fsdp": True, "budget": 0.9},
     "`budget` 0.9 with `world_size` is a share of a GPU's memory, and no `gpu` is named"),
    ({"input": INPUTS, "world_size": 2, "ddp": True, "device": "cuda"}, "`ddp` is traced for `device=cpu`"),
    ({"input": INPUTS, "step": "inference", "optimizer": "sgd"}, "`optimizer` sgd does not apply to `step` inference"),
    ({"input": INPUTS, "fit": "width", "budget": 10}, "`fit` 'width' is not batch, seq or seq:N"),
    ({"input": INPUTS, "dtype": "fp64"}, "unknown precision 'fp64'"),
    ({"input": INPUTS, "budget": "lots"}, "`budget` 'lots' is not a size"),
])
def test_settings_that_do_not_go_together_are_refused_by_their_names(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(SettingError) as raised:
        StepRequest(TARGET, **settings)
    assert says in raised.value.one_line()
    assert "--" not in raised.value.one_line()  # the library speaks of settings, never of flags


@pytest.mark.parametrize("settings", [
    {"fit": "batch", "budget": "1GiB", "lora": 8, "quantize": "nf4"},
    {"fit": "seq", "gpu": "h100"},
    {"fit": "batch", "budget": 10**9, "dtype": "bf16", "autocast": "bf16"},
    {"step": "generate", "new_tokens": 4, "cache": "static", "fit": "seq", "budget": 10**9},
    {"world_size": 4, "ddp": True, "bucket_cap_mb": 0.5, "gradient_as_bucket_view": True, "budget": 10**9},
    {"world_size": 2, "tp": 2, "step": "inference"},
])
def test_settings_that_go_together_are_taken(settings: dict[str, Any]) -> None:
    request = StepRequest(TARGET, input=INPUTS, **settings)
    assert all(getattr(request, name) == value or name == "budget" for name, value in settings.items())


def test_every_rule_names_only_settings_the_request_has() -> None:
    import re

    names = set(SETTINGS)
    for rule in RULES:
        for text in (rule.message, rule.hint):
            named = {match.group(1) for match in re.finditer(r"`([a-z_]+)(?:=[^`]*)?`", text)}
            assert named <= names, (text, named - names)
    assert set(STEP_SETTINGS) <= names


def test_the_command_line_says_each_setting_as_its_flag() -> None:
    text = "e.g. `world_size=8` `fsdp=True`, or `budget=78GiB` with `target`; `nothing` stays"
    assert respelled(text, flag) == "e.g. --world-size 8 --fsdp, or --budget 78GiB with TARGET; `nothing` stays"
    result = CliRunner().invoke(app, ["activations", TARGET, "--input", INPUTS[0], "--world-size", "3", "--fsdp",
                                      "--tp", "2", "--isolated"])
    assert result.exit_code == 2
    assert result.output == ("memlayout: error: --tp 2 does not divide --world-size 3 (the ranks form a (data "
                             "parallel x tensor parallel) grid: pick a world size that is a multiple of --tp)\n")


def test_python_callers_are_told_the_setting_not_the_flag() -> None:
    import memlayout.activations as act
    from memlayout.activations.weights import weights_report

    with pytest.raises(SettingError, match=r"`world_size` needs `fsdp` or `ddp`") as raised:
        act.analyze_ranks(TARGET, list(INPUTS), world_size=2)
    assert raised.value.settings == ("world_size", "fsdp", "ddp")
    with pytest.raises(SettingError, match="no setting 'world_sise'"):
        act.analyze(TARGET, list(INPUTS), world_sise=2)
    with pytest.raises(SettingError, match="`world_size` asks for another prediction than one step"):
        act.analyze(TARGET, list(INPUTS), world_size=2, fsdp=True)
    with pytest.raises(SettingError, match="ranks are predicted for `world_size` N of them"):
        act.analyze_ranks(TARGET, list(INPUTS))
    with pytest.raises(SettingError, match="`weights=True` counts every parameter as trainable, and `lora`"):
        weights_report(TARGET, lora=8)


def write_config(folder: Path, table: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text(f"[project]\nname = 'x'\n\n[tool.memlayout.activations]\n{table}\n")
    return path


def test_the_config_file_is_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ["--input", INPUTS[0], "--input", INPUTS[1], "--world-size", "4", "--fsdp", "--tp", "2",
             "--param-dtype", "bf16", "--budget", "0.5GiB", "--format", "json"]
    write_config(tmp_path, f'input = {list(INPUTS)!r}\nworld-size = 4\nfsdp = true\ntp = 2\nparam-dtype = "bfloat16"\n'
                           'budget = "0.5GiB"\nformat = "json"\n')
    monkeypatch.chdir(tmp_path)
    from_file = command_line_request([TARGET])
    assert from_file == command_line_request([TARGET, *flags, "--isolated"])
    # A flag replaces the file's value; a list flag replaces the whole list.
    replaced = command_line_request([TARGET, "--world-size", "8", "--input", "int64[1,8]<500"])
    assert replaced.world_size == 8 and replaced.input == ("int64[1,8]<500",) and replaced.fsdp
    assert command_line_request([TARGET, "--isolated"]).world_size is None


def test_a_config_file_named_with_config(tmp_path: Path) -> None:
    path = tmp_path / "activations.toml"
    path.write_text('input = ["float32[2,3,16,16]"]\ndepth = 1\noptimizer = "sgd"\n')
    request = command_line_request(["tests.activations.models:flat_cnn", "--config", str(path)])
    assert request == StepRequest("tests.activations.models:flat_cnn", input=("float32[2,3,16,16]",), depth=1,
                                  optimizer="sgd")


@pytest.mark.parametrize(("table", "says"), [
    ("world_size = 8", "[tool.memlayout.activations] has no setting 'world_size'"),
    ("fsdps = true", "has no setting 'fsdps'"),
    ('fsdp = "yes"', "fsdp must be true or false, not 'yes'"),
    ("input = [1, 2]", "input must be a list of strings"),
])
def test_a_bad_key_in_the_config_file_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            table: str, says: str) -> None:
    write_config(tmp_path, table)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["activations", TARGET])
    assert result.exit_code == 2
    assert result.output.startswith("memlayout: error: pyproject.toml: ") and says in result.output
    assert result.output.count("\n") == 1


def test_inspect_reads_its_table_beside_the_activations_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memlayout.pipeline.config import resolve_settings

    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.memlayout]\nfail-on = "error"\n\n[tool.memlayout.activations]\nfsdp = true\n')
    monkeypatch.chdir(tmp_path)
    assert resolve_settings().fail_on.value == "error"
