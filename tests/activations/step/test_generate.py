"""`--step generate`: `model.generate(..., max_new_tokens=N, do_sample=False)`, checked against real generates on the
CPU by the allocator's events.

The real generates are written here as a serving script writes them, with transformers' own `generate`. Both
sides are given an end-of-sequence id no token can be (the vocabulary's size), so that the real generate runs
the full N tokens whatever its random weights pick, as memlayout's prediction assumes (step/generate.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.fit.size_search import fit
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.measure import allocator_generate_peak

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
VOCAB = 500
NEW_TOKENS = 32
FIT_TOKENS = 8
"""Fewer tokens where a test traces generate many times, or only needs a few."""
BUILDERS: dict[str, Callable[[], nn.Module]] = {"llama": models.llama, "gpt2": models.gpt2, "t5": models.t5}


def prompt(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))


def real_generate(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], cache: str,
                  new_tokens: int = NEW_TOKENS) -> tuple[int, torch.Tensor]:
    """The allocator's peak over a real greedy generate of `new_tokens`, and the ids it returned."""
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    return allocator_generate_peak(model, args, kwargs, max_new_tokens=new_tokens, do_sample=False,
                                   eos_token_id=VOCAB, **extra)


def directory(tmp_path: Path, name: str) -> str:
    """A Hugging Face model directory (config.json alone, naming its class as `save_pretrained` of the model
    does), as `memlayout activations DIR` reads one."""
    model = BUILDERS[name]()
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(tmp_path)  # type: ignore[operator]
    return str(tmp_path)


def real_cache_bytes(model: nn.Module, ids: torch.Tensor, cache: str) -> int:
    """The bytes of the key/value cache a real generate returns (`return_dict_in_generate`), read off the cache's
    layers as transformers documents them."""
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.inference_mode():
        out = model.eval().generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=VOCAB,
                                    return_dict_in_generate=True, **extra)
    kv = out.past_key_values
    caches = [kv.self_attention_cache, kv.cross_attention_cache] if hasattr(kv, "cross_attention_cache") else [kv]
    return sum(t.untyped_storage().nbytes() for c in caches for layer in c.layers for t in (layer.keys, layer.values))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_generate_from_a_directory_matches_a_real_generate(name: str, cache: str, tmp_path: Path) -> None:
    predicted = act.analyze(directory(tmp_path, name), ["int64[4,48]<500"], step="generate", new_tokens=NEW_TOKENS,
                            cache=cache)
    measured, ids = real_generate(BUILDERS[name](), (prompt(4, 48),), {}, cache)
    # the real generate ran every token: a decoder-only model returns the prompt too, T5 its decoder's start token
    assert ids.shape[1] == (1 if name == "t5" else 48) + NEW_TOKENS
    assert abs(predicted.summary.peak_bytes - measured) <= 0.02 * measured, (predicted.summary.peak_bytes, measured)
    g = predicted.generation
    assert g is not None and (g.new_tokens, g.cache, g.forwards) == (NEW_TOKENS, cache, NEW_TOKENS)
    assert g.weight_bytes == predicted.summary.parameter_bytes + predicted.summary.buffer_bytes
    assert predicted.step == "generate" and predicted.summary.peak_bytes_min is None  # the token choice has no range
    # the cache at the end is the one a real generate returns; a static cache's counters (8 bytes a layer, two
    # layers, two caches for T5) are in what the trace reads and not in keys and values
    real_cache = real_cache_bytes(BUILDERS[name](), prompt(4, 48), cache)
    assert 0 <= g.cache_bytes - real_cache <= (8 * 2 * 2 if cache == "static" else 0), (g.cache_bytes, real_cache)
    if name == "llama" and cache == "dynamic":
        # the textbook formula: 2 (keys, values) x layers x kv heads x head dim x tokens x bytes, for each sequence;
        # the last new token is never fed back, so the cache holds the prompt and all new tokens but one
        assert real_cache == 2 * 2 * 2 * 16 * (48 + NEW_TOKENS - 1) * 4 * 4


def test_an_attention_mask_given_is_passed_to_generate() -> None:
    ids = prompt(4, 48)
    mask = torch.ones(4, 48, dtype=torch.int64)
    mask[1, :20] = 0  # left padding in one sequence: the mask is not all ones, so attention reads it
    predicted = act.analyze(models.llama(), [ids], kwargs={"attention_mask": mask}, step="generate",
                            new_tokens=FIT_TOKENS)
    measured, _ = real_generate(models.llama(), (ids,), {"attention_mask": mask}, "dynamic", FIT_TOKENS)
    assert abs(predicted.summary.peak_bytes - measured) <= 0.02 * measured, (predicted.summary.peak_bytes, measured)
    assert any(text.startswith("attention_mask=") for text in predicted.inputs)


def test_a_long_generate_peaks_at_its_last_forward_and_a_long_prompt_at_its_first() -> None:
    short = act.analyze(models.llama(), ["int64[1,4]<500"], step="generate", new_tokens=40)
    long = act.analyze(models.llama(), ["int64[1,160]<500"], step="generate", new_tokens=2)
    assert short.generation is not None and long.generation is not None
    assert short.generation.peak_forward == short.generation.forwards - 1
    assert long.generation.peak_forward == 0
    # a static cache is whole from the first forward on: its peak holds all of it
    static = act.analyze(models.llama(), ["int64[1,4]<500"], step="generate", new_tokens=16, cache="static")
    assert static.generation is not None
    assert static.generation.cache_at_peak_bytes == static.generation.cache_bytes


def test_the_seq_found_is_the_longest_prompt_that_fits_a_real_generate() -> None:
    budget = 2_000_000
    report = fit(models.llama(), ["int64[4,16]<500"], axis="seq", budget=budget, step="generate",
                 generation=act_generation(FIT_TOKENS))
    size = report.without_plan.size
    assert report.with_plan is None and 16 < size < 256 - FIT_TOKENS

    def predicted(length: int) -> int:
        return act.analyze(models.llama(), [f"int64[4,{length}]<500"], step="generate",
                           new_tokens=FIT_TOKENS).summary.peak_bytes

    def measured(length: int) -> int:
        return real_generate(models.llama(), (prompt(4, length),), {}, "dynamic", FIT_TOKENS)[0]

    assert predicted(size) <= budget < predicted(size + 1), size
    assert measured(size) <= budget < measured(size + 1), size


def test_the_batch_found_is_the_most_sequences_a_real_generate_fits() -> None:
    budget = 1_500_000
    report = fit(models.gpt2(), ["int64[2,24]<500"], budget=budget, step="generate",
                 generation=act_generation(FIT_TOKENS, "static"))
    size = report.without_plan.size
    assert size > 2

    def measured(batch: int) -> int:
        return real_generate(models.gpt2(), (prompt(batch, 24),), {}, "static", FIT_TOKENS)[0]

    assert measured(size) <= budget < measured(size + 1), size


@pytest.mark.parametrize(("model", "axis", "shape", "cache", "budget"), [
    ("llama", "seq", (4, 16), "dynamic", 2_000_000),
    ("gpt2", "batch", (2, 24), "static", 1_500_000),
])
def test_the_clis_fit_answer_fits_and_one_more_does_not(model: str, axis: str, shape: tuple[int, int], cache: str,
                                                        budget: int) -> None:
    """As the fit issue checks an answer: the command's own prediction at the answer s fits the budget, at s + 1 it
    does not, each asked of the CLI as a user would ask it."""
    def command(batch: int, length: int, *extra: str) -> dict[str, Any]:
        result = CliRunner().invoke(app, [
            "activations", f"tests.activations.models:{model}", "--input", f"int64[{batch},{length}]<500", "--step",
            "generate", "--new-tokens", str(FIT_TOKENS), "--cache", cache, "--format", "json", *extra])
        assert result.exit_code == 0, result.stderr
        return dict(json.loads(result.stdout))

    answer = command(*shape, "--fit", axis, "--budget", str(budget))["fit"]["without_plan"]["size"]
    assert answer > shape[0 if axis == "batch" else 1]

    def peak(size: int) -> int:
        batch, length = (size, shape[1]) if axis == "batch" else (shape[0], size)
        return int(command(batch, length)["summary"]["peak_bytes"])

    assert peak(answer) <= budget < peak(answer + 1), answer


def act_generation(new_tokens: int, cache: str = "dynamic") -> Any:
    from memlayout.activations.step.generate import Generation

    return Generation(new_tokens, cache)


GENERATE = ["activations", "tests.activations.models:llama", "--input", "int64[2,16]<500", "--step", "generate"]


def test_cli_reports_a_generate_step_in_json() -> None:
    result = CliRunner().invoke(app, [*GENERATE, "--new-tokens", "8", "--cache", "static", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["step"] == "generate" and report["optimizer"] == "none" and report["plan"] is None
    g = report["generate"]
    assert (g["new_tokens"], g["cache"], g["forwards"]) == (8, "static", 8)
    assert g["cache_bytes"] == 2 * 2 * 2 * 2 * 16 * (16 + 8 - 1) * 4 + 2 * 8  # keys, values and a counter a layer
    assert [d["kind"] for d in report["data_dependent"]] == ["token"]


def test_cli_table_gives_the_weights_the_cache_and_the_peaks_forward() -> None:
    result = CliRunner().invoke(app, [*GENERATE, "--new-tokens", "8"])
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "step: generate" in out and "KV cache" in out and "at the end (dynamic cache, 8 new" in out
    assert "forward 1 of 8" in out and "the prompt's (the prefill)" in out


@pytest.mark.parametrize(("extra", "message"), [
    (["--new-tokens", "8", "--budget", "8MiB"], "--budget plans checkpoints for backward, and --step generate"),
    (["--new-tokens", "8", "--optimizer", "adamw"], "--optimizer adamw does not apply to --step generate"),
    ([], "--step generate needs --new-tokens N"),
    (["--new-tokens", "0"], "--new-tokens 0 generates nothing"),
    (["--new-tokens", "8", "--cache", "paged"], "unknown --cache 'paged'"),
    (["--new-tokens", "8", "--world-size", "2", "--tp", "2", "--fit", "seq", "--budget", "2MB"],
     "--fit with --step generate is not searched across ranks yet"),
])
def test_cli_refuses_what_generate_does_not_take(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*GENERATE, *extra])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("flag", [["--new-tokens", "8"], ["--cache", "static"]])
def test_generate_flags_without_generate_are_refused(flag: list[str]) -> None:
    result = CliRunner().invoke(app, ["activations", "tests.activations.models:llama", "--input", "int64[2,16]<500",
                                      "--step", "inference", *flag])
    assert result.exit_code == 2
    assert f"{flag[0]} applies to --step generate only" in result.stderr


def test_a_model_that_cannot_generate_is_one_line() -> None:
    result = CliRunner().invoke(app, ["activations", "tests.activations.models:bert", "--input", "int64[2,16]<500",
                                      "--step", "generate", "--new-tokens", "4"])
    assert result.exit_code == 2
    assert "cannot generate" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_generate_steps_fresh_buffers_over_a_mib_stay_fake_and_small_ones_real() -> None:
    # a static cache's keys and values are torch.zeros of their final length: real, they would take real memory
    # (up to 64 MiB a tensor) while a fake step traces; small ones stay real as masks and counters must
    from memlayout import _torch
    from memlayout.activations.trace.world import StepWorld

    step = StepWorld("fake", "cpu")
    step.generate(act_generation(4))
    with step.step_context():
        large = torch.zeros(2, 1 << 18)  # 2 MiB
        small = torch.zeros(4, 8)
        counter = torch.tensor(0)
    assert isinstance(large, _torch.FakeTensor)
    assert not isinstance(small, _torch.FakeTensor) and not isinstance(counter, _torch.FakeTensor)


def test_fake_values_written_into_a_real_tensor_keep_its_one_storage() -> None:
    # a small static cache is real, and index_copy_ writes the fake keys of a forward into it: the op gives the
    # tracer the tensor written into, as the real op does, not the fake copy the fake mode wrote (T5's static
    # cache read 1.034x of the allocator's peak with both counted)
    from memlayout.activations.trace.tracer import StepTracer
    from memlayout.activations.trace.world import StepWorld

    step = StepWorld("fake", "cpu")
    step.generate(act_generation(4))
    tracer = StepTracer(nn.Linear(2, 2), correct_kernels=True)
    assert step.fake_mode is not None
    with step.step_context(), tracer, torch.inference_mode():  # as generate runs
        cache = torch.zeros(4, 4, 32, 16)
        keys = step.fake_mode.from_tensor(torch.empty(4, 4, 1, 16))
        position = torch.arange(1)
        before = len(tracer.storages)
        for _ in range(3):
            cache.index_copy_(2, position, keys)
        assert len(tracer.storages) == before, [s.storage_nbytes for s in tracer.storages[before:]]


def test_the_docs_give_the_generate_sweeps_figures() -> None:
    root = Path(__file__).resolve().parents[3]
    sweep = json.loads((root / "benchmarks" / "results" / "generate_sweep.json").read_text())
    docs = " ".join((root / "docs" / "activations-serving.md").read_text().split())
    within = f"{sweep['within_2pct']} of {sweep['runnable']} runnable within 2%"
    assert within in docs, "rerun the sweep or mend the docs"
    assert sweep["command"] in docs
    assert not {r["architecture"] for r in sweep["records"]} & {"LlamaForCausalLM", "GPT2LMHeadModel",
                                                                "T5ForConditionalGeneration"}
