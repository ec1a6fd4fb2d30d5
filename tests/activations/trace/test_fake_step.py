"""A fake step that sees the values the model reads, and falls back to the real kernel where a fake kernel
refuses what the real one accepts; each against MemTracker on the real CPU step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.report.json_report import report_dict
from memlayout.activations.report.table import render_table
from memlayout.cli.app import app
from tests.activations import edge_models
from tests.activations.measure import allocator_peak_step, memtracker_step

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())


def ids(batch: int = 4, length: int = 48, vocab: int = 200) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def padded(batch: int = 4, length: int = 48, longest: int = 20) -> torch.Tensor:
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, : longest - 3 * row] = 1
    return mask


def assert_predicted(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> act.ActivationReport:
    report = act.analyze(model(), list(args), kwargs=kwargs)
    # The allocator's events, which see a kernel's scratch: the summed loss's gradient reaches the last matmul
    # expanded (stride 0), and the kernel copies it first, which a storage counter (MemTracker) does not see.
    real = allocator_peak_step(model(), args, kwargs)
    # Within 64 B: the events also see a few bytes no storage in the trace holds (8 B on the Bart, 12 B on
    # TrimsPadding with 12 tokens).
    assert abs(report.summary.peak_bytes - real.peak_bytes) <= 64, (report.summary.peak_bytes, real.peak_bytes)
    return report


@pytest.mark.parametrize("with_padding", [False, True])
def test_a_branch_on_the_padding_mask_takes_the_real_step_s_branch(with_padding: bool) -> None:
    kwargs = {"attention_mask": padded()} if with_padding else {}
    report = assert_predicted(edge_models.masked_attention, (ids(),), kwargs)
    # the two branches differ: a 48x48 mask per batch, saved for backward in each layer
    other = act.analyze(edge_models.masked_attention(), [ids()],
                        kwargs={} if with_padding else {"attention_mask": padded()})
    assert other.summary.activation_bytes != report.summary.activation_bytes


def test_a_length_read_with_item_sizes_the_step() -> None:
    short = assert_predicted(edge_models.trims_padding, (ids(),), {"attention_mask": padded(longest=12)})
    long = assert_predicted(edge_models.trims_padding, (ids(),), {"attention_mask": padded(longest=40)})
    assert short.summary.activation_bytes < long.summary.activation_bytes


def test_an_input_spec_is_real_so_its_values_count_too() -> None:
    """--input makes random ids: the mask the model builds from them is all ones, as in the real step."""
    report = act.analyze(edge_models.masked_attention(), ["int64[4,48]<200"])
    real = allocator_peak_step(edge_models.masked_attention(), (ids(),), {})  # as assert_predicted's judge
    assert report.summary.peak_bytes == real.peak_bytes


# torch 2.6 has no torch._grouped_mm. The fallback itself matches no message (fake_step.py).
needs_grouped_mm = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")


@needs_grouped_mm
def test_the_cpu_kernel_takes_float32_where_the_fake_one_refuses() -> None:
    """The case, checked against the kernels themselves: float32 runs on CPU, its fake kernel raises.

    Each torch words the refusal its own way ("Expected inputs of BF16 type" in 2.13,
    "Expected mat_a to be BFloat16 or supported Float16 matrix" in 2.14); both name the dtype.
    """
    a, b = torch.randn(12, 8), torch.randn(3, 8, 8)
    offsets = torch.tensor([4, 8, 12], dtype=torch.int32)
    assert torch._grouped_mm(a, b, offs=offsets).shape == (12, 8)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="float32"):
        torch._grouped_mm(mode.from_tensor(a), mode.from_tensor(b), offs=mode.from_tensor(offsets))


@needs_grouped_mm
def test_a_refusing_fake_kernel_falls_back_to_the_real_one_and_is_listed() -> None:
    report = assert_predicted(edge_models.grouped_moe, (ids(4, 16),), {})
    calls = dict(report.fallbacks)
    # 2 layers x 2 projections forward, and each backward computes two gradients with it
    assert calls == {"aten._grouped_mm.default": 12}
    data = report_dict(report)
    jsonschema.validate(data, SCHEMA)
    assert data["fallbacks"] == [{"op": "aten._grouped_mm.default", "count": 12}]
    assert "aten._grouped_mm.default (12x)" in " ".join(render_table(report, width=200).split())


@needs_grouped_mm
def test_a_plan_on_the_fallback_model_holds_for_real() -> None:
    args = (ids(8, 32),)
    plain = memtracker_step(edge_models.grouped_moe(), args, {})
    budget = int(plain.peak_bytes * 0.85)
    report = act.analyze(edge_models.grouped_moe(), list(args), budget=budget)
    assert report.plan is not None and not report.plan.plan.empty
    model = edge_models.grouped_moe()
    with act.apply_plan(model, report.plan.plan):
        planned = memtracker_step(model, args, {})
    assert planned.peak_bytes <= budget
    assert torch.equal(planned.loss, plain.loss)
    assert all(torch.equal(planned.grads[name], grad) for name, grad in plain.grads.items())


def test_an_error_of_the_model_itself_is_not_hidden_by_the_fallback() -> None:
    """The real kernel refuses too (mismatched inner sizes): that error is the step's."""
    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(2, 12, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch._grouped_mm(x, self.weight, offs=torch.tensor([4, 8], dtype=torch.int32))

    with pytest.raises(Exception, match="the step failed") as caught:
        act.analyze(Broken(), ["float32[8,8]"])
    assert "BF16" not in str(caught.value)


def test_json_report_of_a_model_without_fallbacks_has_an_empty_list() -> None:
    result = CliRunner().invoke(app, ["activations", "tests.activations.edge_models:masked_attention",
                                      "--input", "int64[2,16]<200", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    jsonschema.validate(data, SCHEMA)
    assert data["fallbacks"] == []


def bart_decoder() -> torch.nn.Module:
    """transformers' Bart decoder builds an all-ones padding mask itself, then skips the mask when it is all ones,
    unless the mask is a fake tensor."""
    from transformers import BartConfig, BartForCausalLM

    torch.manual_seed(0)
    config = BartConfig(vocab_size=99, d_model=32, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
                        encoder_attention_heads=4, decoder_ffn_dim=37, encoder_ffn_dim=37, max_position_embeddings=128,
                        use_cache=False)
    return BartForCausalLM(config).train()


def test_a_mask_the_model_makes_from_constants_is_real_too() -> None:
    tokens = ids(4, 64, 99)
    assert_predicted(bart_decoder, (), {"input_ids": tokens, "labels": tokens.clone()})


def llama_without_cache() -> torch.nn.Module:
    """With use_cache=False transformers keeps the causal mask for fake tensors (cache positions are tensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=99, use_cache=False)
    return LlamaForCausalLM(config).train()


def test_a_decoder_without_cache_skips_its_mask_as_the_real_step_does() -> None:
    tokens = ids(4, 64, 99)
    assert_predicted(llama_without_cache, (), {"input_ids": tokens, "labels": tokens})


def test_a_loss_whose_kernel_needs_the_inputs_lengths_runs_on_them() -> None:
    """The CTC loss's fake kernel needs the values of its length tensors; they come from the inputs, so they are
    real, and the real kernel sizes its outputs from them (the frames' values come from the weights: zeros)."""
    generator = torch.Generator().manual_seed(0)
    frames = torch.randn(4, 50, 16, generator=generator)
    mask = torch.zeros(4, 50, dtype=torch.long)
    for row, length in enumerate((50, 44, 37, 30)):
        mask[row, :length] = 1
    labels = torch.randint(1, 20, (4, 12), generator=generator)
    labels[2:, 9:] = 0
    report = assert_predicted(edge_models.CTCRecognizer, (frames, mask, labels), {})
    assert dict(report.fallbacks) == {"aten._ctc_loss.Tensor": 1}  # its backward kernel takes the shapes it made


@pytest.mark.parametrize("arguments", [
    ((torch.ones(2), 3, [torch.zeros(1), None], (1, 2)), {"out": torch.ones(3)}),  # Tensor, Tensor?[], int[], out=
    ((torch.ones(2), [[torch.zeros(1)], torch.ones(1)]), {}),  # deeper than any aten schema: pytree's turn
    ((torch.ones(2),), {"extra": {"inner": torch.zeros(2)}, "alpha": 2}),  # a dict in kwargs
    ((), {}),
])
def test_the_tensors_of_an_ops_arguments_are_pytrees_in_pytrees_order(arguments: tuple[Any, dict[str, Any]]) -> None:
    from torch.utils._pytree import tree_flatten

    from memlayout.activations.trace.op_arguments import op_tensors

    args, kwargs = arguments
    leaves, _ = tree_flatten((args, kwargs))
    expected = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    found = op_tensors(args, kwargs)
    assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected, strict=True))
