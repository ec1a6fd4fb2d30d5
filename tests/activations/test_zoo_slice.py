"""A slice of `make zoo` (docs/activations-zoo.md): architectures across the families, each checked as the
sweep checks it, against the sweep's criteria.

For each: a tiny model with random weights, a real CPU step with AdamW measured by MemTracker, memlayout's
prediction within 2% of it, and a plan for 0.7x the measured peak that holds when applied for real (peak
under the budget, loss and gradients bitwise equal), or an unreachable budget whose stated lowest peak the
real plans of the model's top-level modules confirm. The whole sweep runs in `make zoo`.

The same slice under `--autocast bf16` (issue 27, section 1): every real step and every prediction runs
forward and loss under torch.autocast("cpu", bfloat16), judged by the same criteria.
"""

from __future__ import annotations

import pytest

from benchmarks.accuracy.zoo.catalog import by_name
from benchmarks.accuracy.zoo.check import run_check

SLICE = (
    "LlamaForCausalLM",  # causal LM
    "MixtralForCausalLM",  # mixture of experts: a grouped matmul whose fake kernel refuses float32
    "Mamba2ForCausalLM",  # state space
    "BertForMaskedLM",  # masked LM
    "T5ForConditionalGeneration",  # encoder-decoder
    "ViTForImageClassification",  # vision
    "WhisperForConditionalGeneration",  # audio to text
    "LlavaForConditionalGeneration",  # images and text
    "AutoencoderKL",  # diffusers
    "torch.nn.Transformer",  # torch.nn: a candidate whose recompute changes metadata
    "torch.nn.LSTM (3 layers, dropout)",  # stacked RNN
)


# Under autocast bf16 (measured 2026-11-26, torch 2.13 CPU): every runnable prediction is within 2%; this one
# misses a criterion for the reason it names, and is kept here so that a fix shows (strict xfail). ViT's stated
# lowest peak, once 4% above a real plan by the storage counter, is within 2% by the allocator's events.
AUTOCAST_SHORTFALLS = {
    "torch.nn.LSTM (3 layers, dropout)": "torch's real CPU step fails: oneDNN creates no LSTM primitive for bf16 "
                                         "under CPU autocast, so there is nothing to compare with",
}


def _cases() -> list[object]:
    cases: list[object] = []
    for autocast in (None, "bf16"):
        for name in SLICE:
            why = AUTOCAST_SHORTFALLS.get(name) if autocast else None
            marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
            cases.append(pytest.param(name, autocast, marks=marks, id=f"{name}-{autocast or 'fp32'}"))
    return cases


@pytest.mark.parametrize(("name", "autocast"), _cases())
def test_architecture_meets_the_sweeps_criteria(name: str, autocast: str | None) -> None:
    record = run_check(by_name()[name], autocast=autocast)
    assert record["status"] == "ok", record["reason"]
    assert record["within_2pct"], record["reason"]
    assert record["plan"] in ("verified", "unreachable-verified"), record["reason"]
