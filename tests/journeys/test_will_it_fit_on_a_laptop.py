"""Will it fit, asked from a laptop: the journeys of issue 53, each of which failed before it was fixed.

A user with the torch `make` installs (the CPU wheel), or torch's CUDA build and no GPU,
asks what a step takes on a GPU, and follows what memlayout tells them to do next.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.activations.test_cli import run

ROOT = Path(__file__).resolve().parents[2]
LLAMA_TINY = str(ROOT / "benchmarks" / "configs" / "llama-tiny")
PROMPT = "input_ids=int64[2,64]<1000"


def _config(key: str) -> int:
    return int(json.loads((Path(LLAMA_TINY) / "config.json").read_text())[key])


@pytest.mark.parametrize("target", [["--gpu", "l4"], ["--device", "cuda"]])
def test_serving_a_llama_on_a_gpu_is_predicted_as_on_the_cpu(target: list[str]) -> None:
    # It stopped in transformers' generate: "Found no NVIDIA driver on your system" (torch's CUDA build, no GPU),
    # "Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend" (the CPU wheel).
    code, out, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--step", "generate", "--new-tokens", "16",
                          *target, "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["device"] == "cuda" and report["step"] == "generate"
    # The dynamic cache ends holding the prompt and every new token but the last (which is never fed back):
    # keys and values, per layer, per sequence, per key/value head, in float32.
    tokens = 64 + 16 - 1
    head_dim = _config("hidden_size") // _config("num_attention_heads")
    cache = 2 * _config("num_hidden_layers") * 2 * _config("num_key_value_heads") * head_dim * 4 * tokens
    assert report["generate"]["cache_bytes"] == cache
    code, out, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--step", "generate", "--new-tokens", "16",
                          "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["generate"]["cache_bytes"] == cache


def test_a_prompt_served_on_a_gpu_is_the_same_forward_as_inference() -> None:
    # --step inference on the GPU stopped at the cache's first `torch.tensor([], device=...)` under inference mode.
    code, out, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--step", "inference", "--gpu", "l4",
                          "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["summary"]["peak_bytes"] > 0


def test_the_optimizer_note_says_loras_adapters_keep_their_state_in_float32() -> None:
    # With --lora and --dtype bf16 the note said "the optimizer's state is bf16": peft keeps the adapters in float32.
    labels = PROMPT.replace("input_ids", "labels")
    code, out, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--input", labels,
                          "--lora", "16", "--dtype", "bf16", "--format", "json"])
    assert code == 0, err
    notes = [note for note in json.loads(out)["notes"] if "optimizer's state" in note]
    assert notes and notes[0].startswith("the optimizer's state is float32"), notes


def test_when_nothing_fits_the_hint_names_what_was_not_tried_and_not_a_batch_of_one() -> None:
    # At batch 1 it said "shrink the batch", and named neither bf16, LoRA, QLoRA nor more ranks.
    code, _, err = run(["activations", LLAMA_TINY, "--input", "input_ids=int64[1,64]<1000",
                        "--input", "labels=int64[1,64]<1000", "--budget", "1MiB"])
    assert code != 0
    hint = " ".join(err.split())
    assert "shrink the batch" not in hint
    tries = [hint.index(flag) for flag in ("--dtype bf16", "--lora 16", "--quantize nf4", "--world-size 8")]
    assert tries == sorted(tries), hint
    code, _, err = run(["activations", LLAMA_TINY, "--input", "input_ids=int64[4,64]<1000",
                        "--input", "labels=int64[4,64]<1000", "--autocast", "bf16", "--lora", "16", "--budget", "1MiB"])
    assert code != 0
    hint = " ".join(err.split())
    assert "shrink the batch (it is 4)" in hint and "--dtype bf16" not in hint and "--lora 16 with" in hint


LLAMA_STEP = ["activations", LLAMA_TINY, "--input", "input_ids=int64[1,64]<1000", "--input", "labels=int64[1,64]<1000"]
FIGURE = re.compile(r"(\w[\w ]*) \((--[^()]*)\): [\d.]+ [KMGT]?i?B \((\d+) bytes\)")
"""One alternative of a nothing-fits hint: its name, its flags and its figure in bytes."""


def _figures(err: str) -> list[tuple[str, str, int]]:
    return [(name.strip(), flags, int(figure)) for name, flags, figure in FIGURE.findall(" ".join(err.split()))]


def test_each_figure_the_nothing_fits_hint_gives_is_the_peak_its_flags_report() -> None:
    # The hint named bf16, LoRA, QLoRA and more ranks without saying what any of them would give.
    budget = str(9 * 2**20)  # over llama-tiny's bf16, LoRA and QLoRA steps at batch 1, under float32's lowest plan
    code, _, err = run([*LLAMA_STEP, "--budget", budget])
    assert code == 1, err
    figures = _figures(err)
    assert [name for name, _, _ in figures] == ["bf16", "LoRA", "QLoRA"], err
    assert "more ranks (--world-size 8 with --fsdp): no figure here" in " ".join(err.split())
    for name, flags, figure in figures:
        assert figure <= int(budget), (name, figure)
        followed = [flag for part in flags.split(" with ") for flag in part.split()]
        code, out, err = run([*LLAMA_STEP, "--budget", budget, *followed, "--format", "json"])
        assert code == 0, (name, err)
        report = json.loads(out)
        # It fits as it is: the plan checkpoints nothing, and the step's peak is the figure, to the byte.
        assert report["plan"]["checkpoint"] == [] and report["summary"]["peak_bytes"] == figure, name


def test_the_first_setting_the_hint_names_gives_up_the_least() -> None:
    """bf16, named first, still trains every weight, on one GPU; LoRA and QLoRA, named after it, train adapters
    alone (QLoRA on a 4-bit base)."""
    code, _, err = run([*LLAMA_STEP, "--budget", "1MiB"])
    assert code == 1
    trained = {}
    for name, flags, _ in _figures(err):
        followed = [flag for part in flags.split(" with ") for flag in part.split()]
        code, out, err = run([*LLAMA_STEP, *followed, "--format", "json"])
        assert code == 0, err
        parameters = json.loads(out)["parameters"]
        trained[name] = parameters["trainable_count"] / (parameters["trainable_count"] + parameters["frozen_count"])
    assert next(iter(trained)) == "bf16" and trained["bf16"] == 1.0
    assert all(share < 1.0 for name, share in trained.items() if name != "bf16"), trained


def test_the_nothing_fits_error_carries_each_figure_as_data() -> None:
    import memlayout.activations as act
    from memlayout.errors import BudgetUnreachableError

    with pytest.raises(BudgetUnreachableError) as caught:
        act.analyze(LLAMA_TINY, ["input_ids=int64[1,64]<1000", "labels=int64[1,64]<1000"], budget=2**20)
    alternatives = caught.value.alternatives
    assert [(a.name, a.setting) for a in alternatives] == [
        ("bf16", "`dtype=bf16`"), ("LoRA", "`lora=16`"), ("QLoRA", "`lora=16` with `quantize=nf4`"),
        ("more ranks", "`world_size=8` with `fsdp=True`")]
    bf16 = act.analyze(LLAMA_TINY, ["input_ids=int64[1,64]<1000", "labels=int64[1,64]<1000"], dtype="bf16")
    assert alternatives[0].bytes == bf16.summary.peak_bytes
    assert alternatives[-1].bytes is None and alternatives[-1].why
    assert f"({alternatives[1].bytes} bytes)" in caught.value.hint


def test_the_nothing_fits_line_is_alone_on_stderr_though_the_hint_traced_lora_and_qlora() -> None:
    # bitsandbytes, imported for QLoRA (or by peft for LoRA), logged "Failed to load CPU gemm_4bit_forward from
    # kernels-community" to stderr where its CPU backend looks for a Hub kernel. A process of its own: it is
    # imported once.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "memlayout", "activations", "tests.activations.models:gpt2",
                           "--input", "int64[1,16]<500", "--input", "labels=int64[1,16]<500", "--budget", "1KiB"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "QLoRA (--lora 16 with --quantize nf4): " in lines[0], done.stderr


def test_a_share_of_a_gpu_without_one_is_refused_before_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    # --budget 0.9 on the CPU was refused only after the step was traced (35 s for Llama-7B).
    from memlayout.activations.trace.world import StepWorld

    def traced(self: StepWorld) -> None:
        raise AssertionError("traced")

    monkeypatch.setattr(StepWorld, "trace", traced)
    code, _, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--budget", "0.9"])
    assert code != 0 and "traced" not in err and "--gpu" in err


def test_a_generate_step_counts_its_forward_flops() -> None:
    # --step generate showed "forward 0 FLOP": under inference mode linear, matmul and SDPA reach the tracer whole.
    flops = {}
    for target in ([], ["--gpu", "l4"]):
        code, out, err = run(["activations", LLAMA_TINY, "--input", PROMPT, "--step", "generate", "--new-tokens", "16",
                              *target, "--format", "json"])
        assert code == 0, err
        report = json.loads(out)
        flops[bool(target)] = {m["path"]: m["forward_flops"] for m in report["modules"]}
        assert report["summary"]["forward_flops"] == flops[bool(target)][""]
    hidden, inner, vocab = _config("hidden_size"), _config("intermediate_size"), _config("vocab_size")
    # The prompt's 2 x 64 tokens, then 15 steps of one token per sequence; the logits of the last position only.
    tokens = 2 * 64 + 15 * 2
    assert flops[False]["model.layers.0.mlp.up_proj"] == 2 * tokens * hidden * inner
    assert flops[False]["lm_head"] == 16 * 2 * 2 * hidden * vocab
    assert flops[False]["model.layers.0.self_attn"] > 0
    assert flops[False] == flops[True]


def test_the_panels_footer_is_whole_at_120_columns() -> None:
    # rich cut a footer wider than the box: "| optimizer: adamw | pa─╯".
    from typer.testing import CliRunner

    from memlayout.cli.app import app

    result = CliRunner().invoke(app, ["activations", LLAMA_TINY, "--input", PROMPT, "--input",
                                      PROMPT.replace("input_ids", "labels"), "--autocast", "bf16", "--dtype", "bf16",
                                      "--gpu", "h100"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.stderr
    panel = result.stdout[:result.stdout.index("╰")]
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    text = " ".join(line.strip("│ ") for line in panel.splitlines())
    assert "optimizer: adamw | autocast bf16 | parameters bf16" in " ".join(text.split())
