"""The checkpoint pitfalls that apply to a plan's modules, from what the baseline trace saw each module do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlayout.activations.plans.plan import Plan
from memlayout.activations.summary import ModuleFacts


def checkpointed_paths(plan: Plan) -> list[str]:
    """The paths of the modules a plan checkpoints (whole, in sequential runs or in segments), each once, in order."""
    return list(dict.fromkeys([*plan.checkpoint, *(s.module for s in plan.sequential),
                               *(s.module for s in plan.segments)]))


def pitfalls(plan: Plan, modules: tuple[ModuleFacts, ...], model: Any) -> tuple[str, ...]:
    """The checkpoint pitfalls that apply to this plan's modules, one sentence each."""
    if plan.empty:
        return ()
    paths = checkpointed_paths(plan)

    def inside(path: str) -> list[ModuleFacts]:
        return [m for m in modules if path == "" or m.path == path or m.path.startswith(path + ".")]

    found: list[str] = [
        "wrap with use_reentrant=False (apply_plan does): the reentrant variant does not work with "
        "torch.autograd.grad, only with .backward()",
    ]

    def flagged(check: Callable[[ModuleFacts], bool]) -> list[str]:
        return [p or "the model" for p in paths if any(check(m) for m in inside(p))]

    if hit := flagged(lambda m: m.reads_outside_state):
        found.append(
            f"{', '.join(hit)}: reads tensors that are not its inputs, parameters or buffers (global or cached "
            "state); if that state changes before backward, the rerun computes something else and the gradients "
            "are silently wrong"
        )
    if hit := flagged(lambda m: m.moves_device):
        found.append(
            f"{', '.join(hit)}: moves tensors to another device; checkpoint restores the RNG state only of its "
            "inputs' devices, so random ops on the other device draw differently on the rerun"
        )
    if hit := flagged(lambda m: m.mutates_buffers):
        found.append(
            f"{', '.join(hit)}: updates buffers in forward (e.g. BatchNorm running statistics); the rerun updates "
            "them a second time"
        )
    if hit := flagged(lambda m: m.uses_randomness):
        found.append(
            f"{', '.join(hit)}: uses randomness (dropout); checkpoint stashes and restores the RNG state so the "
            "rerun draws the same mask, which costs time; keep preserve_rng_state=True there"
        )
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        found.append(
            "Hugging Face models need use_cache=False under checkpoint (apply_plan sets model.config.use_cache "
            "= False): a layer that appends to a key/value cache appends again when it reruns"
        )
    return tuple(found)
