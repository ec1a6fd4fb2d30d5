"""Op-level checkpointing's policies: the one a traced step runs and the one the sharding code prints decide alike."""

from __future__ import annotations

from memlayout.activations.plans.op_policies import make_policy, parse_policy, policy_code


def test_the_printed_policy_decides_as_the_traced_one() -> None:
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    code = policy_code(["torchtitan"])
    namespace: dict[str, object] = {"torch": torch}
    exec("\n".join(code.imports + code.definitions), namespace)
    printed, traced = namespace["policy_0"](), make_policy(parse_policy("torchtitan"))  # type: ignore[operator]

    class Ctx:
        is_recompute = False

    ops = [torch.ops.aten.mm.default, torch.ops.aten.add.Tensor, torch.ops.aten.mm.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, torch.ops.aten.mm.default]
    decisions = [(printed(Ctx(), op), traced(Ctx(), op)) for op in ops]
    assert [a for a, _ in decisions] == [b for _, b in decisions]
    assert [a for a, _ in decisions] == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE,
                                         CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_SAVE,
                                         CheckpointPolicy.MUST_SAVE]
