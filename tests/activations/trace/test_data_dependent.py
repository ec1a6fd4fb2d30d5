"""Shapes that follow values: the assumption the prediction uses is stated, the range is reported, and the real
step on these inputs falls inside it; values that come from the inputs alone are used as they are."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memlayout.activations as act
from memlayout.activations.report.json_report import report_dict
from memlayout.activations.report.table import render_table
from tests.activations import edge_models
from tests.activations.measure import allocator_peak_step, memtracker_step

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())


def tokens(batch: int = 8, length: int = 32, vocab: int = 200, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_routing_by_the_weights_assumes_balance_and_the_real_step_is_in_the_range() -> None:
    for seed in (0, 1):
        ids = tokens(seed=seed)
        report = act.analyze(edge_models.loop_moe(), [ids])
        # The allocator's events, which see a kernel's scratch: the summed loss's gradient reaches the last matmul
        # expanded (stride 0), and the kernel copies it first, which a storage counter (MemTracker) does not see.
        real = allocator_peak_step(edge_models.loop_moe(), (ids,), {})
        s = report.summary
        assert s.peak_bytes_min is not None and s.peak_bytes_max is not None
        assert s.peak_bytes_min <= real.peak_bytes <= s.peak_bytes_max, (s.peak_bytes_min, real.peak_bytes,
                                                                            s.peak_bytes_max)
        assert abs(s.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes
    assert report.data_dependent == (("aten.topk.default", "routing", 2),)
    data = report_dict(report)
    jsonschema.validate(data, SCHEMA)
    assert data["data_dependent"][0]["kind"] == "routing"
    assert "balanced routing" in data["data_dependent"][0]["assumption"]
    table = " ".join(render_table(report, width=200).split())
    assert "peak range" in table and "balanced routing" in table


def test_a_boolean_mask_of_activations_keeps_half_and_the_range_spans_none_to_all() -> None:
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
    report = act.analyze(edge_models.keeps_positive(), [x])
    real = memtracker_step(edge_models.keeps_positive(), (x,), {})
    s = report.summary
    assert s.peak_bytes_min is not None and s.peak_bytes_max is not None
    assert s.peak_bytes_min < real.peak_bytes < s.peak_bytes_max
    # about half of a freshly initialised layer's outputs are positive
    assert abs(s.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes
    assert report.data_dependent == (("aten.index.Tensor", "mask", 1),)


def test_routing_by_the_inputs_is_the_inputs_own_and_assumes_nothing() -> None:
    skewed = tokens(vocab=100) * 2  # even ids only: experts 0 and 2 take every token
    for ids in (tokens(), skewed):
        report = act.analyze(edge_models.hash_experts(), [ids])
        real = memtracker_step(edge_models.hash_experts(), (ids,), {})
        assert report.summary.peak_bytes == real.peak_bytes
        assert report.data_dependent == ()
        assert report.summary.peak_bytes_min is None and report.summary.peak_bytes_max is None


def test_a_plan_for_the_routed_model_holds_for_real() -> None:
    ids = tokens(16, 32)
    plain = memtracker_step(edge_models.loop_moe(), (ids,), {})
    budget = int(plain.peak_bytes * 0.85)
    report = act.analyze(edge_models.loop_moe(), [ids], budget=budget)
    assert report.plan is not None and not report.plan.plan.empty
    model = edge_models.loop_moe()
    with act.apply_plan(model, report.plan.plan):
        planned = memtracker_step(model, (ids,), {})
    assert planned.peak_bytes <= budget
    assert torch.equal(planned.loss, plain.loss)
    assert all(torch.equal(planned.grads[name], grad) for name, grad in plain.grads.items())


def test_layer_drop_assumes_every_layer_runs_and_each_real_draw_is_in_the_range() -> None:
    x = torch.randn(128, 64, generator=torch.Generator().manual_seed(0))
    report = act.analyze(edge_models.LayerDropStack(), [x])
    s = report.summary
    assert s.peak_bytes_min is not None and s.peak_bytes_max is not None
    assert report.data_dependent == (("aten.rand.default", "random", 6),)
    every_layer = memtracker_step(edge_models.LayerDropStack(layerdrop=0.0), (x,), {}).peak_bytes
    assert s.peak_bytes == s.peak_bytes_max == every_layer
    assert s.peak_bytes_min < every_layer
    draws = {memtracker_step(edge_models.LayerDropStack(), (x,), {}, seed=seed).peak_bytes for seed in range(6)}
    assert len(draws) > 1  # the case: the step's memory is drawn anew
    assert all(s.peak_bytes_min <= peak <= s.peak_bytes_max for peak in draws), (s.peak_bytes_min, draws)


class _TopOneRouter(nn.Module):
    """Top-1 routing as Switch Transformers writes it: `argmax` (or `max`) over the experts' dimension of
    [batch, tokens, experts] probabilities, then `one_hot`, which refuses an index of no expert."""

    def __init__(self, reduce: str, width: int = 32, hidden: int = 128, experts: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.reduce, self.experts_count = reduce, experts
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(
            [nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)) for _ in range(experts)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.router(x).softmax(-1)
        index = probs.argmax(dim=-1) if self.reduce == "argmax" else probs.max(dim=-1).indices
        mask = F.one_hot(index, self.experts_count)
        out = torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            token = mask[..., number].bool()
            out[token] = expert(x[token]) * probs[..., number][token, None]
        return out.square().mean()


@pytest.mark.parametrize("reduce", ["argmax", "max"])
def test_top_one_routing_picks_an_expert_for_every_token_and_the_real_step_is_in_the_range(reduce: str) -> None:
    # 32 tokens a row over 4 experts: the assumed indices once ran to 31 (the tokens' dimension), and one_hot
    # refused them ("Class values must be smaller than num_classes"), as SwitchTransformers did at the large size.
    x = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(0))
    report = act.analyze(_TopOneRouter(reduce), [x])
    real = memtracker_step(_TopOneRouter(reduce), (x,), {})
    s = report.summary
    assert s.peak_bytes_min is not None and s.peak_bytes_max is not None
    assert s.peak_bytes_min <= real.peak_bytes <= s.peak_bytes_max, (s.peak_bytes_min, real.peak_bytes,
                                                                        s.peak_bytes_max)
    assert [kind for _, kind, _ in report.data_dependent] == ["routing"]
