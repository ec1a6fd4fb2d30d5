"""A model compiled with `torch.compile`: refused, or its eager step traced where `eager` asks for it.

memlayout traces the eager step: each op as PyTorch's dispatcher runs it, and what
autograd saves for backward. A compiled module runs another step: AOTAutograd's
partitioner chooses which activations to save (often recomputing cheap ops instead),
and Inductor fuses ops, so that many temporaries are never made. Its memory is
another figure, and tracing it would need its compiled graphs on fake tensors. The
difference, measured on a model run for real on the CPU (tests' Llama-style decoder,
4 blocks each `torch.compile`'d, 2x128 tokens, AdamW; docs/ranks-gpu.md): the compiled
step's peak was 23,610,020 B, the eager step's 26,055,332 B (9.4% more), which is
what memlayout predicts for it, to the byte.

So a compiled model is refused before anything is traced, in one line that says what
`eager=True` predicts instead: the same model's eager step, its compiled modules
unwrapped (`OptimizedModule._orig_mod`, `Module.compile()`'s compiled call undone).
"""

from __future__ import annotations

from typing import Any

from memlayout.errors import UsageError

COMPILED_DIFFERENCE = ("a compiled step saves and fuses otherwise (AOTAutograd's partitioner, Inductor): on a "
                       "Llama-style decoder run on the CPU its peak was 9.4% under the eager step's")


def _is_compiled(module: Any) -> bool:
    # By name, without importing torch._dynamo: torch.compile(module) returns an OptimizedModule holding the module as
    # `_orig_mod`; module.compile() keeps the module and sets its `_compiled_call_impl`.
    return (type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")) or (
        getattr(module, "_compiled_call_impl", None) is not None)


def compiled_modules(model: Any) -> list[str]:
    """The paths of the compiled modules ("" for the root)."""
    return [path for path, module in model.named_modules() if _is_compiled(module)]


def eager_model(model: Any, eager: bool) -> Any:
    """The model to trace: unchanged when nothing in it is compiled; with `eager`, its compiled modules unwrapped.

    Raises:
        UsageError: something is compiled and `eager` is not given.
    """
    found = compiled_modules(model)
    if not found:
        return model
    if not eager:
        where = "the model" if "" in found else ", ".join(found[:2]) + (f" and {len(found) - 2} more" if len(found) > 2
                                                                          else "")
        raise UsageError(f"{where} {'is' if len(found) == 1 else 'are'} compiled with torch.compile, and memlayout "
                         f"traces eager steps: {COMPILED_DIFFERENCE}",
                         "give `eager=True` to predict the same model's eager step (each compiled module's "
                         "uncompiled one)")
    if "" in found and hasattr(model, "_orig_mod"):
        model = model._orig_mod
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__ == "OptimizedModule" and hasattr(child, "_orig_mod"):
                setattr(module, name, child._orig_mod)
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    return model
