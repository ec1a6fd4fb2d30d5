"""The lines of a sharding code that checkpoint modules: whole (a plan's, or `ac_modules`), op-level, or in segments.

`Sharding.code()` (parallel.py) prints them before `fully_shard`, as torchtitan applies
activation checkpointing before FSDP2: each module's forward is wrapped by
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, an op-level one with
`context_fn` making `create_selective_checkpoint_contexts` from its policy
(plans/op_policies.py), and an nn.Sequential's children run through
`checkpoint_sequential`.
"""

from __future__ import annotations

from typing import Any

from memlayout.activations.plans.op_policies import policy_code
from memlayout.activations.ranks.module_lists import python_list


def checkpointing(sharding: Any) -> tuple[list[str], list[str]]:
    """The module-level lines (imports, policies), and the lines inside the function, that checkpoint the modules
    the sharding names."""
    imports = [f"from torch.utils.checkpoint import {name}" for name, used in
               (("checkpoint", sharding.checkpoint or sharding.selective),
                ("checkpoint_sequential", sharding.sequential)) if used]
    lines = []
    if sharding.checkpoint or sharding.sequential or sharding.selective:
        lines.append("    # Activation checkpointing: these forwards rerun in backward instead of keeping activations.")
    if sharding.checkpoint:
        lines.append(f"    for path in {python_list(sharding.checkpoint, '    ')}:")
        lines.append("        module = model.get_submodule(path)")
        lines.append("        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)")
    if sharding.selective:
        code = policy_code([policy for _, policy in sharding.selective])
        imports += [*code.imports, *code.definitions]
        for text, context in code.context.items():
            paths = [path for path, policy in sharding.selective if policy == text]
            lines.append(f"    # Op-level ({text}): the outputs the policy saves are kept, the other ops rerun.")
            lines.append(f"    for path in {python_list(paths, '    ')}:")
            lines.append("        module = model.get_submodule(path)")
            lines.append("        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False,")
            lines.append(f"                                           context_fn={context})")
    for path, segments in sharding.sequential:
        lines.append(f"    module = model.get_submodule({path!r})")
        lines.append(f"    module.forward = functools.partial(checkpoint_sequential, module, {segments}, use_reentrant=False)")
    if (sharding.checkpoint or sharding.sequential or sharding.selective) and sharding.hf_cache:
        lines.append("    model.config.use_cache = False  # a key/value cache would be filled again by each rerun")
    return imports, lines
