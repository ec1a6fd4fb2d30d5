"""LoRA and DoRA adapters on the model, by peft itself (`--lora R`, `--dora`), and what trains.

peft's `get_peft_model` runs on the model as built, in the world the step is traced
in (fake, meta or real tensors): it freezes every parameter of the base, wraps each
target layer (an `nn.Linear`, GPT-2's `Conv1D`, a bitsandbytes 4-bit or 8-bit
layer) and adds the adapters, which alone train. The optimizer is then built over
the parameters that require grad (step/optimizer.py), so it keeps state for the
adapters only, and backward makes gradients for them only.

Every setting left out is `peft.LoraConfig()`'s own default, read from peft, not
copied here: the alpha, the dropout (a dropout other than 0 keeps a mask and a
dropped copy of each target's input for backward, several percent of a step), and
the target modules, which peft resolves per model type
(`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`: Llama's q_proj and v_proj,
GPT-2's c_attn, BERT's query and value). A model type peft has no default for
needs `--lora-targets`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from memlayout import _torch
from memlayout.activations.model.parameter_class import attribute_tensors
from memlayout.errors import UsageError

INSTALL = "pip install 'memlayout[lora]'"
"""The extra that brings peft and bitsandbytes (pyproject.toml)."""

ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear layer but the output layer (`INCLUDE_LINEAR_LAYERS_SHORTHAND`)."""


@dataclass(frozen=True)
class LoraOptions:
    """What `--lora`, `--lora-targets`, `--lora-dropout` and `--dora` ask for; None: peft's default."""

    rank: int | None = None
    """The adapters' inner size; None: peft's default (`--dora` alone)."""
    targets: tuple[str, ...] | None = None
    """Module names (or `all-linear`); None: peft's default for the model type."""
    dropout: float | None = None
    dora: bool = False


@dataclass(frozen=True)
class AppliedLora:
    """The adapters as peft made them."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]
    """The target module names peft resolved (its default for the model type, or those given)."""
    dora: bool
    adapted_modules: int
    """How many layers got an adapter."""


@dataclass(frozen=True)
class ParameterSplit:
    """The model's parameters by whether they train, each storage once (tied weights once)."""

    trainable_count: int
    """Elements of the parameters that require grad."""
    trainable_bytes: int
    frozen_count: int
    """Elements of the parameters that do not; a 4-bit weight counts its packed elements (two weights a byte)."""
    frozen_bytes: int
    quantization_state_bytes: int = 0
    """Bytes a quantized weight keeps beside its packed data (bitsandbytes' absmax and code), frozen too."""


def require_peft(flag: str) -> Any:
    """peft, imported.

    Raises:
        UsageError: peft is not installed (one line with the install command).
    """
    try:
        import peft
    except ImportError:
        raise UsageError(f"{flag} applies peft's LoRA, and peft is not installed", INSTALL) from None
    return peft


def apply_lora(model: Any, options: LoraOptions,
               context: Callable[[], AbstractContextManager[Any]]) -> tuple[Any, AppliedLora]:
    """The model wrapped by `peft.get_peft_model` with a LoraConfig of `options`, built in `context`.

    Raises:
        UsageError: peft is missing, has no default targets for the model, or a target is not in the model.
    """
    peft = require_peft("--lora" if options.rank is not None else "--dora")
    given: dict[str, Any] = {}
    if options.rank is not None:
        if options.rank < 1:
            raise UsageError(f"`lora` {options.rank}: the rank is the adapters' inner size, at least 1",
                             "e.g. `lora` 16")
        given["r"] = options.rank
    if options.targets is not None:
        given["target_modules"] = ALL_LINEAR if options.targets == (ALL_LINEAR,) else list(options.targets)
    if options.dropout is not None:
        if not 0 <= options.dropout < 1:
            raise UsageError(f"`lora_dropout` {options.dropout} is not a probability below 1",
                             "e.g. `lora_dropout` 0.05")
        given["lora_dropout"] = options.dropout
    if options.dora:
        given["use_dora"] = True
    config = peft.LoraConfig(**given)
    try:
        # peft asks transformers deprecated questions (is_gradient_checkpointing) and says what it adjusts (GPT-2's
        # Conv1D is fan-in-fan-out): the report says what was made, and stderr is for memlayout's one line.
        with context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:
        raise _refusal(model, exc, options) from None
    resolved = wrapped.peft_config["default"]
    targets = resolved.target_modules
    adapted = sum(1 for module in wrapped.modules() if isinstance(module, peft.tuners.lora.LoraLayer))
    return wrapped, AppliedLora(
        rank=resolved.r, alpha=resolved.lora_alpha, dropout=resolved.lora_dropout,
        targets=(targets,) if isinstance(targets, str) else tuple(sorted(targets)), dora=resolved.use_dora,
        adapted_modules=adapted,
    )


def _refusal(model: Any, exc: ValueError, options: LoraOptions) -> UsageError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    names = linear_layer_names(model)
    example = ",".join(names[:4]) if names else "q_proj,v_proj"
    if options.targets is None:
        what = f"model type {model_type!r}" if model_type else f"a {type(model).__name__} (not a transformers model)"
        return UsageError(f"peft has no default LoRA target modules for {what}",
                          f"give `lora_targets` NAME,..., e.g. `lora_targets` {example}, or `lora_targets` "
                          f"{ALL_LINEAR}")
    return UsageError(f"peft could not apply LoRA to `lora_targets` {','.join(options.targets)}: {text}",
                      f"name layers the model has, e.g. `lora_targets` {example}, or `lora_targets` {ALL_LINEAR}")


def linear_layer_names(model: Any) -> list[str]:
    """The last names of the model's linear layers, each once, in order: what `--lora-targets` takes."""
    import torch

    names: dict[str, None] = {}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
            names[path.rsplit(".", 1)[-1]] = None
    return list(names)


def parameter_split(model: Any) -> ParameterSplit:
    """Trainable against frozen parameters, each storage once."""
    seen: set[int] = set()
    counts = {True: [0, 0], False: [0, 0]}
    state_bytes = 0
    for parameter in model.parameters():
        key = _torch.storage_id(parameter.untyped_storage())
        if key not in seen:
            seen.add(key)
            counts[parameter.requires_grad][0] += parameter.numel()
            counts[parameter.requires_grad][1] += parameter.untyped_storage().nbytes()
        for tensor in attribute_tensors(parameter):
            key = _torch.storage_id(tensor.untyped_storage())
            if key not in seen:
                seen.add(key)
                state_bytes += tensor.untyped_storage().nbytes()
    return ParameterSplit(trainable_count=counts[True][0], trainable_bytes=counts[True][1],
                          frozen_count=counts[False][0], frozen_bytes=counts[False][1] + state_bytes,
                          quantization_state_bytes=state_bytes)
