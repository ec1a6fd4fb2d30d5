"""ML4xx: RNN weights that cuDNN cannot use in place."""

from __future__ import annotations

from collections.abc import Iterator

from memlayout.core.cudnn_layout import rnn_layout_problem
from memlayout.core.flatten_support import flatten_hint
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, rule
from memlayout.severity import Severity

KEPT_BY_TORCH_LOAD = ("torch-zip", "torch-legacy", "torch-legacy-tar", "hf-pytorch")
"""Formats whose storages `torch.load` rebuilds as the file lays them out."""


_COPIES_EVERY_CALL = ("copies-every-call",)
"""What ML401's warnings are about, beyond their weights: a baseline that accepted the info finding of a
state dict's layout (no copy per call) does not hide the same weights copied on every call."""


@rule(
    "ML401",
    "rnn-not-flat",
    Severity.WARNING,
    "an RNN/LSTM/GRU's weights are not one chunk in cuDNN's order, and the way they reach CUDA keeps them so",
    "call `module.flatten_parameters()` after loading onto CUDA, or run `memlayout flatten`",
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
(resemblyzer's 3-layer LSTM, BeatNet's 2-layer LSTM, medaka's bidirectional GRU)
and against the table cuDNN 9.19 laid out on an H200 (tests/cudnn/tables).

Whether the copy happens depends on how the weights reach CUDA, so the finding's
severity does too. torch lays an RNN's weights out for cuDNN itself whenever the
module moves: `.cuda()` and `.to()` run `RNNBase._apply`, which calls
`flatten_parameters()`, and `load_state_dict` then copies into that buffer. Its
forward also lays them out again when a weight attribute is a new object
(`_weights_have_changed`), which is what `load_state_dict(assign=True)` leaves.
Measured on an H200 (torch 2.11, cuDNN 9.19) for a 2-layer bidirectional LSTM
whose file kept every weight in its own storage, cuDNN warned only for:
- a pickled module loaded with `torch.load(..., map_location="cuda")`: unpickling
  runs no `_apply`, so the weights stay as saved;
- a live module on CUDA whose weight's `.data` was swapped for other memory: the
  Parameter object is the same, so the forward does not lay it out again.
It did not warn for build, `.cuda()`, `load_state_dict`; `load_state_dict`, then
`.cuda()`; a meta-device build with `load_state_dict(assign=True)`; `to_empty`;
a pickled module loaded on the CPU, then `.cuda()`; or a weight replaced by a new
Parameter. So a state dict's layout gets a note (severity info), as does a live
module on the CPU, or on CUDA with a replaced weight; a pickled module, and a live
CUDA module whose weights are not one chunk, get the warning.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "An RNN, LSTM or GRU (a module, or one recognized from `weight_ih_l0`-style names) whose "
        "weights are not one chunk of one storage, from element 0, in cuDNN's weight layout: a "
        "warning where cuDNN then copies them on every call (a pickled module loaded onto CUDA, a "
        "live CUDA module), a note where torch lays them out on the way (a state dict, a CPU module)."
    ),
    example=RuleExample(
        setup="""
import torch

lstm = torch.nn.LSTM(32, 32, num_layers=2)
torch.save(lstm, "model.pt")  # the whole module: torch.load(map_location="cuda") keeps this layout
""",
        command="memlayout inspect model.pt --select ML401",
        fixed="""
import memlayout

memlayout.flatten(lstm)  # one buffer in cuDNN's layout
torch.save(lstm, "model.pt")
""",
    ),
)
def rnn_not_flat(ctx: RuleContext) -> Iterator[Finding]:
    for module in ctx.facts.modules:
        rnn = module.rnn
        if rnn is None:
            continue
        problem = rnn_layout_problem(ctx.facts, rnn)
        if problem is None:
            continue
        label = f"{rnn.mode} {module.path or '(root)'}: {problem}"
        first = ctx.facts.tensor(rnn.flat_weight_names[0])
        on_cuda = first is not None and first.device.startswith("cuda")
        # Only torch.load keeps a file's storages: safetensors, DCP and the others load each
        # tensor on its own, so storing cuDNN's layout in them changes nothing.
        store_flat = (
            f"to store them in cuDNN's layout anyway, {flatten_hint(ctx.facts.source)}"
            if ctx.facts.source.path is None or ctx.facts.source.format in KEPT_BY_TORCH_LOAD
            else ("safetensors' loaders give" if "safetensors" in ctx.facts.source.format else "its loader gives")
            + " each tensor its own memory, whatever the file's layout"
        )
        if rnn.known_from == "names":
            yield rnn_not_flat.finding(
                rnn.flat_weight_names,
                f"{label}; no copy per call when loaded into a built module: moving the module to "
                "CUDA lays the weights out for cuDNN and load_state_dict copies into that buffer "
                "(after load_state_dict(assign=True), the first forward lays them out)",
                severity=Severity.INFO,
                hint=f"nothing is needed to load it; {store_flat}",
            )
        elif rnn.known_from == "pickled":
            yield rnn_not_flat.finding(
                rnn.flat_weight_names,
                f"{label}; torch.load(map_location=\"cuda\") of this pickled module keeps that layout, "
                "and cuDNN copies its weights on every call",
                subject=_COPIES_EVERY_CALL,
                hint="call `module.flatten_parameters()` after loading onto CUDA (or load on the CPU, "
                f"then `.cuda()`), or {flatten_hint(ctx.facts.source)}",
            )
        elif not on_cuda:
            yield rnn_not_flat.finding(
                rnn.flat_weight_names,
                f"{label}; no copy per call: `.cuda()` and `.to()` lay the weights out for cuDNN",
                severity=Severity.INFO,
                hint=f"nothing is needed before moving it to CUDA; {store_flat}",
            )
        elif rnn.weights_replaced:
            yield rnn_not_flat.finding(
                rnn.flat_weight_names,
                f"{label}; a weight is a new object since the last layout, so the next forward lays "
                "them out again (one copy, not one per call)",
                severity=Severity.INFO,
                hint=f"nothing is needed; {store_flat}",
            )
        else:
            yield rnn_not_flat.finding(
                rnn.flat_weight_names,
                f"{label}; cuDNN will copy its weights on every call",
                subject=_COPIES_EVERY_CALL,
                hint=f"call `module.flatten_parameters()`, or {flatten_hint(ctx.facts.source)}",
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
