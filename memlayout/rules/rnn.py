"""ML4xx: RNN weights that cuDNN cannot use in place."""

from __future__ import annotations

from collections.abc import Iterator

from memlayout.facts import Facts, TensorFact
from memlayout.load.records import RnnRecord
from memlayout.rules.registry import Finding, Requirement, RuleContext, Severity, rule


def rnn_layout_problem(facts: Facts, rnn: RnnRecord) -> str | None:
    """Why cuDNN would copy these weights, or None when it can use them in place.

    cuDNN's `try_get_weight_buf` takes the whole storage of the first weight from
    offset 0 and requires every weight's data pointer to sit where cuDNN expects it:
    packed, in `_flat_weights_names` order. So a shared whole-model buffer that puts
    the RNN mid-buffer still fails (pytorch PR #24828 to allow an offset was closed).
    """
    weights: list[TensorFact] = []
    for name in rnn.flat_weight_names:
        tensor = facts.tensor(name)
        if tensor is None:
            return f"weight {name} is missing"
        weights.append(tensor)
    first = weights[0]
    if len({w.storage for w in weights}) > 1:
        return f"its {len(weights)} weights live in {len({w.storage for w in weights})} separate storages"
    if len({w.dtype for w in weights}) > 1:
        return "its weights mix dtypes"
    if len({w.name for w in weights}) < len(weights):
        return "two of its weights are the same memory, which flatten_parameters refuses"
    if first.offset != 0:
        return f"its first weight starts at element {first.offset} of the storage, not at 0"
    expected = 0
    for weight in weights:
        if not weight.contiguous:
            return f"weight {weight.name} is not contiguous"
        if weight.offset != expected:
            return f"weight {weight.name} is at element {weight.offset}, cuDNN expects {expected}"
        expected += weight.numel
    return None


@rule(
    "ML401",
    "rnn-not-flat",
    Severity.WARNING,
    "an RNN/LSTM/GRU's weights are not one chunk in cuDNN's order from storage offset 0",
    "call `module.flatten_parameters()` after moving to CUDA, or run `memlayout flatten`",
    """
cuDNN runs an RNN from one weight buffer. When the module's weights are not
packed in `_flat_weights_names` order (per layer and direction: w_ih, w_hh, b_ih,
b_hh, w_hr) at the start of one storage, `_cudnn_rnn` warns "RNN module weights
are not part of single contiguous chunk of memory" and copies every weight on
every call. A whole-model flat buffer that places the RNN mid-buffer fails too.
""",
    needs=(Requirement.LAYOUT,),
)
def rnn_not_flat(ctx: RuleContext) -> Iterator[Finding]:
    for module in ctx.facts.modules:
        if module.rnn is None:
            continue
        problem = rnn_layout_problem(ctx.facts, module.rnn)
        if problem is not None:
            label = module.path or "(root)"
            yield rnn_not_flat.finding(
                module.rnn.flat_weight_names,
                f"{module.rnn.mode} {label}: {problem}; cuDNN will copy its weights on every call",
            )


@rule(
    "ML402",
    "rnn-weights-shadowed",
    Severity.INFO,
    "an RNN weight is a plain tensor attribute, not a registered Parameter",
    "flatten cannot help; apply dropout to a flat copy (e.g. DropConnect on the cuDNN buffer) or accept the copy",
    """
Weight-dropout wrappers (fastai's WeightDropout, awd-lstm's WeightDrop) delete the
RNN's Parameter, keep a `*_raw` Parameter elsewhere and assign a fresh tensor
before every forward. That tensor is new memory each call, so no flattening can
make it one chunk with the others: cuDNN copies (salesforce/awd-lstm-lm #120,
pytorch #86457).
""",
)
def rnn_weights_shadowed(ctx: RuleContext) -> Iterator[Finding]:
    for module in ctx.facts.modules:
        if module.rnn is not None and module.rnn.unregistered:
            label = module.path or "(root)"
            yield rnn_weights_shadowed.finding(
                module.rnn.unregistered,
                f"{module.rnn.mode} {label}: {', '.join(module.rnn.unregistered)} "
                "are not registered Parameters (weight-dropout pattern)",
            )
