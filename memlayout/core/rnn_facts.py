"""RNN facts: the RNNs a checkpoint's names reveal, and the bias space cuDNN's layout keeps for them.

Where each weight sits is cuDNN's knowledge (`memlayout.core.cudnn_layout`); this
module applies it to a checkpoint's facts. Nothing here imports torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from memlayout.core.cudnn_layout import (
    INFERRED_RNN_LABEL,
    WEIGHT_KINDS,
    WEIGHT_NAME,
    geometry_from_shapes,
    layout_of,
    local_name,
    rnn_layout_problem,
    unused_bias_numel,
)
from memlayout.core.facts import Facts, TensorFact
from memlayout.load.records import ModuleRecord, RnnRecord


def infer_rnn_modules(tensors: Mapping[str, TensorFact]) -> list[ModuleRecord]:
    """RNN modules recognized from state-dict names and shapes, for sources without a module tree.

    The names follow `RNNBase._flat_weights_names`: per layer and direction,
    weight_ih, weight_hh, bias_ih, bias_hh, weight_hr. A `_raw` copy stands for a
    weight that is not a registered Parameter (the weight-dropout pattern); awd-lstm
    registers it on the RNN itself, fastai's WeightDropout on the wrapper above it.
    The mode comes from the gate multiple of the shapes (LSTM 4, GRU 3, RNN 1; an
    RNN's tanh or relu cannot be told from its weights), and names whose shapes
    form no torch RNN are not taken for one.
    """
    weights: dict[str, dict[tuple[int, int, int], str]] = defaultdict(dict)
    raw: dict[str, dict[tuple[int, int, int], str]] = defaultdict(dict)
    for name in tensors:
        # Every RNN weight name has "_l<layer>"; the substring test spares the regex
        # for the hundreds of other names of a model.
        if "_l" not in name:
            continue
        match = WEIGHT_NAME.match(name)
        if not match:
            continue
        key = (int(match["layer"]), 1 if match["reverse"] else 0, WEIGHT_KINDS.index(match["kind"]))
        if match["raw"]:
            raw[match["prefix"]][key] = name
        else:
            weights[match["prefix"]][key] = name
    modules = []
    for prefix, found in weights.items():
        if not any(k[2] == 0 for k in found):
            continue
        shadowed = {
            k: raw_name for holder, keys in raw.items() if prefix.startswith(holder)
            for k, raw_name in keys.items() if k not in found
        }
        names_by_key = dict(found)
        shapes = {local_name(name): tensors[name].shape for name in found.values()}
        for (layer, reverse, kind), raw_name in shadowed.items():
            name = f"{prefix}{WEIGHT_KINDS[kind]}_l{layer}{'_reverse' if reverse else ''}"
            names_by_key[(layer, reverse, kind)] = name
            shapes[local_name(name)] = tensors[raw_name].shape
        geometry = geometry_from_shapes(None, shapes)
        if isinstance(geometry, str):
            continue
        ordered = tuple(names_by_key[k] for k in sorted(names_by_key))
        unregistered = tuple(names_by_key[k] for k in sorted(shadowed))
        label = INFERRED_RNN_LABEL if geometry.mode == "RNN" else geometry.mode
        modules.append(
            ModuleRecord(
                prefix.rstrip("."), f"(inferred from names) {label}", RnnRecord(geometry.mode, ordered, unregistered)
            )
        )
    return modules



def rnn_reserved_bytes(facts: Facts) -> dict[str, tuple[int, int]]:
    """storage id -> the byte range cuDNN keeps for the biases of an RNN without biases."""
    reserved: dict[str, tuple[int, int]] = {}
    for module in facts.modules:
        if module.rnn is None or rnn_layout_problem(facts, module.rnn) is not None:
            continue
        layout = layout_of(facts, module.rnn)
        first = facts.tensor(module.rnn.flat_weight_names[0])
        if isinstance(layout, str) or first is None or not unused_bias_numel(layout):
            continue
        end = layout.numel * first.itemsize
        reserved[first.storage] = (end - unused_bias_numel(layout) * first.itemsize, end)
    return reserved
