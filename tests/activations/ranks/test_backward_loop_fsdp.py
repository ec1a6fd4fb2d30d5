"""memlayout's backward loop runs FSDP2's backward as torch's engine does: checked on the CPU, where both can run.

On fake CUDA without a GPU torch's engine cannot run backward (step/gpu_free_backward.py),
and FSDP2's ranks need what the loop takes from the engine: the hooks forward puts on
activations (FSDP2's pre-backward all-gathers), the engine's final callbacks (its root
post-backward) and `_will_engine_execute_node` (ModTracker's multi-grad hooks). On CPU
fake ranks the same step runs under either, and every figure must be the same: each of
FSDPMemTracker's kinds at the peak, and the caching allocator's model fed by the rank's
allocations.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from memlayout.activations.device.expandable_segments import AllocatorConfig
from memlayout.activations.ranks import _target_builder
from memlayout.activations.ranks.layouts import rank_layouts, rank_ranges, traced_layouts
from memlayout.activations.ranks.parallel import resolve_sharding, sharding_options
from memlayout.activations.ranks.rank_step import RankSettings, RankTrace, StepInputs, trace_rank
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.step import gpu_free_backward
from memlayout.activations.step.recipe import recipe_of
from tests.activations.sharded_models import BATCH_SPECS


def _traced(loop: bool, **settings: Any) -> RankTrace:
    request = StepRequest("tests.activations.sharded_models:llama_style", input=BATCH_SPECS, world_size=2, fsdp=True,
                          **settings)
    build, _, _ = _target_builder(request, {})
    model = build()
    sharding = resolve_sharding(model, sharding_options(request))
    layout = traced_layouts(rank_layouts(model, sharding))[0]
    with gpu_free_backward.backward_in_python() if loop else contextlib.nullcontext():
        return trace_rank(build, sharding, 0, rank_ranges(layout.ranks), StepInputs(request.step_inputs, None),
                          RankSettings("adamw", "cpu", allocator=AllocatorConfig(), recipe=recipe_of(request)))


@pytest.mark.parametrize("settings", [
    {},
    {"selective_ac": "torchtitan", "reshard_after_forward": ("torchtitan",), "optimizer_impl": "foreach",
     "clip_grad_norm": 1.0},
], ids=["fsdp2", "torchtitan-recipe"])
def test_the_loop_runs_fsdp2s_backward_as_torchs_engine_does(settings: dict[str, Any]) -> None:
    engine, loop = _traced(False, **settings), _traced(True, **settings)
    assert loop.peak.peak_bytes == engine.peak.peak_bytes
    assert dict(loop.peak.tracker) == dict(engine.peak.tracker)
    ours, torchs = loop.peak.reserved, engine.peak.reserved
    assert ours is not None and torchs is not None
    assert (ours.allocated_bytes, ours.reserved_bytes) == (torchs.allocated_bytes, torchs.reserved_bytes)
    assert ours.reserved_by_stream == torchs.reserved_by_stream
    # FSDP2 reduce-scattered under the loop: its pre-backward hooks and its final callback ran.
    assert dict(ours.reserved_by_stream).get("reduce-scatter")


def test_a_hook_on_an_activation_runs_on_its_gradient_and_may_replace_it() -> None:
    import torch

    seen = []
    with gpu_free_backward.backward_in_python():
        weight = torch.ones(3, requires_grad=True)
        hidden = weight * 2
        hidden.register_hook(lambda grad: seen.append(grad.clone()) or grad * 10)
        loss = hidden.sum()
        gpu_free_backward.run_backward([loss])
    assert [g.tolist() for g in seen] == [[1.0, 1.0, 1.0]]
    assert weight.grad is not None and weight.grad.tolist() == [20.0, 20.0, 20.0]


def test_a_callback_queued_during_backward_runs_after_the_graph() -> None:
    import torch
    from torch.autograd import Variable

    order = []
    with gpu_free_backward.backward_in_python():
        weight = torch.ones(2, requires_grad=True)
        hidden = weight * 3

        def hook(grad: Any) -> None:
            order.append("hook")
            Variable._execution_engine.queue_callback(lambda: order.append("callback"))

        hidden.register_hook(hook)
        gpu_free_backward.run_backward([hidden.sum()])
        order.append("after")
    assert order == ["hook", "callback", "after"]
    assert weight.grad is not None
