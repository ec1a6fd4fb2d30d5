"""ML4xx: RNN weights that cuDNN cannot use in place."""

from __future__ import annotations

from collections.abc import Iterator

from memlayout.core.cudnn_layout import rnn_layout_problem
from memlayout.core.flatten_support import flatten_hint
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, Severity, rule


@rule(
    "ML401",
    "rnn-not-flat",
    Severity.WARNING,
    "an RNN/LSTM/GRU's weights are not one chunk in cuDNN's order from storage offset 0",
    "call `module.flatten_parameters()` after moving to CUDA, or run `memlayout flatten`",
    """
cuDNN runs an RNN from one weight buffer. torch's `_cudnn_rnn` uses the module's
own memory as that buffer only when `try_get_weight_buf` accepts it: the whole
storage of the first weight, from element 0, long enough for cuDNN's weight
space, with every weight exactly where cuDNN puts it. cuDNN's layout is not
`_flat_weights_names` order: every weight matrix comes first (per layer and
direction: w_ih, w_hh, and w_hr with proj_size), then every bias in the same
order, and the bias space is kept (zero) even with bias=False. Otherwise
`_cudnn_rnn` warns "RNN module weights are not part of single contiguous chunk
of memory" and copies every weight on every call. A whole-model flat buffer
that places the RNN mid-buffer fails too (pytorch PR #24828, which would have
allowed an offset, was closed). The message names the first weight out of
place and the element cuDNN expects it at. Checked against files cuDNN wrote
(resemblyzer's 3-layer LSTM, BeatNet's 2-layer LSTM, medaka's bidirectional GRU).
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "An RNN, LSTM or GRU (a module, or one recognized from `weight_ih_l0`-style names) whose "
        "weights are not one chunk of one storage, from element 0, in cuDNN's weight layout."
    ),
    example=RuleExample(
        setup="""
import torch

lstm = torch.nn.LSTM(32, 32, num_layers=2)
torch.save(lstm.state_dict(), "model.pt")
""",
        command="memlayout inspect model.pt --select ML401",
        fixed="""
import memlayout

memlayout.flatten(lstm)  # one buffer in cuDNN's layout
torch.save(lstm.state_dict(), "model.pt")
""",
    ),
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
                hint="call `module.flatten_parameters()` after moving to CUDA, or "
                f"{flatten_hint(ctx.facts.source)}",
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
    detects=(
        "An RNN weight that is a plain tensor attribute instead of a registered Parameter: the "
        "weight-dropout pattern, where a `*_raw` Parameter stands in for it."
    ),
    example=RuleExample(
        setup="""
import torch

state = torch.nn.LSTM(32, 32).state_dict()
state["weight_hh_l0_raw"] = state.pop("weight_hh_l0")  # as awd-lstm's WeightDrop keeps it
torch.save(state, "model.pt")
""",
        command="memlayout inspect model.pt --select ML402",
        fixed="""
state = torch.nn.LSTM(32, 32).state_dict()  # dropout on activations instead: weights stay Parameters
torch.save(state, "model.pt")
""",
    ),
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
