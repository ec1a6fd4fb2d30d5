"""The training recipe as settings: the optimizer's implementation, clipping, op-level checkpointing, resharding."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from memlayout.activations import analyze
from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.parallel import ShardingOptions, resolve_sharding
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.step.optimizer import torch_picks_foreach
from memlayout.errors import SettingError, UsageError
from tests.activations.sharded_models import BATCH_SPECS, llama_style

TARGET = "tests.activations.sharded_models:llama_style"


def _meta_model() -> Any:
    with torch.device("meta"):
        return llama_style()


def test_torchtitans_preset_keeps_the_last_block_gathered_and_lightnings_reshards_every_module() -> None:
    model = _meta_model()
    titan = resolve_sharding(model, ShardingOptions(world_size=2, reshard_entries=("torchtitan",))).resharded()
    assert titan == {"layers.0": True, "layers.1": True, "layers.2": True, "layers.3": False, "": True}
    lightning = resolve_sharding(model, ShardingOptions(world_size=2, reshard_after_forward=False,
                                                        reshard_entries=("lightning",))).resharded()
    assert set(lightning.values()) == {True}
    # Entries apply in order, the last that names a module deciding; a class name names every block.
    mixed = resolve_sharding(model, ShardingOptions(world_size=2, reshard_entries=("Block=false", "layers.0=true")))
    assert mixed.resharded() == {"layers.0": True, "layers.1": False, "layers.2": False, "layers.3": False, "": True}


def test_a_resharding_pattern_that_names_no_wrapped_module_is_refused() -> None:
    with pytest.raises(UsageError, match=r"`reshard_after_forward` 'layers\.9' names no module FSDP2 wraps"):
        resolve_sharding(_meta_model(), ShardingOptions(world_size=2, reshard_entries=("layers.9=false",)))


def test_the_printed_code_checkpoints_op_level_before_sharding_and_keeps_the_last_block() -> None:
    report = analyze_ranks(TARGET, list(BATCH_SPECS), world_size=2, fsdp=True, selective_ac="torchtitan",
                           reshard_after_forward=("torchtitan",))
    code = report.sharding.code()
    assert code.index("create_selective_checkpoint_contexts(policy_0())") < code.index("fully_shard(")
    assert "for path in ['layers.3']:\n        fully_shard(model.get_submodule(path), reshard_after_forward=False" in code
    assert any("op-level checkpointing (torchtitan)" in word for word in report.recipe)
    plain = analyze_ranks(TARGET, list(BATCH_SPECS), world_size=2, fsdp=True)
    assert report.largest.activation_bytes < plain.largest.activation_bytes


def test_the_foreach_optimizer_keeps_every_parameters_temporaries_at_once() -> None:
    # Four 4 MiB weights and a tiny batch: the optimizer's step makes the peak.
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(4)])
    loop = analyze(model, ["float32[1,1024]"], optimizer_impl="for-loop").summary
    foreach = analyze(model, ["float32[1,1024]"], optimizer_impl="foreach").summary
    # AdamW's foreach step takes every exp_avg_sq's square root at once (16 MiB); the for-loop one weight's (and its
    # quotient) at a time.
    assert foreach.peak_at.phase == "optimizer"
    assert foreach.peak_bytes - loop.peak_bytes >= 4 * 2**20
    assert analyze(model, ["float32[1,1024]"]).summary.peak_bytes == loop.peak_bytes  # torch's pick on the CPU


def test_torch_picks_foreach_for_plain_cuda_tensors_and_never_for_fsdp2s_dtensors() -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from memlayout import _torch

    plain = list(torch.nn.Linear(4, 4).parameters())
    assert torch_picks_foreach(plain, "cuda") and not torch_picks_foreach(plain, "cpu")
    dist.init_process_group("fake", store=_torch.FakeStore(), rank=0, world_size=2)
    try:
        sharded = fully_shard(torch.nn.Linear(4, 4))
        assert not torch_picks_foreach(list(sharded.parameters()), "cuda")
    finally:
        dist.destroy_process_group()


def test_clipping_runs_between_backward_and_the_optimizer() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(2)])
    clipped = analyze(model, ["float32[2,256]"], clip_grad_norm=1.0, clip_grad_impl="foreach")
    assert clipped.summary.peak_bytes >= analyze(model, ["float32[2,256]"]).summary.peak_bytes


@pytest.mark.parametrize(("settings", "says"), [
    ({"step": "inference", "optimizer_impl": "foreach"}, "`optimizer_impl` is part of a training step"),
    ({"optimizer": "none", "optimizer_impl": "fused"}, "`optimizer_impl` chooses how the optimizer steps"),
    ({"clip_grad_impl": "foreach"}, "`clip_grad_impl` says how clip_grad_norm_ runs"),
    ({"clip_grad_norm": 0.0}, "`clip_grad_norm` 0 is not a norm to clip to"),
    ({"selective_ac": "matmuls,softmax"}, "`selective_ac` 'matmuls,softmax' names nothing to save ('softmax')"),
    ({"world_size": 2, "fsdp": True, "reshard_after_forward": ("layers.3=maybe",)},
     "`reshard_after_forward` 'layers.3=maybe' is neither a preset nor"),
    ({"world_size": 2, "fsdp": True, "no_reshard_after_forward": True, "reshard_after_forward": ("torchtitan",)},
     "`no_reshard_after_forward` and `reshard_after_forward` both say"),
    ({"world_size": 2, "ddp": True, "gpu": "h100"}, "`gpu` traces FSDP2's ranks for a GPU, and `ddp`'s ranks"),
    ({"world_size": 2, "fsdp": True, "budget": "90%"}, "is a share of a GPU's memory, and no `gpu` is named"),
])
def test_recipe_settings_that_do_not_go_together_are_refused_by_their_names(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(SettingError) as raised:
        StepRequest(TARGET, input=BATCH_SPECS, **settings)
    assert says in raised.value.one_line()


def test_a_recipe_setting_without_a_step_is_refused() -> None:
    with pytest.raises(SettingError, match="`selective_ac` shapes a traced training step"):
        StepRequest(TARGET, selective_ac="matmuls")


def test_a_budget_share_of_the_named_gpu_is_taken_across_ranks() -> None:
    request = StepRequest(TARGET, input=BATCH_SPECS, world_size=2, fsdp=True, gpu="h100", budget="90%")
    assert request.budget is not None and request.budget.fraction == 0.9


def test_an_unreachable_budget_on_a_gpu_names_the_reserved_figure_it_compared() -> None:
    from types import SimpleNamespace

    from memlayout.errors import RanksBudgetUnreachableError

    sharding = SimpleNamespace(ddp=None, offload=False)
    on_cpu = SimpleNamespace(sharding=sharding, offload=False, peak_bytes=2**30, judged_bytes=2**30)
    on_gpu = SimpleNamespace(sharding=sharding, offload=False, peak_bytes=2**30, judged_bytes=3 * 2**29)
    assert "the lowest peak reached is 1.0 GiB (1073741824 bytes)" in str(RanksBudgetUnreachableError(2**29, on_cpu, "1 plan"))
    said = str(RanksBudgetUnreachableError(2**29, on_gpu, "1 plan"))
    assert f"the lowest reserved peak with the CUDA runtime reached is 1.5 GiB ({3 * 2**29} bytes)" in said
