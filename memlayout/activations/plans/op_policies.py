"""Op-level activation checkpointing: which ops' outputs a checkpointed module keeps, as torch offers it.

torch's selective activation checkpointing (`torch.utils.checkpoint.create_selective_checkpoint_contexts`)
asks a policy, for each op a checkpointed forward runs, whether to keep its output
(`MUST_SAVE`) or run it again in backward (`PREFER_RECOMPUTE`). A policy here is text:

- a comma list of what to save (request/vocabulary.py's `SAC_SAVES`): `matmuls`,
  `every-other-matmul` (the second, fourth, ... matmul of each forward is recomputed:
  torchtitan's rule, its counts kept apart for forward and for the rerun), `attention`
  (the attention kernels of every device: flash, memory-efficient and cuDNN on CUDA, the
  CPU's flash kernel, the overrideable one of other backends), `collectives` (the
  functional collectives' outputs) and `max`; or a preset, `torchtitan` (its `_save_list`:
  every other mm, attention, reduce-scatters and max);
- or `pkg.module:policy`, any policy torch accepts: a function `(ctx, op, *args, **kwargs)`
  returning a `CheckpointPolicy`, or a list of ops to save.

The same text makes the policy a traced step runs (`context_fn`) and the lines of the
sharding code a report prints (`policy_code`), so that the code is what was measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from memlayout.activations.model.module_patterns import main_blocks, modules_of
from memlayout.activations.plans.plan import Plan
from memlayout.activations.request.vocabulary import SAC_PRESETS

MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
           "aten._scaled_mm.default")
SAVED_OPS: dict[str, tuple[str, ...]] = {
    "matmuls": MATMULS,
    "every-other-matmul": MATMULS,
    "attention": (
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_fused_attention_overrideable.default",
        "aten._scaled_dot_product_attention_math_for_mps.default",
    ),
    "collectives": (
        "_c10d_functional.reduce_scatter_tensor.default",
        "_c10d_functional.all_gather_into_tensor.default",
        "_c10d_functional.all_reduce.default",
        "_c10d_functional.all_to_all_single.default",
    ),
    "max": ("aten.max.default",),
}
"""Each save kind's ops, by their names under `torch.ops`; an op this torch lacks is left out."""
TORCHTITAN_MATMULS = ("aten.mm.default",)
"""torchtitan counts and saves `mm` alone; its Llama has no biases, so every matmul it runs is one."""
TORCHTITAN_SAVED = (*TORCHTITAN_MATMULS, *SAVED_OPS["attention"], "_c10d_functional.reduce_scatter_tensor.default",
                    *SAVED_OPS["max"])
"""torchtitan's `_save_list` (models/llama3/infra/parallelize.py, 0.1.0 and the Table 1 commit): mm, attention,
reduce-scatter and max; its attention entries are CUDA's two kernels, every device's here."""


class OpPolicy(NamedTuple):
    """A policy as text resolved: the ops to save and those of which every other one is recomputed, or an import."""

    saved: tuple[str, ...]
    every_other: tuple[str, ...]
    spec: str | None = None
    """`pkg.module:policy`, for a policy of the user's own; then `saved` and `every_other` are empty."""


def parse_policy(text: str) -> OpPolicy:
    """The policy a `selective_ac` text names (request/rules.py checked its words)."""
    if ":" in text:
        return OpPolicy((), (), text.strip())
    words = {word.strip() for word in text.split(",") if word.strip()}
    saved = {op for word in words - set(SAC_PRESETS) for op in SAVED_OPS[word]}
    every_other = set(MATMULS) if "every-other-matmul" in words else set()
    if "torchtitan" in words:
        saved.update(TORCHTITAN_SAVED)
        every_other.update(TORCHTITAN_MATMULS)
    if "matmuls" in words:
        every_other.clear()
    return OpPolicy(tuple(sorted(saved)), tuple(sorted(every_other)))


def _op(name: str) -> Any:
    """`torch.ops.<name>`, or None where this torch has no such op."""
    import torch

    found: Any = torch.ops
    for part in name.split("."):
        try:
            found = getattr(found, part)
        except (AttributeError, RuntimeError):
            return None
    return found


def ops(names: tuple[str, ...]) -> frozenset[Any]:
    """The OpOverloads of these names that this torch has."""
    return frozenset(op for op in map(_op, names) if op is not None)


def make_policy(policy: OpPolicy) -> Any:
    """A fresh policy function (or the user's own policy): its every-other counts start at 0."""
    if policy.spec is not None:
        from memlayout.load.import_spec import resolve_spec

        return resolve_spec(policy.spec)
    from torch.utils.checkpoint import CheckpointPolicy

    saved, every_other = ops(policy.saved), ops(policy.every_other)
    counted = {False: 0, True: 0}

    def save_ops(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in every_other:
            counted[ctx.is_recompute] += 1
            if counted[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return save_ops


def context_fn(policy: OpPolicy) -> Callable[[], tuple[Any, Any]]:
    """`checkpoint`'s `context_fn` for the policy: each checkpointed call gets contexts (and counts) of its own."""
    from torch.utils import checkpoint

    contexts: Any = checkpoint.create_selective_checkpoint_contexts  # untyped in some torch releases
    return lambda: contexts(make_policy(policy))


class PolicyCode(NamedTuple):
    """The lines of the sharding code that define the policies, and the expression each module's checkpoint uses."""

    imports: list[str]
    definitions: list[str]
    context: dict[str, str]
    """Each policy text -> the `context_fn` expression for it."""


def policy_code(texts: list[str]) -> PolicyCode:
    """Plain torch that makes each policy, as `make_policy` does: the printed code runs what was traced."""
    imports = ["from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts"]
    definitions: list[str] = []
    context: dict[str, str] = {}
    for number, text in enumerate(dict.fromkeys(texts)):
        policy = parse_policy(text)
        name = f"policy_{number}"
        if policy.spec is not None:
            module, _, attribute = policy.spec.partition(":")
            imports.append(f"from {module} import {attribute} as {name}")
            context[text] = f"functools.partial(create_selective_checkpoint_contexts, {name})"
            continue
        saved = sorted(str(op) for op in ops(policy.saved))
        every_other = sorted(str(op) for op in ops(policy.every_other))
        definitions += ["", "", f"def {name}():",
                        f'    """A fresh selective-checkpointing policy ({text}): keep these ops\' outputs, rerun the '
                        'rest in backward."""',
                        *_op_set("saved", saved)]
        if every_other:
            definitions += [*_op_set("every_other", every_other),
                            "    counted = {False: 0, True: 0}  # forward's and the rerun's, apart", "",
                            "    def save_ops(ctx, op, *args, **kwargs):",
                            "        if op in every_other:",
                            "            counted[ctx.is_recompute] += 1",
                            "            if counted[ctx.is_recompute] % 2 == 0:",
                            "                return CheckpointPolicy.PREFER_RECOMPUTE"]
        else:
            definitions += ["", "    def save_ops(ctx, op, *args, **kwargs):"]
        definitions += ["        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE",
                        "", "    return save_ops"]
        context[text] = f"lambda: create_selective_checkpoint_contexts({name}())"
    return PolicyCode(imports, definitions, context)


def _op_set(name: str, names: list[str]) -> list[str]:
    return [f"    {name} = {{", *(f"        torch.ops.{op}," for op in names), "    }"]



def user_plan(model: Any, ac_modules: tuple[str, ...], selective_ac: str | None) -> Plan | None:
    """The checkpointing `ac_modules` and `selective_ac` ask for, as a plan on the model; None for none.

    Raises:
        UsageError: a pattern names no module.
    """
    if not ac_modules and selective_ac is None:
        return None
    paths = modules_of(model, ac_modules, "ac_modules") if ac_modules else main_blocks(model)
    if selective_ac is None:
        return Plan(checkpoint=paths)
    return Plan(selective=tuple((path, selective_ac) for path in paths))


def on_top_of(user: Plan | None, plan: Plan | None) -> Plan | None:
    """A plan applied with the user's own checkpointing: both's modules, a module the plan checkpoints whole
    no longer op-level."""
    if user is None or user.empty:
        return plan
    if plan is None or plan.empty:
        return user
    whole = set(plan.checkpoint)
    return replace(plan, checkpoint=tuple(dict.fromkeys((*user.checkpoint, *plan.checkpoint))),
                   selective=(*(entry for entry in user.selective if entry[0] not in whole), *plan.selective))
