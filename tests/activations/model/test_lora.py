"""`--lora`, `--dora` and `--quantize`: predicted on fake tensors, judged by real peft and bitsandbytes steps.

Goals (issue 38): `--lora 16` on a Llama, a GPT-2 and a BERT directory, and `--dora`, within 2% of the CPU
allocator's events on a real step; `--quantize nf4 --lora 16` on a Llama directory within 3% of a real CPU QLoRA
step, its 4-bit state within 1% of what bitsandbytes allocates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.model.adapters import LoraOptions
from memlayout.cli.app import app
from tests.activations import lora_models, models

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")


def _bitsandbytes_packs_for_this_cpu() -> bool:
    """Whether bitsandbytes takes its AVX512-BF16 CPU path here (`has_avx512bf16`): a Linear4bit's first forward
    outside training repacks its weight and its absmax to bfloat16 in place, and later forwards run a fused kernel
    that dequantizes nothing whole. memlayout models the other path, which every CPU without AVX512-BF16 takes."""
    from bitsandbytes.functional import has_avx512bf16

    return bool(has_avx512bf16())


AVX512_BF16_PATH = pytest.mark.xfail(
    _bitsandbytes_packs_for_this_cpu(), strict=True,
    reason="bitsandbytes' AVX512-BF16 CPU path (repacked weights, a fused 4-bit kernel) is not modelled yet: the "
           "real model's state and its inference peak differ from the path memlayout traces",
)
SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
INPUTS = ["int64[4,32]<500", "labels=int64[4,32]<500"]
FLAGS = [flag for spec in INPUTS for flag in ("--input", spec)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora-models")


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["activations", *args])
    return result.exit_code, result.stdout, result.stderr


def within(predicted: int, measured: int, share: float) -> bool:
    return abs(predicted - measured) <= share * measured


def test_lora_serving_a_generate_matches_a_real_peft_generate(folder: Path) -> None:
    """A LoRA model served before its adapters are merged: each targeted projection runs its adapter beside it
    in every forward of generate."""
    import torch

    from tests.activations.measure import allocator_generate_peak

    directory = str(lora_models.saved("llama", folder))
    report = act.analyze(directory, ["int64[4,48]<500"], step="generate", new_tokens=8, lora=16)
    real = lora_models.with_lora(lora_models.BUILDERS["llama"](), r=16)
    ids = torch.randint(0, 500, (4, 48), generator=torch.Generator().manual_seed(0))
    # An end-of-sequence id no token can be: the real generate runs every token, as the prediction assumes.
    measured, out = allocator_generate_peak(real, (ids,), {}, max_new_tokens=8, do_sample=False, eos_token_id=500)
    assert tuple(out.shape) == (4, 56)
    assert within(report.summary.peak_bytes, measured, 0.02), (report.summary.peak_bytes, measured)
    base = act.analyze(directory, ["int64[4,48]<500"], step="generate", new_tokens=8)
    assert base.summary.peak_bytes < report.summary.peak_bytes  # the adapters are in the figure


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_lora_on_a_directory_matches_the_allocator_events_of_a_real_peft_step(name: str, folder: Path) -> None:
    directory = lora_models.saved(name, folder)
    report = act.analyze(str(directory), INPUTS, lora=16)
    real = lora_models.with_lora(lora_models.BUILDERS[name](), r=16)
    measured = lora_models.real_peak(real)
    assert within(report.summary.peak_bytes, measured, 0.02), (report.summary.peak_bytes, measured)
    # Only the adapters train: their gradients and AdamW's two states, nothing for the frozen base.
    trainable = sum(p.numel() * p.element_size() for p in real.parameters() if p.requires_grad)
    assert report.parameters is not None and report.parameters.trainable_bytes == trainable
    assert report.summary.gradient_bytes == trainable
    assert report.summary.optimizer_bytes == 2 * trainable + 4 * sum(1 for p in real.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in real.parameters() if not p.requires_grad)
    assert report.parameters.frozen_count == frozen


def test_dora_matches_a_real_peft_step(folder: Path) -> None:
    directory = lora_models.saved("llama", folder)
    report = act.analyze(str(directory), INPUTS, lora=LoraOptions(16, dora=True))
    measured = lora_models.real_peak(lora_models.with_lora(models.llama(), r=16, use_dora=True))
    assert report.adapted is not None and report.adapted.lora is not None and report.adapted.lora.dora
    assert within(report.summary.peak_bytes, measured, 0.02), (report.summary.peak_bytes, measured)


def test_every_setting_left_out_is_peft_s_own_default(folder: Path) -> None:
    import peft

    directory = lora_models.saved("llama", folder)
    report = act.analyze(str(directory), INPUTS, lora=16)
    assert report.adapted is not None and report.adapted.lora is not None
    lora, default = report.adapted.lora, peft.LoraConfig()
    assert (lora.alpha, lora.dropout) == (default.lora_alpha, default.lora_dropout)
    # the targets peft resolves for a Llama, read from peft's table rather than written here
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    assert set(lora.targets) == set(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"])


def test_a_dropout_given_is_traced_as_peft_runs_it(folder: Path) -> None:
    """A dropout above 0 keeps a mask and a dropped copy of each target's input: a few percent of this step."""
    directory = lora_models.saved("gpt2", folder)
    plain = act.analyze(str(directory), INPUTS, lora=16).summary.peak_bytes
    report = act.analyze(str(directory), INPUTS, lora=LoraOptions(16, dropout=0.1, targets=("c_attn", "c_fc")))
    measured = lora_models.real_peak(lora_models.with_lora(models.gpt2(), r=16, lora_dropout=0.1,
                                                           target_modules=["c_attn", "c_fc"]))
    assert within(report.summary.peak_bytes, measured, 0.02), (report.summary.peak_bytes, measured)
    assert report.summary.peak_bytes > plain


@AVX512_BF16_PATH
def test_qlora_on_a_llama_directory_matches_a_real_bitsandbytes_step(folder: Path) -> None:
    directory = lora_models.saved("llama", folder)
    report = act.analyze(str(directory), INPUTS, lora=16, quantize="nf4")
    real = lora_models.with_lora(lora_models.quantized_from(directory, "nf4"), r=16)
    measured = lora_models.real_peak(real)
    assert within(report.summary.peak_bytes, measured, 0.03), (report.summary.peak_bytes, measured)
    # The 4-bit state: packed weights, absmax and code, against what bitsandbytes allocated for the real model.
    assert report.parameters is not None
    real_state = lora_models.storage_bytes(lora_models.quantization_state(real))
    real_packed = lora_models.storage_bytes(lora_models.quantized_weights(real))
    predicted_packed = sum(p.untyped_storage().nbytes() for p in _fake_model(directory).parameters()
                           if p.dtype.itemsize == 1)
    assert within(report.parameters.quantization_state_bytes, real_state, 0.01), (
        report.parameters.quantization_state_bytes, real_state)
    assert within(predicted_packed, real_packed, 0.01), (predicted_packed, real_packed)


def _fake_model(directory: Path) -> object:
    from memlayout.activations.analysis import prepare_step
    from memlayout.activations.request.step_request import StepRequest

    step, *_ = prepare_step(StepRequest(str(directory), input=tuple(INPUTS), optimizer="adamw", lora=16,
                                        quantize="nf4"))
    return step.model


def test_json_reports_trainable_against_frozen_and_follows_the_schema(folder: Path) -> None:
    directory = lora_models.saved("llama", folder)
    code, out, err = run([str(directory), *FLAGS, "--lora", "16",
                          "--quantize", "nf4", "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["lora"]["rank"] == 16 and data["quantization"]["method"] == "nf4"
    assert data["parameters"]["trainable_bytes"] < data["parameters"]["frozen_bytes"]
    assert err == ""  # peft's and transformers' warnings stay off stderr
    code, out, err = run([str(directory), *FLAGS, "--dora"])
    assert code == 0, err
    assert "DoRA" in out and "trainable" in out and "frozen" in out


def test_a_lora_flag_without_lora_is_refused_and_the_hint_works(folder: Path) -> None:
    directory = str(lora_models.saved("llama", folder))
    inputs = FLAGS
    code, _, err = run([directory, *inputs, "--lora-dropout", "0.1"])
    assert code == 2 and err.count("\n") == 1 and "e.g. --lora 16" in err, err
    code, _, err = run([directory, *inputs, "--lora-dropout", "0.1", "--lora", "16"])
    assert code == 0, err


@pytest.mark.parametrize("adapt", [["--lora", "16"], ["--dora"], ["--quantize", "nf4", "--lora", "16"]])
def test_weights_with_an_adapter_flag_is_one_line_and_its_hint_traces_the_split(adapt: list[str],
                                                                                 folder: Path) -> None:
    """--weights' training figure counts every parameter as trainable, which LoRA's is not: refused, and the hint
    (give --input) gives the step's report, trainable against frozen."""
    directory = str(lora_models.saved("llama", folder))
    for args in ([directory, "--weights", *adapt], [directory, *adapt, "--weights"]):
        code, out, err = run(args)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert "--weights counts every parameter as trainable" in err and "give --input" in err, err
    code, out, err = run([directory, *adapt, *FLAGS, "--format", "json"])
    assert code == 0, err
    parameters = json.loads(out)["parameters"]
    assert 0 < parameters["trainable_bytes"] < parameters["frozen_bytes"]


def test_a_model_peft_has_no_default_targets_for_is_told_to_name_them() -> None:
    spec, inputs = "tests.activations.models:residual_stack", ["--input", "float32[4,256]"]
    code, _, err = run([spec, *inputs, "--lora", "8"])
    assert code == 2 and err.count("\n") == 1 and "--lora-targets" in err, err
    hint = err.split("e.g. ")[1].split(",")[0].split()  # ['--lora-targets', 'a']: the first layer name it gave
    code, out, err = run([spec, *inputs, "--lora", "8", *hint])
    assert code == 0, err
    assert "LoRA" in out


def test_quantize_needs_a_transformers_model_and_says_what_to_do_instead() -> None:
    spec, inputs = "tests.activations.models:residual_stack", ["--input", "float32[4,256]"]
    code, _, err = run([spec, *inputs, "--quantize", "nf4"])
    assert code == 2 and err.count("\n") == 1 and "leave --quantize out" in err, err
    code, _, err = run([spec, *inputs])
    assert code == 0, err


@pytest.mark.parametrize(("flag", "module"), [("--lora", "peft"), ("--quantize", "bitsandbytes")])
def test_a_missing_package_is_one_line_with_the_install_command(flag: str, module: str, folder: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(lora_models.saved("llama", folder))
    monkeypatch.setitem(sys.modules, module, None)  # `import peft` now raises ImportError
    code, _, err = run([directory, *FLAGS,
                        *([flag, "16"] if flag == "--lora" else [flag, "nf4"])])
    assert code == 2 and err.count("\n") == 1, err
    assert "pip install 'memlayout[lora]'" in err


def test_the_install_command_s_extra_brings_both_packages() -> None:
    """Following the hint: the `lora` extra names peft and bitsandbytes, pinned to releases that keep torch."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    extra = " ".join(pyproject["project"]["optional-dependencies"]["lora"])
    assert "peft" in extra and "bitsandbytes" in extra


def test_qlora_traces_for_a_gpu_on_the_cuda_build_without_one(folder: Path) -> None:
    """The 4-bit weights are quantized on the meta device and moved to fake CUDA tensors; bitsandbytes' CUDA ops
    run their fake kernels. The state is the CPU's: bitsandbytes quantizes to the same sizes on both."""
    directory = str(lora_models.saved("llama", folder))
    code, out, err = run([directory, *FLAGS, "--lora", "16",
                          "--quantize", "nf4", "--gpu", "h100", "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["device"].startswith("cuda") and data["quantization"]["method"] == "nf4"
    on_cpu = act.analyze(directory, INPUTS, lora=16, quantize="nf4")
    assert on_cpu.parameters is not None
    assert data["parameters"] == {
        "trainable_count": on_cpu.parameters.trainable_count, "trainable_bytes": on_cpu.parameters.trainable_bytes,
        "frozen_count": on_cpu.parameters.frozen_count, "frozen_bytes": on_cpu.parameters.frozen_bytes,
        "quantization_state_bytes": on_cpu.parameters.quantization_state_bytes,
    }


@pytest.mark.parametrize("step", ["train", pytest.param("inference", marks=AVX512_BF16_PATH)])
def test_a_4bit_matmul_counts_the_weight_it_dequantizes_inside(step: str, folder: Path) -> None:
    """bitsandbytes' CPU matmul dequantizes the whole weight into a float32 temporary and frees it before returning;
    its fake kernel shows the output alone. Learned from the real kernel, the forward of a Llama with a wide MLP went
    from 0.40 of the allocator's peak to the byte."""
    from tests.activations.measure import allocator_inference_peak

    directory = lora_models.saved("wide-llama", folder)
    real = lora_models.quantized_from(directory)
    state = lora_models.storage_bytes(lora_models.quantization_state(real))
    if step == "inference":
        args, kwargs = models.token_inputs(1, 8, 64, labels=False)
        measured = allocator_inference_peak(real, args, kwargs) + state
        predicted = act.analyze(str(directory), ["int64[1,8]<64"], quantize="nf4", step="inference")
    else:
        measured = lora_models.real_peak(lora_models.with_lora(real, r=16), batch=1, length=8, vocab=64)
        predicted = act.analyze(str(directory), ["int64[1,8]<64", "labels=int64[1,8]<64"], quantize="nf4", lora=16)
    assert within(predicted.summary.peak_bytes, measured, 0.02), (predicted.summary.peak_bytes, measured)


def test_the_docs_give_the_lora_sweeps_figures() -> None:
    """docs/activations-fine-tune.md quotes benchmarks/results/lora_sweep.json: the counts within 2%, the worst, the
    command."""
    root = Path(__file__).resolve().parents[3]
    sweep = json.loads((root / "benchmarks" / "results" / "lora_sweep.json").read_text())
    docs = " ".join((root / "docs" / "activations-fine-tune.md").read_text().split())
    for kind in ("lora", "dora"):
        counts = sweep[kind]
        assert f"{counts['within_2pct']} of {counts['runnable']}" in docs, f"{kind}: rerun the sweep or mend the docs"
    ratios = [r[kind]["ratio"] for r in sweep["records"] for kind in ("lora", "dora") if "ratio" in r.get(kind, {})]
    worst = max(ratios, key=lambda ratio: abs(ratio - 1))
    assert f"{worst:.4f}" in docs, worst
    assert sweep["command"] in docs
