"""`--gpu NAME` on every torch build: the CPU wheel (and macOS) give the CUDA build's figures, byte for byte.

Each case is a `memlayout activations ... --gpu NAME --format json` command, and
tests/golden/gpu_on_any_build/CASE.json holds the report torch's CUDA build gave for it
(no GPU). This file runs in both of CI's jobs: `make test` on the CPU wheel, and the
torch matrix on the CUDA build (`make test-torch-2.14.1`). Each compares its whole
report with the recorded one, so the two builds agree with each other, and the
CUDA build with itself when memlayout changes. Only the CUDA build rewrites the
records (`pytest --overwrite` there), so that what the CPU wheel is held to is never
its own output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "gpu_on_any_build"
GPT2 = ["tests.activations.models:gpt2", "--inputs", "tests.activations.models:gpt2_inputs"]
LLAMA = ["benchmarks/configs/llama-tiny", "--input", "input_ids=int64[2,64]<1000"]
LLAMA_LABELS = [*LLAMA, "--input", "labels=int64[2,64]<1000"]
GPT2_124M = ["benchmarks/configs/gpt2-124m", "--input", "input_ids=int64[8,1024]<50257",
             "--input", "labels=int64[8,1024]<50257"]

CASES: dict[str, list[str]] = {
    # Training, each attention kernel: cuDNN's on Hopper, flash on the A100, memory-efficient on Turing.
    "gpt2-h100-fp32": [*GPT2, "--gpu", "h100"],
    "gpt2-a100-autocast-bf16": [*GPT2, "--gpu", "a100-80gb", "--autocast", "bf16"],
    "gpt2-t4-fp16": [*GPT2, "--gpu", "t4", "--dtype", "fp16"],
    # Ops the CUDA build runs whole and a CPU build would split (fake_cuda.WHOLE_ON_CUDA), BatchNorm's cuDNN kernel.
    "norm-mlp-h100": ["tests.activations.models:norm_mlp", "--input", "float32[16,64]", "--gpu", "h100"],
    "cnn-a10g": ["tests.activations.models:flat_cnn", "--input", "float32[8,3,32,32]", "--gpu", "a10g"],
    # Serving, adapters, a plan.
    "llama-l4-inference-bf16": [*LLAMA, "--step", "inference", "--gpu", "l4", "--dtype", "bf16"],
    "llama-h100-qlora": [*LLAMA_LABELS, "--lora", "8", "--quantize", "nf4", "--gpu", "h100"],
    # peft moves each new adapter to its base layer's dtype: a swap of fake tensors (trace/module_conversions.py).
    "llama-h100-lora-bf16": [*LLAMA_LABELS, "--lora", "16", "--dtype", "bf16", "--gpu", "h100"],
    "llama-l4-generate": [*LLAMA, "--step", "generate", "--new-tokens", "16", "--gpu", "l4"],
    "llama-h100-budget-plan": ["benchmarks/configs/llama-tiny", "--input", "input_ids=int64[4,128]<1000",
                               "--input", "labels=int64[4,128]<1000", "--gpu", "h100", "--autocast", "bf16",
                               "--budget", "900MiB"],
    # docs/will-it-fit.md's command, the one a laptop runs first.
    "gpt2-124m-h100-fit-batch": [*GPT2_124M, "--gpu", "h100", "--autocast", "bf16", "--fit", "batch"],
}


def _record(case: str) -> dict[str, object]:
    return json.loads((GOLDEN / f"{case}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_is_the_cuda_builds(case: str, overwrite_golden: bool) -> None:
    result = CliRunner().invoke(app, ["activations", *CASES[case], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    cuda_build = bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]
    if overwrite_golden:
        if not cuda_build:
            pytest.fail("the records are the CUDA build's: rewrite them with `.venv-torch-2.14.1/bin/python -m pytest "
                        f"{Path(__file__).relative_to(Path.cwd())} --overwrite`")
        GOLDEN.mkdir(parents=True, exist_ok=True)
        record = {"torch": torch.__version__, "command": ["memlayout", "activations", *CASES[case]], "report": report}
        (GOLDEN / f"{case}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    recorded = _record(case)
    assert recorded["command"] == ["memlayout", "activations", *CASES[case]], "the case changed: rewrite its record"
    assert report == recorded["report"], f"torch {torch.__version__} differs from {recorded['torch']}"


def test_every_record_was_written_by_the_cuda_build_and_has_a_case() -> None:
    written = {path.stem: _record(path.stem)["torch"] for path in GOLDEN.glob("*.json")}
    assert set(written) == set(CASES)
    assert all(re.search(r"\+cu\d+$", str(version)) for version in written.values()), written


def test_the_help_says_neither_a_gpu_nor_the_cuda_build_is_needed() -> None:
    shown = CliRunner().invoke(app, ["activations", "--help"], env={"COLUMNS": "2000"}).stdout
    gpu = " ".join(re.search(r"--gpu NAME(.*?)\n\s+--", shown, re.S)[1].split())  # type: ignore[index]
    assert "Neither a GPU nor torch's CUDA build is needed" in gpu
